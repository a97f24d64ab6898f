"""Protocol benchmark: raw Ed25519 verification vs. our verify+decode, and encode+sign, on one core.

Run: .venv/bin/python tests/bench/bench_protocol.py [--rounds N]
Prints the rates and exits 1 if verify+decode of a typical offer or receipt falls below 80% of
the raw Ed25519 verification rate measured in the same run. The machine is shared and noisy, so
the measurements alternate in short rounds and the floor is judged on the median of the per-round
ratios (each ratio compares two measurements taken a few milliseconds apart).
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

FLOOR = 0.80
FLOORED = ("offer", "receipt")  # the floor's subjects; a ping shows the fixed cost of an envelope
VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "make_vectors.py"


def _samples() -> dict[str, tuple[nacl.signing.SigningKey, object]]:
    spec = importlib.util.spec_from_file_location("e31_make_vectors", VECTORS)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return {name: (gen.key(key_name), msg) for name, key_name, msg in gen.samples()}


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

    samples = _samples()
    cases = {}
    for name in ("ping", "offer", "receipt"):
        key, msg = samples[name]
        data = sign_message(msg, key)  # type: ignore[arg-type]
        env = verify(data)
        raw_key = env.signer.raw
        signed = signed_bytes(env.kind, env.body)
        signature = data[-64:]
        cases[name] = (key, msg, data, raw_key, signed, signature)

    raw: list[float] = []
    decoded: dict[str, list[float]] = {name: [] for name in cases}
    ratios: dict[str, list[float]] = {name: [] for name in cases}
    overheads: dict[str, list[float]] = {name: [] for name in cases}  # us per envelope beyond raw verify
    signing: dict[str, list[float]] = {name: [] for name in cases}
    n = args.batch
    for _ in range(args.rounds):
        for name, (key, msg, data, raw_key, signed, signature) in cases.items():
            r = _rate(lambda: nacl.signing.VerifyKey(raw_key).verify(signed, signature), n)  # noqa: B023
            d = _rate(lambda: verify(data), n)  # noqa: B023
            raw.append(r)
            decoded[name].append(d)
            ratios[name].append(d / r)
            overheads[name].append((1 / d - 1 / r) * 1e6)
            signing[name].append(_rate(lambda: sign_message(msg, key), n // 4))  # type: ignore[arg-type]  # noqa: B023

    med = statistics.median
    print(f"e31 protocol benchmark: {args.rounds} rounds x {n} operations, one core, medians")
    print(f"  raw Ed25519 verify           {med(raw):10.0f} /s")
    failed = False
    for name in cases:
        size = len(cases[name][2])
        ratio = med(ratios[name])
        verdict = ""
        if name in FLOORED:
            ok = ratio >= FLOOR
            failed |= not ok
            verdict = f"  [{'ok' if ok else 'BELOW FLOOR'} >= {FLOOR:.0%}]"
        print(f"  verify+decode {name:<8} ({size:4d} B) {med(decoded[name]):10.0f} /s   "
              f"{ratio:6.1%} of raw verify, {med(overheads[name]):5.1f} us more{verdict}")
    for name in cases:
        print(f"  encode+sign   {name:<8}           {med(signing[name]):10.0f} /s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
