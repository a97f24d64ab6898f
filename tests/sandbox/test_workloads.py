"""The shipped C workloads: each one's output checked through the real sandbox runner, and a rebuild
from source (where clang can target wasm32-wasi) that must behave the same as the shipped modules."""

from __future__ import annotations

import collections
import functools
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import wasmtime
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, RunResult, Status
from e31.sandbox.runner import compile_module, default_engine, run

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
NAMES = ("echo", "imagefilter", "mandelbrot", "montecarlo", "wordfreq")
LIMITS = Limits(fuel=5_000_000_000, memory_bytes=64 * 1024 * 1024, wall_seconds=30.0)


def module(name: str, directory: Path = WORKLOADS) -> bytes:
    return (directory / f"{name}.wasm").read_bytes()


@functools.cache
def compiled(module_bytes: bytes) -> wasmtime.Module:
    return compile_module(default_engine(), module_bytes)


def run_workload(
    name: str,
    *args: str,
    directory: Path = WORKLOADS,
    inputs: dict[str, Path] | None = None,
    output_dir: Path | None = None,
    stdin: Path | None = None,
    seed: bytes = bytes(32),
) -> RunResult:
    wasm = module(name, directory)
    spec = JobSpec(wasm, args=args, inputs=inputs or {}, stdin=stdin, limits=LIMITS, seed=seed)
    return run(spec, output_dir, engine=default_engine(), module=compiled(wasm))


def exited_ok(r: RunResult) -> RunResult:
    assert (r.status, r.exit_code) == (Status.EXITED, 0), r
    return r


def parse_pgm(data: bytes) -> tuple[int, int, int, bytes]:
    m = re.match(rb"P5\s+(\d+)\s+(\d+)\s+(\d+)\s", data)
    assert m, data[:40]
    w, h, maxval = (int(x) for x in m.groups())
    pixels = data[m.end() :]
    assert len(pixels) == w * h
    return w, h, maxval, pixels


def pgm(w: int, h: int, pixels: bytes, comment: bytes = b"") -> bytes:
    return b"P5\n" + comment + b"%d %d\n255\n" % (w, h) + pixels


def test_shipped_modules_and_sources_are_all_there() -> None:
    for name in NAMES:
        assert (WORKLOADS / f"{name}.c").is_file()
        assert module(name).startswith(b"\x00asm")
    assert (WORKLOADS / "build.sh").is_file()
    assert (WORKLOADS / "TOOLCHAIN").read_text().strip()


# -- mandelbrot ------------------------------------------------------------------------------------


