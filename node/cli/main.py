"""The `e31` command line.

Start-up must stay fast (`e31 --help` and `e31 inspect` in well under 0.3 s), so this module imports
only argparse and friends; each subcommand lives in its own module, imported only when chosen.
A command module exposes `add_arguments(parser)` and `run(args) -> int` (the exit code).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import version
from ..errors import NodeError

# name -> (module, one-line help). Order is the order `e31 --help` shows.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("e31.node.demo.command", "run a local network that renders an image as audited jobs"),
    "inspect": ("e31.node.cli.inspect", "verify and decode one signed envelope, print it as JSON"),
    "sandbox": ("e31.node.cli.sandbox", "run a WebAssembly module locally in the e31 sandbox"),
    "node": ("e31.node.cli.node", "run a node, show the status of a running one, or stop it"),
    "recover": (
        "e31.node.cli.recover",
        "explain why the node refuses its database, and accept a loss (also `e31 node recover`)",
    ),
    "peers": ("e31.node.cli.peers", "list the peers a running node knows"),
    "dashboard": ("e31.node.cli.dashboard", "print the address of the running node's dashboard, signed in"),
    "metrics": ("e31.node.cli.metrics", "print the running node's metrics in the Prometheus text format"),
    "submit": ("e31.node.cli.submit", "submit a job to the network through the local node"),
    "jobs": ("e31.node.cli.jobs", "list the jobs this node submitted, with their state"),
    "wait": ("e31.node.cli.wait", "wait for jobs to end; exit 0 only if all succeeded"),
    "cancel": ("e31.node.cli.cancel", "withdraw submitted jobs (or batches) with a signed cancel"),
    "results": ("e31.node.cli.results", "write finished jobs' outputs and receipts into a directory"),
    "logs": ("e31.node.cli.logs", "print a finished job's standard output and error (--follow: wait first)"),
    "generate": (
        "e31.node.cli.generate",
        "language-model inference: a prompts file in as one batch, completions out later",
    ),
    "receipts": (
        "e31.node.cli.receipts",
        "export signed receipts and proofs into a bundle for auditing",
    ),
    "audit": ("e31.node.cli.audit", "check a receipts bundle offline, optionally re-running every job"),
}


class CliError(NodeError):
    """A command's expected failure: printed as one line on stderr, exit with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = self.exit_code = code


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kw: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *a: object, **kw: object) -> None:
        print(f"e31 {version()}")
        parser.exit(0)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="e31",
        description="e31: a peer-to-peer network for asynchronous, verifiable WebAssembly compute.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is passed through untouched (guest arguments), to commands whose
    # parser sets `accepts_passthrough`; argparse alone cannot mix options after a positional with `--`.
    tail: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if tail and not getattr(args, "accepts_passthrough", False):
        parser.error(f"unexpected arguments after '--': {' '.join(tail)}")
    args.passthrough = tail
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = run(args)
        return code
    except NodeError as e:  # any expected failure, from any wing: one line and its exit code
        print(f"e31: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # last resort: one line, never a traceback unless asked for
        if os.environ.get("E31_DEBUG"):
            raise
        print(f"e31: internal error: {type(e).__name__}: {e} (set E31_DEBUG=1 for details)", file=sys.stderr)
        return 70
