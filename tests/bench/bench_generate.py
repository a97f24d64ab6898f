"""Inference speed: generate.wasm under the e31 sandbox (fuel on) against the same C source built natively.

Run: .venv/bin/python tests/bench/bench_generate.py [--tokens N] [--rounds R] [--prompts-small P]
         [--prompts-fuel P] [--batch-fuel B] [--fuel-only]

Three models: the 15M-parameter shape of llama2.c's stories15M (dim 288, 6 layers, 6 heads, 6 kv heads,
hidden 768, vocab 32000, seq 256) with random weights written into a temp dir, greedy from BOS for N
tokens (default 128); the published stories260K from ../shared/models/stories260K (skipped when
absent), P prompts (default 16) of 256 greedy tokens; the shipped model
(sandbox/workloads/models/kjv.bin), 3P prompts sampled at temperature 0.8 until each ends (its lines
are short). Each set of prompts runs in the sandbox and natively (clang or gcc, -O2 -march=native
-ffp-contract=off, so the SSE path adds in the same order as the wasm SIMD one), and again with
max_tokens 1: tokens/s and fuel per token come from the difference of the two, so model loading and
module compilation are left out. The native and sandbox completions must be identical. The ratio of
each round, median of R rounds (default 3); exits 1 if the sandbox is below 0.6x native on any model.

With --prompts-fuel P, also runs P prompts on the 15M shape in one job, each generating until the
256-token context is full; with --batch-fuel B, B short prompts of one token each in one job; both print
the fuel and peak memory (the figures behind the limits advised in docs/inference.md). --fuel-only runs
just those.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import wasmtime

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sandbox"))

from e31.sandbox.job import JobSpec  # noqa: E402
from e31.sandbox.limits import Limits, RunResult, Status  # noqa: E402
from e31.sandbox.runner import compile_module, default_engine, run  # noqa: E402
from llama2_files import SHAPE_15M, random_vocabulary, write_random_model, write_tokenizer  # noqa: E402

SOURCE = ROOT / "sandbox" / "workloads" / "generate.c"
WASM = ROOT / "sandbox" / "workloads" / "generate.wasm"
STORIES = ROOT.parent / "shared" / "models" / "stories260K"
KJV = ROOT / "sandbox" / "workloads" / "models" / "kjv.bin"
KJV_TOK = ROOT / "sandbox" / "workloads" / "models" / "kjv-tok.bin"
FLOOR = 0.6
LIMITS = Limits(fuel=10**13, memory_bytes=1 << 30, wall_seconds=3600.0)


def build_native(out: Path) -> tuple[Path, str]:
    for cc in ("clang", "gcc"):
        if shutil.which(cc):
            exe = out / "generate-native"
            cmd = [cc, "-O2", "-march=native", "-ffp-contract=off", "-o", str(exe), str(SOURCE), "-lm"]
            subprocess.run(cmd, check=True)
            return exe, " ".join([cc, *cmd[1:4]])
    raise SystemExit("no clang or gcc for the native build")


def prompts_file(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def generated(out: bytes) -> int:
    return sum(int(json.loads(line)["completion_tokens"]) for line in out.splitlines())


@functools.cache
def compiled() -> tuple[bytes, wasmtime.Module]:
    wasm = WASM.read_bytes()
    return wasm, compile_module(default_engine(), wasm)


def sandbox_run(model: Path, tok: Path, prompts: Path, out: Path) -> tuple[float, RunResult, bytes]:
    wasm, module = compiled()
    engine = default_engine()
    spec = JobSpec(
        wasm, inputs={"model.bin": model, "tokenizer.bin": tok, "prompts.jsonl": prompts}, limits=LIMITS
    )
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    r = run(spec, out, engine=engine, module=module)
    elapsed = time.perf_counter() - t
    assert (r.status, r.exit_code) == (Status.EXITED, 0), (r.status, r.exit_code, r.stderr)
    return elapsed, r, (out / "completions.jsonl").read_bytes()


def native_run(exe: Path, model: Path, tok: Path, prompts: Path, out: Path) -> tuple[float, bytes]:
    t = time.perf_counter()
    args = [str(exe), "--model", str(model), "--tokenizer", str(tok), "--prompts", str(prompts)]
    subprocess.run([*args, "--out", str(out)], check=True)
    return time.perf_counter() - t, out.read_bytes()


def measure(
    name: str, exe: Path, model: Path, tok: Path, tmp: Path, rows: list[dict[str, object]], rounds: int
) -> float:
    """Tokens/s of the rows' generation beyond each row's first token (the same rows with max_tokens 1)."""
    long_p = prompts_file(tmp / "long.jsonl", rows)
    short_p = prompts_file(tmp / "short.jsonl", [{**row, "max_tokens": 1} for row in rows])
    wasm_rates, native_rates, ratios, fuels = [], [], [], []
    for _ in range(rounds):
        # Interleaved, so both sides see the same load.
        t_long, r_long, out_wasm = sandbox_run(model, tok, long_p, tmp / "out")
        t_short, r_short, out_short = sandbox_run(model, tok, short_p, tmp / "out")
        n_long, out_native = native_run(exe, model, tok, long_p, tmp / "native.jsonl")
        n_short, _ = native_run(exe, model, tok, short_p, tmp / "native.jsonl")
        assert out_wasm == out_native, f"{name}: native and sandbox completions differ"
        timed = generated(out_wasm) - generated(out_short)
        wasm_rates.append(timed / (t_long - t_short))
        native_rates.append(timed / (n_long - n_short))
        ratios.append(wasm_rates[-1] / native_rates[-1])
        fuels.append((r_long.fuel_used - r_short.fuel_used) / timed)
    # The ratio of each round (both sides measured within seconds of each other), then the median.
    wasm_tps, native_tps = statistics.median(wasm_rates), statistics.median(native_rates)
    ratio = statistics.median(ratios)
    print(
        f"{name:12s} sandbox {wasm_tps:9.1f} tok/s   native {native_tps:9.1f} tok/s   "
        f"ratio {ratio:.2f}x   fuel/token {statistics.median(fuels):13,.0f}   "
        f"({len(rows)} prompts, {timed} tokens timed, median of {rounds}; rates "
        f"{', '.join(f'{w:.1f}' for w in wasm_rates)} / {', '.join(f'{n:.1f}' for n in native_rates)}; "
        f"ratios {', '.join(f'{x:.2f}' for x in ratios)})"
        + ("" if ratio >= FLOOR else f"   MISSED floor {FLOOR}x")
    )
    return ratio


def prompts_fuel(model: Path, tok: Path, tmp: Path, count: int) -> None:
    """count prompts, each generating to the end of the 256-token context: the worst case per prompt."""
    path = tmp / "many.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": "", "seed": i}) + "\n" for i in range(count)))
    t, r, out = sandbox_run(model, tok, path, tmp / "out")
    rows = [json.loads(line) for line in out.splitlines()]
    tokens = sum(int(row["completion_tokens"]) for row in rows)
    print(
        f"{count} prompts to the end of the context on the 15M shape: {tokens} tokens in {t:.1f} s, "
        f"fuel {r.fuel_used:,} ({r.fuel_used / count:,.0f} per prompt, "
        f"{r.fuel_used / tokens:,.0f} per token), "
        f"peak memory {r.peak_memory_bytes / 2**20:.1f} MiB"
    )


def batch_fuel(model: Path, tok: Path, tmp: Path, count: int) -> None:
    """count short prompts ("story N", 6 tokens with BOS) generating one token each, in one job."""
    path = tmp / "batch.jsonl"
    rows = [{"id": i, "prompt": f"story {i}", "max_tokens": 1} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    t, r, out = sandbox_run(model, tok, path, tmp / "out")
    assert generated(out) == count, "every line should generate its one token"
    print(
        f"{count} short prompts, 1 token each, on the 15M shape: fuel {r.fuel_used:,}, "
        f"peak memory {r.peak_memory_bytes / 2**20:.1f} MiB, {t:.1f} s"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts-small", type=int, default=16, help="prompts for the two small models")
    ap.add_argument("--prompts-fuel", type=int, default=0)
    ap.add_argument("--batch-fuel", type=int, default=0)
    ap.add_argument("--fuel-only", action="store_true", help="only the --prompts-fuel / --batch-fuel runs")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe, how = build_native(tmp)
        print(f"native: {how}; sandbox: {WASM.relative_to(ROOT)} with fuel")
        model, tok = tmp / "15m.bin", tmp / "15m-tok.bin"
        write_random_model(model, SHAPE_15M, scale=0.05)
        write_tokenizer(tok, *random_vocabulary(SHAPE_15M.vocab_size))
        if a.fuel_only:
            if a.prompts_fuel:
                prompts_fuel(model, tok, tmp, a.prompts_fuel)
            if a.batch_fuel:
                batch_fuel(model, tok, tmp, a.batch_fuel)
            return 0
        greedy = [{"id": i, "prompt": "", "max_tokens": 256} for i in range(a.prompts_small)]
        ratios = [
            measure(
                "15M shape", exe, model, tok, tmp, [{"id": 0, "prompt": "", "max_tokens": a.tokens}], a.rounds
            )
        ]
        if (STORIES / "stories260K.bin").is_file():
            stories = (STORIES / "stories260K.bin", STORIES / "tok512.bin")
            ratios.append(measure("stories260K", exe, *stories, tmp, greedy, a.rounds))
        else:
            print(f"stories260K: skipped, {STORIES} is absent")
        # The shipped model ends its verses with EOS: sampled lines, each to its own end.
        sampled = [{"id": i, "prompt": "", "temperature": 0.8, "seed": i} for i in range(3 * a.prompts_small)]
        ratios.append(measure("shipped kjv", exe, KJV, KJV_TOK, tmp, sampled, a.rounds))
        if a.prompts_fuel:
            prompts_fuel(model, tok, tmp, a.prompts_fuel)
        if a.batch_fuel:
            batch_fuel(model, tok, tmp, a.batch_fuel)
    return 0 if all(r >= FLOOR for r in ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
