"""`e31 peers`: the peers a running node knows, from its local API (GET /v1/peers).

The node lists connected peers first; the table shows the first `--limit` of them (50 unless told)
and a count of the rest, so the output stays short however many peers the node knows.
"""

from __future__ import annotations

import argparse
import json

from ..config import add_data_dir_argument
from . import options
from .main import CliError

DEFAULT_LIMIT = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the JSON list the node returns")
    parser.add_argument(
        "--limit",
        type=options.positive_count,
        metavar=options.COUNT,
        default=DEFAULT_LIMIT,
        help=f"show at most this many peers, connected first (default {DEFAULT_LIMIT})",
    )
    parser.add_argument("--all", action="store_true", help="show every known peer")


def run(args: argparse.Namespace) -> int:
    from ..api.client import ApiClient, ApiClientError
    from .tables import format_peers

    try:
        with ApiClient(args.data_dir, timeout=10.0) as api:
            peers = api.get("/v1/peers")
    except ApiClientError as e:
        raise CliError(str(e)) from e
    if not isinstance(peers, list):
        raise CliError("the node's answer to GET /v1/peers is not a list")
    if args.json:
        print(json.dumps(peers, indent=2))
        return 0
    shown = peers if args.all else peers[: args.limit]
    print(format_peers(shown))
    rest = len(peers) - len(shown)
    if rest:
        print(f"... and {rest} more known peer{'s' if rest != 1 else ''} (--limit N or --all to show them)")
    return 0
