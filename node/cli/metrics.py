"""`e31 metrics`: the running node's metrics (GET /metrics), in the Prometheus text format, on stdout.

The local API's port and token change at every start of the node, so a Prometheus server cannot
scrape it directly; this command reads them from DATA/api.json, for example from a timer that writes
the text where node_exporter's textfile collector reads it (docs/operating.md, "Metrics").
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys

from ..config import API_FILE, add_data_dir_argument, resolve_data_dir
from .main import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)


def run(args: argparse.Namespace) -> int:
    data_dir = resolve_data_dir(args.data_dir)
    try:
        doc = json.loads((data_dir / API_FILE).read_text())
        host, port, token = str(doc["host"]), int(doc["port"]), str(doc["token"])
    except FileNotFoundError:
        raise CliError(f"no node is running with data dir {data_dir}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CliError(f"cannot read the node's {API_FILE}: {e}") from None
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        body = response.read()
    except ConnectionRefusedError:
        raise CliError(
            f"no node is running with data dir {data_dir} (nothing listens at {host}:{port})"
        ) from None
    except (OSError, http.client.HTTPException) as e:
        raise CliError(f"talking to the node at {host}:{port} failed: {e}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise CliError(f"the node answered GET /metrics with HTTP {response.status}")
    sys.stdout.write(body.decode("utf-8", errors="replace"))
    return 0