def test_mandelbrot_tile_size_and_known_pixels() -> None:
    r = exited_ok(run_workload("mandelbrot", "64", "32", "0", "0", "64", "32", "50"))
    w, h, maxval, px = parse_pgm(r.stdout)
    assert (w, h, maxval) == (64, 32, 255)
    # Pixel (0, 0) is c = -2.445 + 1.211i: |c|^2 > 4, so it escapes at iteration 1 -> 1 + 254 * 1 // 50.
    assert px[0] == 1 + 254 // 50
    # Pixel (41, 15) is c = -0.230 + 0.039i, inside the main cardioid: never escapes.
    assert px[15 * 64 + 41] == 0
    # The image is symmetric about the real axis (rows y and h-1-y mirror each other).
    assert all(px[y * w : (y + 1) * w] == px[(h - 1 - y) * w : (h - y) * w] for y in range(h // 2))


def test_mandelbrot_tiles_paste_into_the_whole_image() -> None:
    r = exited_ok(run_workload("mandelbrot", "40", "24", "0", "0", "40", "24", "80"))
    _, _, _, whole = parse_pgm(r.stdout)
    pasted = bytearray(40 * 24)
    for tx, ty, tw, th in ((0, 0, 25, 10), (25, 0, 15, 10), (0, 10, 40, 14)):
        r = exited_ok(run_workload("mandelbrot", "40", "24", str(tx), str(ty), str(tw), str(th), "80"))
        w, h, _, tile = parse_pgm(r.stdout)
        assert (w, h) == (tw, th)
        for row in range(th):
            pasted[(ty + row) * 40 + tx : (ty + row) * 40 + tx + tw] = tile[row * tw : (row + 1) * tw]
    assert bytes(pasted) == whole


def test_mandelbrot_writes_the_tile_to_output(tmp_path: Path) -> None:
    args = ("48", "48", "8", "16", "20", "12", "60")
    to_stdout = exited_ok(run_workload("mandelbrot", *args)).stdout
    r = exited_ok(run_workload("mandelbrot", *args, "/output/tile.pgm", output_dir=tmp_path))
    assert r.stdout == b""
    assert (tmp_path / "tile.pgm").read_bytes() == to_stdout
    assert set(r.output_files) == {"tile.pgm"}


@pytest.mark.parametrize("args", [("10", "10", "0", "0", "11", "1", "5"), ("10", "x"), ("0",) * 7])
def test_mandelbrot_refuses_bad_arguments(args: tuple[str, ...]) -> None:
    r = run_workload("mandelbrot", *args)
    assert (r.status, r.exit_code, r.stdout) == (Status.EXITED, 2, b"")


# -- montecarlo ------------------------------------------------------------------------------------


def estimate(r: RunResult) -> tuple[int, int, float]:
    lines = dict(line.split(" ") for line in exited_ok(r).stdout.decode().splitlines())
    return int(lines["samples"]), int(lines["inside"]), float(lines["pi"])


def test_montecarlo_estimates_pi_reproducibly() -> None:
    first = run_workload("montecarlo", "7", "400000")
    samples, inside, pi = estimate(first)
    assert samples == 400000
    assert pi == pytest.approx(4 * inside / samples, abs=1e-9)
    assert abs(pi - math.pi) < 0.02
    again = run_workload("montecarlo", "7", "400000")
    assert (again.stdout, again.fuel_used) == (first.stdout, first.fuel_used)
    assert estimate(run_workload("montecarlo", "8", "400000"))[1] != inside


def test_montecarlo_entropy_comes_from_the_job_seed() -> None:
    a = run_workload("montecarlo", "7", "20000", "--entropy", seed=b"\x01" * 32)
    b = run_workload("montecarlo", "7", "20000", "--entropy", seed=b"\x01" * 32)
    c = run_workload("montecarlo", "7", "20000", "--entropy", seed=b"\x02" * 32)
    assert a.stdout == b.stdout
    assert estimate(a)[1] != estimate(c)[1]


def test_montecarlo_refuses_zero_samples() -> None:
    assert run_workload("montecarlo", "7", "0").exit_code == 2


# -- wordfreq --------------------------------------------------------------------------------------

CORPUS = {
    "a.txt": "The cat and the hat.\nTHE END, isn't it?\n",
    "sub/b.txt": "cat-dog; dog's day: the cat\n" * 3,
    "sub/deeper/c.md": "x" * 5000 + " hat\n2024 2024 hat",
}


def expected_counts(texts: list[str]) -> list[tuple[int, str]]:
    counts = collections.Counter(w.lower() for t in texts for w in re.findall(r"[A-Za-z0-9']+", t))
    return sorted(((n, w) for w, n in counts.items()), key=lambda t: (-t[0], t[1]))


def write_corpus(root: Path) -> dict[str, Path]:
    inputs = {}
    for name, text in CORPUS.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        inputs[name] = p
    return inputs


def test_wordfreq_counts_every_file_under_input(tmp_path: Path) -> None:
    r = exited_ok(run_workload("wordfreq", "0", inputs=write_corpus(tmp_path)))
    got = [(int(n), w) for n, w in (line.split(" ") for line in r.stdout.decode().splitlines())]
    assert got == expected_counts(list(CORPUS.values()))


def test_wordfreq_top_n(tmp_path: Path) -> None:
    r = exited_ok(run_workload("wordfreq", "3", inputs=write_corpus(tmp_path)))
    top3 = expected_counts(list(CORPUS.values()))[:3]
    assert r.stdout.decode().splitlines() == [f"{n} {w}" for n, w in top3]


def test_wordfreq_on_an_empty_or_missing_directory() -> None:
    assert exited_ok(run_workload("wordfreq", "5")).stdout == b""
    r = run_workload("wordfreq", "5", "/input/missing")
    assert (r.status, r.exit_code, r.stdout) == (Status.EXITED, 1, b"")


# -- imagefilter -----------------------------------------------------------------------------------

W, H = 9, 7
IMAGE = bytes((x * 37 + y * 91 + (x * y) % 5 * 13) % 256 for y in range(H) for x in range(W))


def at(x: int, y: int) -> int:
    return IMAGE[min(max(y, 0), H - 1) * W + min(max(x, 0), W - 1)]


def expected_blur(r: int) -> bytes:
    n = (2 * r + 1) ** 2
    window = [(dx, dy) for dx in range(-r, r + 1) for dy in range(-r, r + 1)]
    return bytes(
        (sum(at(x + dx, y + dy) for dx, dy in window) + n // 2) // n for y in range(H) for x in range(W)
    )


def expected_sobel() -> bytes:
    out = []
    for y in range(H):
        for x in range(W):
            gx = (
                at(x + 1, y - 1)
                + 2 * at(x + 1, y)
                + at(x + 1, y + 1)
                - at(x - 1, y - 1)
                - 2 * at(x - 1, y)
                - at(x - 1, y + 1)
            )
            gy = (
                at(x - 1, y + 1)
                + 2 * at(x, y + 1)
                + at(x + 1, y + 1)
                - at(x - 1, y - 1)
                - 2 * at(x, y - 1)
                - at(x + 1, y - 1)
            )
            out.append(min(math.isqrt(gx * gx + gy * gy), 255))
    return bytes(out)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("blur", "1"), expected_blur(1)),
        (("blur", "2"), expected_blur(2)),
        (("sobel",), expected_sobel()),
        (("invert",), bytes(255 - p for p in IMAGE)),
    ],
    ids=["blur1", "blur2", "sobel", "invert"],
)
def test_imagefilter(tmp_path: Path, args: tuple[str, ...], expected: bytes) -> None:
    src = tmp_path / "in.pgm"
    src.write_bytes(pgm(W, H, IMAGE, comment=b"# a comment line\n"))
    out = tmp_path / "out"
    exited_ok(
        run_workload(
            "imagefilter", *args, "/input/img.pgm", "/output/img.pgm", inputs={"img.pgm": src}, output_dir=out
        )
    )
    assert parse_pgm((out / "img.pgm").read_bytes()) == (W, H, 255, expected)


