"""`e31 audit FILE [--reexecute] [--json]`: check a receipts bundle offline.

Exit 0 when everything in the bundle is sound, 1 when the audit found any problem, 2 when the file
cannot be read as a bundle.
"""

from __future__ import annotations

import argparse
import json
import sys

from e31.node.cli.main import CliError

from .progress import add_progress_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a bundle written by `e31 receipts export`")
    parser.add_argument(
        "--reexecute",
        action="store_true",
        help="re-run every job in the local sandbox and require the exact outputs and fuel "
        "(needs a bundle exported --with-blobs)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_progress_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..audit.bundle import BundleError, read_bundle
    from ..audit.checks import audit, render

    try:
        bundle = read_bundle(args.file)
    except BundleError as e:
        raise CliError(f"cannot audit: {e}", 2) from None
    from .progress import Ticker, wanted

    show = wanted(args) and args.reexecute
    with Ticker("re-executing the bundle's jobs", show) as ticker:
        report = audit(bundle, reexecute=args.reexecute, progress=lambda n, t: ticker.note(f"{n}/{t} jobs"))
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(report))
    return 0 if report.sound else 1
