"""Limits, job specs and the execution profile: validated on construction, stable digests."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from e31.sandbox.errors import JobSpecError, ProfileMismatch
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import REVERIFIABLE, Limits, Status
from e31.sandbox.profile import PROFILE, ExecutionProfile
from e31.sandbox.runner import run
from guests import command


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fuel": 0},
        {"fuel": -1},
        {"fuel": 1.5},
        {"fuel": True},
        {"memory_bytes": 1000},
        {"memory_bytes": 5 * 1024**3},
        {"wall_seconds": 0},
        {"wall_seconds": float("nan")},
        {"wall_seconds": float("inf")},
        {"wall_seconds": "1"},
        {"max_output_bytes": -1},
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(JobSpecError):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_default_limits() -> None:
    d = Limits.default()
    assert d == Limits()
    assert d.fuel == Limits.DEFAULT_FUEL
    assert d.memory_bytes == Limits.DEFAULT_MEMORY_BYTES


def test_only_a_timeout_is_not_reverifiable() -> None:
    assert set(Status) - REVERIFIABLE == {Status.TIMEOUT}


def test_job_spec_checks_its_fields(tmp_path: Path) -> None:
    module = command("")
    with pytest.raises(JobSpecError):
        JobSpec(module, seed=b"short")
    with pytest.raises(JobSpecError):
        JobSpec(module, args=("a\x00b",))
    with pytest.raises(JobSpecError):
        JobSpec(module, env=(("A=B", "c"),))
    with pytest.raises(JobSpecError):
        JobSpec(module, stdin=tmp_path / "missing")
    with pytest.raises(JobSpecError, match="not a regular file"):
        JobSpec(module, inputs={"d": tmp_path})
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(JobSpecError, match="lies under"):
        JobSpec(module, inputs={"a/b": f, "a": f})
    spec = JobSpec(module, inputs={"a/b": f, "a/c": f})
    assert [i.parts for i in spec.input_files] == [("a", "b"), ("a", "c")]
    assert len(spec.module_sha256) == 64


def test_profile_digest_is_stable_and_covers_every_setting() -> None:
    again = ExecutionProfile(PROFILE.wasmtime_version, PROFILE.architecture, PROFILE.wasi)
    assert again.digest == PROFILE.digest
    assert len(PROFILE.digest) == 32
    assert PROFILE.as_dict()["nan_canonicalization"] is False
    other = ExecutionProfile(PROFILE.wasmtime_version, "riscv64", PROFILE.wasi)
    assert other.digest != PROFILE.digest
    stack = ExecutionProfile(
        PROFILE.wasmtime_version, PROFILE.architecture, PROFILE.wasi, max_wasm_stack=1 << 16
    )
    assert stack.digest != PROFILE.digest
    PROFILE.require(PROFILE.digest_hex)
    with pytest.raises(ProfileMismatch):
        PROFILE.require(other.digest_hex)


def test_results_carry_the_profile_digest() -> None:
    assert run(JobSpec(command(""))).profile_digest == PROFILE.digest_hex


def test_many_runs_leave_no_threads_behind() -> None:
    module = command("(call $print (i32.const 256) (i32.const 2))", data='(data (i32.const 256) "ok")')
    run(JobSpec(module))  # the engine's watchdog thread starts with its first run, then stays
    before = threading.active_count()
    results = {run(JobSpec(module)).stdout_sha256 for _ in range(200)}
    assert len(results) == 1
    assert threading.active_count() == before


def test_runs_from_several_threads_on_one_engine_are_each_correct() -> None:
    module = command("(call $print (i32.const 256) (i32.const 2))", data='(data (i32.const 256) "ok")')
    loop = command("(loop $l (br $l))")
    found: list[Status] = []

    def worker(m: bytes, limits: Limits) -> None:
        for _ in range(5):
            found.append(run(JobSpec(m, limits=limits)).status)

    threads = [
        threading.Thread(target=worker, args=(module, Limits())),
        threading.Thread(target=worker, args=(loop, Limits(fuel=200_000))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(found) == sorted([Status.EXITED] * 5 + [Status.OUT_OF_FUEL] * 5)
