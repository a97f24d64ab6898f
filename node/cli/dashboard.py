"""`e31 dashboard`: the address of the running node's dashboard, signed in.

Prints `http://127.0.0.1:PORT/#token=TOKEN` (PORT and TOKEN from DATA/api.json, once the node has
answered GET /v1/status with them): the part after `#` never leaves the browser, and the page moves
the token into the tab's sessionStorage and drops it from the address bar. The address is as secret
as the token (docs/security.md, "The dashboard"). `--open` hands it to the default browser instead.
"""

from __future__ import annotations

import argparse
import json

from ..config import API_FILE, add_data_dir_argument, resolve_data_dir
from .main import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("--open", action="store_true", help="open it in the default web browser")


def run(args: argparse.Namespace) -> int:
    from ..api.client import ApiClient, ApiClientError

    try:
        with ApiClient(args.data_dir, timeout=10.0) as api:
            api.get("/v1/status")  # the node runs and takes this token
            doc = json.loads((resolve_data_dir(args.data_dir) / API_FILE).read_text())
    except ApiClientError as e:
        raise CliError(str(e)) from e
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read the node's {API_FILE}: {e}") from None
    url = f"http://{doc['host']}:{doc['port']}/#token={doc['token']}"
    if args.open:
        import webbrowser

        if not webbrowser.open(url):
            raise CliError("no web browser found here; open the address `e31 dashboard` prints")
        return 0
    print(url)
    return 0
