"""Protocol benchmark: raw Ed25519 verification vs. our verify+decode, and encode+sign, on one core.

Run: .venv/bin/python tests/bench/bench_protocol.py [--rounds N]
Prints the rates and exits 1 if verify+decode of a typical one-job offer or a receipt falls below 80%
of the raw Ed25519 verification rate measured in the same run. The machine is shared and noisy, so
the measurements alternate in short rounds and the floor is judged on the median of the per-round
ratios (each ratio compares two measurements taken a few milliseconds apart). Offers are sets of
jobs: the two-job offer of the vectors and a full set of MAX_SET jobs are measured too, with their
cost per job (no floor: a set does in one envelope what took one per job).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import nacl.signing
from e31.protocol.envelope import sign_message, signed_bytes, verify
from e31.protocol.messages import BY_JOB, MAX_SET, Offer
from e31.protocol.schema import Message

FLOOR = 0.80
FLOORED = ("offer-1", "receipt")  # the floor's subjects; a ping shows the fixed cost of an envelope
VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "make_vectors.py"


def _samples() -> dict[str, tuple[nacl.signing.SigningKey, Message]]:
    """The measured messages: a ping, offers of 1, 2 (the vectors') and MAX_SET jobs, a receipt."""
    spec = importlib.util.spec_from_file_location("e31_make_vectors", VECTORS)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    vectors = {name: (gen.key(key_name), msg) for name, key_name, msg in gen.samples()}
    key, offer = vectors["offer"]
    assert isinstance(offer, Offer)
    full = sorted((gen.manifest(nonce=i.to_bytes(16, "big")) for i in range(MAX_SET)), key=BY_JOB)
    return {
        "ping": vectors["ping"],
        "offer-1": (key, Offer(offer.network, offer.expires, offer.submitter, offer.manifests[:1])),
        "offer-2": (key, offer),
        f"offer-{MAX_SET}": (key, Offer(offer.network, offer.expires, offer.submitter, tuple(full))),
        "receipt": vectors["receipt"],
    }


def _jobs(msg: Message) -> int:
    return len(msg.manifests) if isinstance(msg, Offer) else 1


def _rate(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()

    cases = {}
    for name, (key, msg) in _samples().items():
        data = sign_message(msg, key)
        env = verify(data)
        cases[name] = (key, msg, data, env.signer.raw, signed_bytes(env.kind, env.body), data[-64:])

    raw: list[float] = []
    decoded: dict[str, list[float]] = {name: [] for name in cases}
    ratios: dict[str, list[float]] = {name: [] for name in cases}
    overheads: dict[str, list[float]] = {name: [] for name in cases}  # us per envelope beyond raw verify
    signing: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (key, msg, data, raw_key, signed, signature) in cases.items():
            n = max(8, args.batch // _jobs(msg))  # a round of each case takes about as long
            r = _rate(lambda: nacl.signing.VerifyKey(raw_key).verify(signed, signature), n)  # noqa: B023
            d = _rate(lambda: verify(data), n)  # noqa: B023
            raw.append(r)
            decoded[name].append(d)
            ratios[name].append(d / r)
            overheads[name].append((1 / d - 1 / r) * 1e6)
            signing[name].append(_rate(lambda: sign_message(msg, key), max(2, n // 4)))  # noqa: B023

    med = statistics.median
    print(
        f"e31 protocol benchmark: {args.rounds} rounds x {args.batch} operations (/ jobs per offer), "
        "one core, medians"
    )
    print(f"  raw Ed25519 verify                {med(raw):10.0f} /s")
    failed = False
    for name, (_key, msg, data, *_rest) in cases.items():
        ratio = med(ratios[name])
        verdict = ""
        if name in FLOORED:
            ok = ratio >= FLOOR
            failed |= not ok
            verdict = f"  [{'ok' if ok else 'BELOW FLOOR'} >= {FLOOR:.0%}]"
        jobs = _jobs(msg)
        per_job = f", {1e6 / med(decoded[name]) / jobs:5.1f} us per job" if jobs > 1 else ""
        print(
            f"  verify+decode {name:<9} ({len(data):5d} B) {med(decoded[name]):10.0f} /s   "
            f"{ratio:6.1%} of raw verify, {med(overheads[name]):6.1f} us more{per_job}{verdict}"
        )
    for name in cases:
        print(f"  encode+sign   {name:<9}                {med(signing[name]):10.0f} /s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
