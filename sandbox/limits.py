"""Job limits and the closed set of outcomes a run can have.

A run never raises for anything the guest does: every ending is one `Status` in a `RunResult`.
Which outcomes a third party can re-check by re-running the job is a property of the status
(`REVERIFIABLE`): everything except a wall-clock `timeout`, whose fuel figure wasmtime
under-reports and whose stopping point depends on the machine's speed.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .errors import JobSpecError, SandboxError


class Status(enum.StrEnum):
    EXITED = "exited"
    OUT_OF_FUEL = "out_of_fuel"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    TRAP = "trap"
    INVALID_MODULE = "invalid_module"


REVERIFIABLE: frozenset[Status] = frozenset(Status) - {Status.TIMEOUT}
"""Outcomes that depend only on the job and the profile, so a re-run reproduces them bit for bit."""

WASM_PAGE = 65536


@dataclass(frozen=True, slots=True)
class Limits:
    """What one job may consume. Validated on construction."""

    DEFAULT_FUEL: ClassVar[int] = 10_000_000_000
    DEFAULT_MEMORY_BYTES: ClassVar[int] = 256 * 1024 * 1024
    DEFAULT_WALL_SECONDS: ClassVar[float] = 60.0
    DEFAULT_MAX_OUTPUT_BYTES: ClassVar[int] = 64 * 1024 * 1024

    fuel: int = DEFAULT_FUEL
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    wall_seconds: float = DEFAULT_WALL_SECONDS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES

    MAX_FUEL: ClassVar[int] = 2**63 - 1
    MAX_MEMORY_BYTES: ClassVar[int] = 4 * 1024**3
    MAX_WALL_SECONDS: ClassVar[float] = 7 * 24 * 3600.0
    MAX_OUTPUT_BYTES: ClassVar[int] = 16 * 1024**3

    def __post_init__(self) -> None:
        _check_int("fuel", self.fuel, 1, self.MAX_FUEL)
        _check_int("memory_bytes", self.memory_bytes, WASM_PAGE, self.MAX_MEMORY_BYTES)
        _check_int("max_output_bytes", self.max_output_bytes, 0, self.MAX_OUTPUT_BYTES)
        w = self.wall_seconds
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise JobSpecError(f"wall_seconds must be a finite number, got {w!r}")
        if not 0 < w <= self.MAX_WALL_SECONDS:
            raise JobSpecError(f"wall_seconds must be in (0, {self.MAX_WALL_SECONDS:g}], got {w!r}")

    @classmethod
    def default(cls) -> Limits:
        return cls()


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise JobSpecError(f"{name} must be in [{lo}, {hi}], got {value}")


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run did. `stdout` and `stderr` hold a stream's first DISPLAY_CAP (1 MiB) bytes: the
    whole stream when its size (`stdout_bytes`, `stderr_bytes`) is no more, else a copy for display (the
    run's `streams_dir` then has it whole: `whole_stream`); the hashes cover everything.

    `fuel_used` is exact and reproducible for every reverifiable outcome. wasmtime checks fuel at
    loop heads and calls, so a guest can finish a few instructions past its budget; it then
    reports `fuel_used == fuel_limit`, and a re-run with the same budget reproduces that exactly.
    A `timeout` is charged its whole fuel budget because wasmtime under-reports fuel after an
    epoch stop.
    """

    status: Status
    exit_code: int | None
    trap: str | None
    message: str
    fuel_used: int
    fuel_limit: int
    wall_seconds: float
    peak_memory_bytes: int
    stdout: bytes
    stdout_sha256: str
    stderr_sha256: str
    output_files: dict[str, str] = field(default_factory=dict)
    output_bytes: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stderr: bytes = b""
    profile_digest: str = ""
    reverifiable: bool = False

    def to_json_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = str(self.status)
        d["stdout"] = self.stdout.decode("utf-8", errors="replace")
        d["stderr"] = self.stderr.decode("utf-8", errors="replace")
        d["output_files"] = dict(sorted(self.output_files.items()))
        return d

    def stream(self, name: str) -> tuple[bytes, int, str]:
        """stdout or stderr (`name`): the bytes held, the stream's size and its SHA-256 (hex)."""
        if name == "stdout":
            return self.stdout, self.stdout_bytes, self.stdout_sha256
        return self.stderr, self.stderr_bytes, self.stderr_sha256


def whole_stream(result: RunResult, streams_dir: Path | None, name: str) -> bytes | Path:
    """A run's whole stdout or stderr (`name`): its bytes when the result holds all of them (a stream of
    at most DISPLAY_CAP bytes), else the file under `streams_dir` it went to (the run must have had
    one). The caller checks what it reads against the result's size and hash."""
    held, total, _ = result.stream(name)
    if len(held) == total:
        return held
    if streams_dir is None:
        raise SandboxError(f"the run's {name} ({total} bytes) was not kept whole: it ran without streams_dir")
    return streams_dir / name
