"""The runner's wall-clock watchdog across back-to-back runs: a run that starts while the watchdog
thread still ticks from the last one, a run that needs a shorter tick, and a run after the thread went
to sleep all stop at their limit."""

from __future__ import annotations

import threading

from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.profile import new_engine
from e31.sandbox.runner import IDLE_TICKS, TICK_SECONDS, _state, run, wat_to_wasm

SPIN = wat_to_wasm('(module (memory 1) (export "memory" (memory 0)) (func (export "_start") (loop (br 0))))')
QUICK = wat_to_wasm('(module (memory 1) (export "memory" (memory 0)) (func (export "_start")))')


def spin(wall: float) -> JobSpec:
    return JobSpec(SPIN, limits=Limits(fuel=Limits.MAX_FUEL, wall_seconds=wall))


def test_back_to_back_runs_each_stop_at_their_own_limit() -> None:
    engine = new_engine()
    watchdog = _state(engine).watchdog
    for _ in range(20):  # the thread ticks between these: no wake-up needed
        assert run(JobSpec(QUICK), engine=engine).status is Status.EXITED
    r = run(spin(0.3), engine=engine)
    assert r.status is Status.TIMEOUT and r.wall_seconds >= 0.3
    assert run(JobSpec(QUICK), engine=engine).status is Status.EXITED
    r = run(spin(0.05), engine=engine)  # a tick of 5 ms, shorter than the one the thread waits on
    assert r.status is Status.TIMEOUT and 0.05 <= r.wall_seconds < 0.3
    asleep = threading.Event()
    for _ in range(int(IDLE_TICKS * TICK_SECONDS * 50 / 0.01)):  # until it sleeps (state, not time)
        with watchdog._cond:
            if watchdog._waiting is None and watchdog._idle >= IDLE_TICKS:
                asleep.set()
                break
        threading.Event().wait(0.01)
    assert asleep.is_set()
    r = run(spin(0.2), engine=engine)  # wakes the sleeping thread
    assert r.status is Status.TIMEOUT and r.wall_seconds >= 0.2
    assert run(JobSpec(QUICK), engine=engine).status is Status.EXITED
