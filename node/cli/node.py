"""`e31 node run` (run a node in the foreground), `e31 node status` (ask a running one) and
`e31 node stop` (stop a running one cleanly and wait until it is gone)."""

from __future__ import annotations

import argparse
import json

from ..config import add_data_dir_argument
from . import options
from .main import CliError

STOP_TIMEOUT = 60.0


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
    stop_parser = sub.add_parser(
        "stop",
        help="stop the running node cleanly, and wait until it is gone",
        description="Stop the node running with this data dir: a SIGTERM to the process that answers "
        "its local API (the same clean stop as Ctrl-C), then wait until that process has exited.",
    )
    add_data_dir_argument(stop_parser)
    stop_parser.add_argument(
        "--timeout",
        type=options.positive_duration,
        default=STOP_TIMEOUT,
        metavar=options.DURATION,
        help=f"give up waiting after this long (exit 1; default {STOP_TIMEOUT:g}s)",
    )
    stop_parser.set_defaults(_node_run=_stop)
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
    from ..config import ConfigError, check_offer, config_from_args

    try:
        config = config_from_args(args)
    except ConfigError as e:
        raise CliError(str(e)) from None
    check_offer(config)  # a ConfigError: a usage error, exit 2
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


def _stop(args: argparse.Namespace) -> int:
    """SIGTERM to the pid the running node reports through its API (so a stale api.json or a reused
    pid is never signalled), then wait for that process to be gone."""
    import os
    import signal
    import time

    from ..api.client import ApiClient, ApiClientError

    try:
        with ApiClient(args.data_dir, timeout=10.0) as api:
            doc = api.get("/v1/status")
    except ApiClientError as e:
        raise CliError(str(e)) from None
    pid = doc.get("pid") if isinstance(doc, dict) else None
    if not isinstance(pid, int) or pid <= 1:
        raise CliError("the node's status names no process id to stop")
    if pid == os.getpid():
        raise CliError("the node answering runs in this process")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # it stopped meanwhile
    except PermissionError:
        raise CliError(f"not allowed to stop process {pid} (the node runs as another user)") from None
    end = time.monotonic() + args.timeout
    while not _gone(pid):
        if time.monotonic() > end:
            raise CliError(f"node {doc.get('node_id')} (pid {pid}) has not stopped after {args.timeout:g}s")
        time.sleep(0.05)
    print(f"stopped node {doc.get('node_id')} (pid {pid})")
    return 0


def _gone(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie waiting for its parent has)."""
    import os
    from pathlib import Path

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]
