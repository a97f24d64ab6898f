"""`e31 inspect PATH|-`: verify and decode one signed envelope and print it as one JSON object.

The first tool an auditor reaches for, so it never rejects a message for having expired: it
reports `expired` (against the clock, or --now) and leaves the judgement to the reader.
Imports only the protocol package (no trio, no wasmtime) to keep start-up fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from e31.node.cli.main import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH|-", help="file holding the raw envelope bytes, or - for stdin")
    parser.add_argument(
        "--hex", action="store_true", help="the input is the envelope in hex (whitespace ignored)"
    )
    parser.add_argument(
        "--now",
        type=int,
        metavar="MS",
        help="judge expiry at this time (ms since the Unix epoch) instead of the clock",
    )


def run(args: argparse.Namespace) -> int:
    from e31.protocol.codec import MAX_FRAME
    from e31.protocol.envelope import is_expired, verify
    from e31.protocol.errors import ProtocolError

    data = _read(args.path, MAX_FRAME * 2 + 64 if args.hex else MAX_FRAME)
    if args.hex:
        try:
            data = bytes.fromhex("".join(data.decode("ascii").split()))
        except (UnicodeDecodeError, ValueError):
            raise CliError("input is not hex (drop --hex for raw bytes)") from None
    try:
        env = verify(data)
    except ProtocolError as e:
        raise CliError(f"invalid envelope: {type(e).__name__}: {_one_line(str(e))}") from None
    now = args.now if args.now is not None else int(time.time() * 1000)
    out: dict[str, Any] = {
        "kind": env.kind,
        "signer": str(env.signer),
        "message_id": env.message_id.hex(),
        "expires": env.message.expires,
        "expired": is_expired(env, now),
    }
    out.update(_jobs(env.message))
    out["fields"] = env.message.to_json()
    json.dump(out, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def _jobs(message: Any) -> dict[str, Any]:
    """The job a message is about ("job_id"), or the jobs of a set ("job_ids": an offer's manifests
    hashed, a bid's items, a decline's list), in hex."""
    from e31.protocol.messages import Bid, Decline, Offer

    if isinstance(message, Offer):
        return {"job_ids": [m.job_id.hex() for m in message.manifests]}
    if isinstance(message, Bid):
        return {"job_ids": [item.job_id.hex() for item in message.items]}
    if isinstance(message, Decline):
        return {"job_ids": [job_id.hex() for job_id in message.job_ids]}
    job_id = getattr(message, "job_id", None)
    return {} if job_id is None else {"job_id": job_id.hex()}


def _read(path: str, limit: int) -> bytes:
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise CliError(f"{'stdin' if path == '-' else path}: larger than {limit} bytes, not one envelope")
    return data


def _one_line(text: str) -> str:
    return " ".join(text.split())
