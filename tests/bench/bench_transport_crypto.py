"""Transport crypto speed, sans I/O: full handshakes, and session frames sealed + opened, on one core.

Run: .venv/bin/python tests/bench/bench_transport_crypto.py. Prints medians of five rounds and exits 1
if a figure is below its floor. Sockets and trio are not involved: this is the ceiling the node's
encrypted links can reach.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable

from bench_merkle import rate  # the median-of-5 rate helper (this directory is on sys.path)
from e31.protocol.handshake import Initiator, Responder
from e31.protocol.session import Session
from nacl.signing import SigningKey

FLOORS = {
    "handshakes (both sides)": 200,
    "300 B frames seal+open": 20_000,
    "64 KiB frames seal+open": 1_000,
}


def main() -> int:
    alice, bob = SigningKey(bytes(32)), SigningKey(bytes([1]) * 32)
    secrets = [hashlib.sha256(b"%d" % i).digest() for i in range(1000)]

    def handshakes() -> int:
        for i in range(0, 600, 2):
            ini = Initiator(alice, "main", secrets[i], expect=bytes(bob.verify_key))
            resp = Responder(bob, "main", secrets[i + 1])
            resp.receive_data(ini.receive_data(resp.receive_data(ini.initiate())))
        return 300

    ini = Initiator(alice, "main", secrets[0])
    resp = Responder(bob, "main", secrets[1])
    resp.receive_data(ini.receive_data(resp.receive_data(ini.initiate())))
    sender, receiver = Session(ini.result), Session(resp.result)

    def frames(size: int, count: int) -> Callable[[], int]:
        payload = bytes(size)

        def work() -> int:
            for _ in range(count):
                receiver.receive_data(sender.encrypt(payload))
                receiver.next_message()
            return count

        return work

    small, large = rate(frames(300, 20_000)), rate(frames(65_536, 1_000))
    figures = {
        "handshakes (both sides)": rate(handshakes),
        "300 B frames seal+open": small,
        "64 KiB frames seal+open": large,
    }
    failed = False
    print("Transport crypto (X25519, Ed25519, ChaCha20-Poly1305 via PyNaCl), median of 5 rounds, one core")
    for name, value in figures.items():
        ok = value >= FLOORS[name]
        failed |= not ok
        print(f"  {name:28s} {value:10,.0f} /s   floor {FLOORS[name]:,} {'ok' if ok else 'MISSED'}")
    print(f"  {'64 KiB frames throughput':28s} {large * 65_536 / 1e6:10,.0f} MB/s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
