"""Transport speed over real loopback TCP: signed messages per second through one link, and handshakes.

Run: .venv/bin/python tests/bench/bench_transport.py [--messages N] [--handshakes N] [--rounds R]

The receiving node runs in a second process (as it would in the network); the sending side signs each
~250-byte message with Ed25519 (nacl.signing directly) and sends it through an encrypted link; the
receiver verifies every signature and acknowledges the last message, so a figure covers sign + seal +
TCP + open + verify end to end. The same is measured with both ends in one process (one core for
everything) for comparison. Prints medians; exits 1 if the two-process message rate is below FLOOR.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import trio
from e31.node.net.transport import Connection, Limits, Timeouts, dial, serve
from nacl.signing import SigningKey, VerifyKey

T = TypeVar("T")

FLOOR = 5_000
"""Signed messages per second through one link (issue 5)."""

NETWORK = "bench"
BODY_SIZE = 250
TIMEOUTS = Timeouts(connect=10.0, handshake=10.0, idle=60.0, send=60.0)
LIMITS = Limits(max_connections=1024, timeouts=TIMEOUTS)
SIGNER = 32
SIGNATURE = 64


class BadMessage(Exception):
    """A message whose signature did not verify: the benchmark is measuring something broken."""


async def verifying_handler(conn: Connection) -> None:
    """Verify every message ([key 32][signature 64][body]); a body starting with b"last" is acked
    with the number of messages verified and the CPU seconds this process spent on them."""
    keys: dict[bytes, VerifyKey] = {}
    verified, cpu_start = 0, 0.0
    async for message in conn:
        if not verified:
            cpu_start = time.process_time()
        signer = message[:SIGNER]
        key = keys.get(signer) or keys.setdefault(signer, VerifyKey(signer))
        body = message[SIGNER + SIGNATURE :]
        key.verify(body, message[SIGNER : SIGNER + SIGNATURE])
        verified += 1
        if body.startswith(b"last"):
            await conn.send(b"%d %.6f" % (verified, time.process_time() - cpu_start))
            verified = 0


async def quiet_handler(conn: Connection) -> None:
    return


Handler = Callable[[Connection], Awaitable[None]]


async def serve_until_cancelled(
    handler: Handler,
    report: multiprocessing.Queue[int] | None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(
            partial(
                serve,
                handler,
                host="127.0.0.1",
                port=0,
                identity=SigningKey.generate(),
                network=NETWORK,
                limits=LIMITS,
            )
        )
        if report is not None:
            report.put(port)
        task_status.started(port)


def child(handler_name: str, report: multiprocessing.Queue[int]) -> None:
    handler = verifying_handler if handler_name == "verify" else quiet_handler
    trio.run(serve_until_cancelled, handler, report)


@dataclass(frozen=True)
class Round:
    rate: float
    """Messages per second, end to end (wall clock)."""
    sender_cpu: float
    receiver_cpu: float
    """CPU seconds per message on each side (with both sides in one process: all of it, on each)."""


async def send_signed(port: int, count: int) -> Round:
    """Sign and send `count` messages through one link and wait for the receiver's acknowledgement."""
    signer = SigningKey.generate()
    key = bytes(signer.verify_key)
    filler = os.urandom(BODY_SIZE - 8)
    conn = await dial("127.0.0.1", port, identity=SigningKey.generate(), network=NETWORK, timeouts=TIMEOUTS)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        start, cpu_start = time.perf_counter(), time.process_time()
        for i in range(count):
            body = (b"last" if i == count - 1 else b"msg:") + i.to_bytes(4, "big") + filler
            await conn.send(key + signer.sign(body).signature + body)
        verified, receiver_cpu = (await conn.receive()).split()
        elapsed, sender_cpu = time.perf_counter() - start, time.process_time() - cpu_start
        await conn.aclose()
    if int(verified) != count:
        raise BadMessage(f"the receiver verified {int(verified)} of {count} messages")
    return Round(count / elapsed, sender_cpu / count, float(receiver_cpu) / count)


async def handshakes(port: int, count: int) -> float:
    """Sequential dial + handshake + close, `count` times; return handshakes per second."""
    identity = SigningKey.generate()
    start = time.perf_counter()
    for _ in range(count):
        conn = await dial("127.0.0.1", port, identity=identity, network=NETWORK, timeouts=TIMEOUTS)
        await conn.aclose()
    return count / (time.perf_counter() - start)


async def in_process(messages: int, rounds: int) -> list[Round]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_until_cancelled, verifying_handler, None)
        rates = [await send_signed(port, messages) for _ in range(rounds)]
        nursery.cancel_scope.cancel()
    return rates


def in_child(handler_name: str, work: Callable[[int], Awaitable[list[T]]]) -> list[T]:
    context = multiprocessing.get_context("spawn")
    report: multiprocessing.Queue[int] = context.Queue()
    process = context.Process(target=child, args=(handler_name, report), daemon=True)
    process.start()
    try:
        port = report.get(timeout=30)
        return trio.run(work, port)
    finally:
        process.terminate()
        process.join(10)


async def repeat(fn: Callable[[int, int], Awaitable[T]], count: int, rounds: int, port: int) -> list[T]:
    return [await fn(port, count) for _ in range(rounds)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--handshakes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    two_process = in_child("verify", partial(repeat, send_signed, args.messages, args.rounds))
    one_process = trio.run(in_process, args.messages, args.rounds)
    shakes = in_child("quiet", partial(repeat, handshakes, args.handshakes, args.rounds))

    rate = statistics.median(r.rate for r in two_process)
    sender_us = statistics.median(r.sender_cpu for r in two_process) * 1e6
    receiver_us = statistics.median(r.receiver_cpu for r in two_process) * 1e6
    print(
        f"signed {BODY_SIZE} B messages through one link, two processes: {rate:,.0f}/s "
        f"(median of {args.rounds} x {args.messages}; floor {FLOOR:,}/s)"
    )
    ceiling = 1e6 / max(sender_us, receiver_us)
    print(
        f"  CPU per message: sender {sender_us:.0f} us (sign, seal, send), receiver {receiver_us:.0f} us "
        f"(receive, open, verify): {ceiling:,.0f}/s with a free core for each side"
    )
    print(
        f"signed {BODY_SIZE} B messages through one link, one process:  "
        f"{statistics.median(r.rate for r in one_process):,.0f}/s"
    )
    print(
        f"handshakes over loopback (dial + handshake + close, sequential): {statistics.median(shakes):,.0f}/s"
    )
    if rate < FLOOR:
        print(f"FAIL: {rate:,.0f} signed messages/s is below the floor of {FLOOR:,}/s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
