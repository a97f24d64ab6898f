"""`e31 peers`: the peers a running node knows, from its local API (GET /v1/peers)."""

from __future__ import annotations

import argparse
import json

from ..config import add_data_dir_argument
from .main import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the JSON list the node returns")


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
    print(json.dumps(peers, indent=2) if args.json else format_peers(peers))
    return 0
