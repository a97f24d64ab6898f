"""`e31 node run` (run a node in the foreground) and `e31 node status` (ask a running one)."""

from __future__ import annotations

import argparse
import json

from ..config import add_data_dir_argument
from . import options
from .main import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .. import config

    sub = parser.add_subparsers(dest="node_command", metavar="SUBCOMMAND", required=True)
    run_parser = sub.add_parser(
        "run",
        help="run a node in the foreground until SIGINT or SIGTERM",
        description="Run a node in the foreground until SIGINT or SIGTERM. "
        "Flags override the data dir's config.toml.",
    )
    config.add_arguments(run_parser)
    # Timing knobs for tests and local experiments; not part of the configuration file.
    run_parser.add_argument(
        "--heartbeat", type=options.positive_duration, metavar=options.DURATION, help=argparse.SUPPRESS
    )
    run_parser.add_argument(
        "--target-degree", type=options.positive_count, metavar=options.COUNT, help=argparse.SUPPRESS
    )
    run_parser.set_defaults(_node_run=_run)
    status_parser = sub.add_parser(
        "status",
        help="show a running node's status",
        description="Show the status of the node running with this data dir.",
    )
    add_data_dir_argument(status_parser)
    status_parser.add_argument("--json", action="store_true", help="print the JSON object the node returns")
    status_parser.set_defaults(_node_run=_status)
    from . import recover

    recover_parser = sub.add_parser(
        "recover",
        help="explain why the node refuses its database, and accept a loss",
        description="Explain why the node refuses its database (older than its watermark) and, with "
        "--accept-loss, keep the evidence and let the node start (docs/operating.md).",
    )
    recover.add_arguments(recover_parser)
    recover_parser.set_defaults(_node_run=recover.run)


def run(args: argparse.Namespace) -> int:
    code: int = args._node_run(args)
    return code


def _run(args: argparse.Namespace) -> int:
    from ..config import ConfigError, config_from_args

    try:
        config = config_from_args(args)
    except ConfigError as e:
        raise CliError(str(e)) from None
    from .. import daemon
    from ..net.peers import PeerSettings

    settings = PeerSettings() if args.heartbeat is None else PeerSettings.fast(args.heartbeat)
    if args.target_degree is not None:
        import dataclasses

        settings = dataclasses.replace(settings, target_degree=args.target_degree)
    try:
        return daemon.run(config, settings)
    except daemon.DaemonError as e:
        raise CliError(str(e)) from None


def _status(args: argparse.Namespace) -> int:
    from ..api.client import ApiClient, ApiClientError
    from .tables import format_status

    try:
        with ApiClient(args.data_dir, timeout=10.0) as api:
            doc = api.get("/v1/status")
    except ApiClientError as e:
        raise CliError(str(e)) from None
    if not isinstance(doc, dict):
        raise CliError("the node's answer to GET /v1/status is not a JSON object")
    print(json.dumps(doc, indent=2) if args.json else format_status(doc))
    return 0