def test_imagefilter_refuses_a_non_pgm(tmp_path: Path) -> None:
    src = tmp_path / "in.pgm"
    src.write_bytes(b"P6\n1 1\n255\nabc")
    r = run_workload(
        "imagefilter", "invert", "/input/x", "/output/y", inputs={"x": src}, output_dir=tmp_path / "o"
    )
    assert r.status is Status.EXITED and r.exit_code == 1
    assert r.output_files == {}


# -- echo ------------------------------------------------------------------------------------------


def test_echo_prints_arguments_or_copies_stdin(tmp_path: Path) -> None:
    assert exited_ok(run_workload("echo", "hello", "wide world")).stdout == b"hello wide world\n"
    stdin = tmp_path / "stdin"
    stdin.write_bytes(b"line one\nline two\n" * 500)
    assert exited_ok(run_workload("echo", stdin=stdin)).stdout == stdin.read_bytes()


# -- rebuilding from source ------------------------------------------------------------------------

SAMPLE_RUNS: dict[str, tuple[str, ...]] = {
    "echo": ("a", "b"),
    "mandelbrot": ("30", "20", "3", "2", "20", "15", "40"),
    "montecarlo": ("3", "5000", "--entropy"),
    "wordfreq": ("0",),
    "imagefilter": ("sobel", "/input/img.pgm", "/output/out.pgm"),
}


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed: cannot rebuild the workloads from source")
    out = tmp_path_factory.mktemp("rebuilt")
    probe = subprocess.run(
        ["clang", "--target=wasm32-wasi", "-O2", "-o", str(out / "probe.wasm"), str(WORKLOADS / "echo.c")],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(
            "clang cannot build for wasm32-wasi here (needs lld, wasi-libc and "
            f"libclang-rt-dev-wasm32): {probe.stderr.strip()[:200]}"
        )
    subprocess.run(["sh", str(WORKLOADS / "build.sh"), str(out)], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_rebuilt_module_gives_the_same_output(rebuilt: Path, name: str, tmp_path: Path) -> None:
    inputs = write_corpus(tmp_path / "corpus") if name == "wordfreq" else {}
    if name == "imagefilter":
        (tmp_path / "img.pgm").write_bytes(pgm(W, H, IMAGE))
        inputs = {"img.pgm": tmp_path / "img.pgm"}
    shipped = run_workload(name, *SAMPLE_RUNS[name], inputs=inputs, output_dir=tmp_path / "a")
    again = run_workload(
        name, *SAMPLE_RUNS[name], directory=rebuilt, inputs=inputs, output_dir=tmp_path / "b"
    )
    exited_ok(shipped)
    assert (again.status, again.exit_code, again.stdout_sha256, again.output_files) == (
        shipped.status,
        shipped.exit_code,
        shipped.stdout_sha256,
        shipped.output_files,
    )


def test_rebuild_with_the_same_compiler_is_byte_identical(rebuilt: Path) -> None:
    if (rebuilt / "TOOLCHAIN").read_text() != (WORKLOADS / "TOOLCHAIN").read_text():
        pytest.skip(
            "a different clang than the one that built the shipped modules: only the outputs are compared"
        )
    # Every shipped source, those tested elsewhere (generate, in test_generate.py) included.
    for name in sorted(src.stem for src in WORKLOADS.glob("*.c")):
        assert module(name, rebuilt) == module(name), f"{name}.wasm differs from its rebuild"


# -- through the command line ----------------------------------------------------------------------


def test_workloads_run_through_e31_sandbox_run(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from e31.node.cli.main import main

    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    assert main(["sandbox", "run", "--input", str(corpus), str(WORKLOADS / "wordfreq.wasm"), "--", "2"]) == 0
    top2 = expected_counts(list(CORPUS.values()))[:2]
    assert capfd.readouterr().out.splitlines() == [f"{n} {w}" for n, w in top2]

    out = tmp_path / "out"
    assert (
        main(
            [
                "sandbox",
                "run",
                "--output",
                str(out),
                str(WORKLOADS / "mandelbrot.wasm"),
                "--",
                "32",
                "16",
                "0",
                "0",
                "32",
                "16",
                "50",
                "/output/tile.pgm",
            ]
        )
        == 0
    )
    assert parse_pgm((out / "tile.pgm").read_bytes())[:3] == (32, 16, 255)
