"""Idle capacity: the pure formulas on synthetic samples, the /proc reader on the real machine, and the
monitor service following a synthetic owner load under a mock clock."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing
from e31.node.host.capacity import (
    CORE_SLACK,
    MEMORY_STEP,
    Capacity,
    CapacityError,
    CapacityEstimator,
    CapacityPolicy,
    CpuTimes,
    IdleGate,
    Sample,
    State,
    owner_cpu,
    parse_meminfo,
    parse_pid_stat,
    parse_proc_stat,
    read_sample,
    run_capacity_monitor,
    target,
)

GiB = 1 << 30
HZ = 100


class Machine:
    """A synthetic machine: counters advance by the loads set on it, as the kernel's would."""

    def __init__(self, cpus: int = 4, mem_available: int = 8 * GiB) -> None:
        self.cpus = cpus
        self.owner = 0.0
        """Cores the owner keeps busy."""
        self.workers: dict[int, tuple[float, int]] = {}
        """pid -> (cores it keeps busy, rss bytes)."""
        self.mem_available = mem_available
        self.busy = 0.0
        self.total = 0.0
        self.worker_ticks: dict[int, float] = {}

    def advance(self, seconds: float) -> None:
        self.total += seconds * HZ * self.cpus
        worker_cores = sum(c for c, _ in self.workers.values())
        self.busy += seconds * HZ * min(self.cpus, self.owner + worker_cores)
        for pid, (cores, _) in self.workers.items():
            self.worker_ticks[pid] = self.worker_ticks.get(pid, 0.0) + seconds * HZ * cores

    def sample(self, pids: Sequence[int] | None = None) -> Sample:
        pids = list(self.workers) if pids is None else pids
        live = [p for p in pids if p in self.workers]
        return Sample(
            cpus=self.cpus,
            cpu=CpuTimes(busy=round(self.busy), total=round(self.total)),
            worker_cpu={p: round(self.worker_ticks.get(p, 0.0)) for p in live},
            worker_rss=sum(self.workers[p][1] for p in live),
            mem_available=self.mem_available,
            workers=len(pids),
        )


# --- parsing ----------------------------------------------------------------------------------------

PROC_STAT = """cpu  100 20 30 1000 50 5 5 10 7 0
cpu0 50 10 15 500 25 2 3 5 7 0
cpu1 50 10 15 500 25 3 2 5 0 0
intr 12345 0 0
ctxt 999
"""


def test_parse_proc_stat() -> None:
    cpus, times = parse_proc_stat(PROC_STAT)
    assert cpus == 2
    # total = user..steal (guest is inside user already); busy = total - idle - iowait
    assert times == CpuTimes(busy=100 + 20 + 30 + 5 + 5 + 10, total=1220)


@pytest.mark.parametrize("text", ["", "intr 1 2\n", "cpu 1 2\n", "cpu a b c d\n"])
def test_parse_proc_stat_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_proc_stat(text)


def test_parse_meminfo() -> None:
    text = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\nCached: 5 kB\n"
    assert parse_meminfo(text) == 8_000_000 * 1024
    old_kernel = "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 10 kB\nCached: 200 kB\n"
    assert parse_meminfo(old_kernel) == 310 * 1024
    with pytest.raises(ValueError):
        parse_meminfo("Nothing: here\n")


def test_parse_pid_stat_counts_from_the_last_parenthesis() -> None:
    fields = ["S", *map(str, range(4, 14)), "700", "300", *map(str, range(16, 24)), "55", "0"]
    text = "1234 (evil) (name 1 2) " + " ".join(fields) + "\n"
    assert parse_pid_stat(text) == (1000, 55)
    with pytest.raises(ValueError):
        parse_pid_stat("1234 (short) S 1 2 3")
    with pytest.raises(ValueError):
        parse_pid_stat("no parenthesis")


# --- the formulas -----------------------------------------------------------------------------------


def test_owner_cpu_subtracts_our_workers() -> None:
    m = Machine(cpus=4)
    m.owner = 1.5
    m.workers = {10: (2.0, 0)}
    before = m.sample()
    m.advance(10)
    assert owner_cpu(before, m.sample()) == pytest.approx(1.5)
    assert owner_cpu(before, m.sample(pids=[])) == pytest.approx(3.5)  # our workers counted as the owner


def test_owner_cpu_new_and_reused_worker_pids() -> None:
    prev = Sample(cpus=2, cpu=CpuTimes(busy=0, total=0), worker_cpu={7: 5000})
    # pid 8 is new: all its 100 ticks are ours; pid 7 was reused (its counter went back): its 50 are ours.
    cur = Sample(cpus=2, cpu=CpuTimes(busy=200, total=400), worker_cpu={7: 50, 8: 100})
    assert owner_cpu(prev, cur) == pytest.approx((200 - 150) / 400 * 2)


def test_owner_cpu_is_clamped_and_unknown_without_time() -> None:
    a = Sample(cpus=2, cpu=CpuTimes(busy=100, total=1000), worker_cpu={1: 0})
    b = Sample(cpus=2, cpu=CpuTimes(busy=150, total=1100), worker_cpu={1: 90})  # workers > busy delta
    assert owner_cpu(a, b) == 0.0
    assert owner_cpu(a, a) is None
    backwards = Sample(cpus=2, cpu=CpuTimes(busy=50, total=1100))
    assert owner_cpu(a, backwards) is None


def test_owner_cpu_load_average_fallback() -> None:
    prev = Sample(cpus=4, cpu=None, loadavg=1.0)
    assert owner_cpu(prev, Sample(cpus=4, cpu=None, loadavg=3.5, workers=2)) == pytest.approx(1.5)
    assert owner_cpu(prev, Sample(cpus=4, cpu=None, loadavg=1.0, workers=2)) == 0.0
    assert owner_cpu(prev, Sample(cpus=4, cpu=None, loadavg=9.0)) == 4.0
    assert owner_cpu(prev, Sample(cpus=4, cpu=None)) is None


def test_target_cores_and_memory() -> None:
    policy = CapacityPolicy(cores=3, memory=4 * GiB)
    idle = Sample(cpus=4, cpu=None, mem_available=16 * GiB)
    assert target(policy, 0.0, idle) == (3, 4 * GiB)  # the ceiling
    assert target(policy, 1.0, idle) == (3, 4 * GiB)
    assert target(policy, 1.0 + CORE_SLACK + 0.01, idle) == (2, 4 * GiB)
    assert target(policy, 4.0, idle) == (0, 4 * GiB)
    assert target(policy, None, idle) == (3, 4 * GiB)  # unknown owner use: the ceiling
    tight = Sample(cpus=4, cpu=None, mem_available=GiB + 5, worker_rss=GiB)
    assert target(policy, 0.0, tight) == (3, 2 * GiB)  # our workers' memory is ours to offer
    odd = Sample(cpus=4, cpu=None, mem_available=MEMORY_STEP * 3 + 12345)
    assert target(policy, 0.0, odd) == (3, MEMORY_STEP * 3)
    assert target(policy, 0.0, Sample(cpus=4, cpu=None))[1] == 4 * GiB


@pytest.mark.parametrize(
    "kw",
    [
        {"cores": -1},
        {"cores": True},
        {"memory": -5},
        {"memory": 1.5},
        {"idle_threshold": 0.0},
        {"idle_threshold": 1.5},
        {"idle_seconds": -1.0},
        {"raise_after": float("inf")},
        {"idle_seconds": float("nan")},
    ],
)
def test_policy_rejects_bad_values(kw: dict[str, object]) -> None:
    args: dict[str, object] = {"cores": 2, "memory": GiB, **kw}
    with pytest.raises(CapacityError):
        CapacityPolicy(**args)  # type: ignore[arg-type]


def test_policy_from_config(tmp_path: Path) -> None:
    from e31.node.config import NodeConfig

    config = NodeConfig(data_dir=tmp_path, cores=3, memory=5 * GiB, only_when_idle=True, idle_seconds=60.0)
    policy = CapacityPolicy.from_config(config)
    assert policy == CapacityPolicy(
        cores=3,
        memory=5 * GiB,
        only_when_idle=True,
        idle_threshold=getattr(config, "idle_load", 0.2),
        idle_seconds=60.0,
    )


def test_idle_gate_hysteresis() -> None:
    gate = IdleGate(threshold=0.2, idle_seconds=60)
    assert gate.update(0, 0.05) is False  # starts as "working": quiet time must accumulate first
    assert gate.update(30, 0.05) is False
    assert gate.update(60, 0.05) is True
    assert gate.update(70, 0.15) is True  # between threshold/2 and threshold: stays idle
    assert gate.update(80, 0.25) is False  # above the threshold: working at once
    assert gate.update(90, 0.15) is False  # in the band: quiet time does not start
    assert gate.update(100, 0.05) is False
    assert gate.update(150, 0.15) is False  # the band interrupts the quiet time
    assert gate.update(160, 0.05) is False
    assert gate.update(219, 0.1) is False
    assert gate.update(220, 0.1) is True


def test_estimator_drops_at_once_and_rises_after_holding() -> None:
    m = Machine(cpus=4)
    est = CapacityEstimator(CapacityPolicy(cores=4, memory=4 * GiB, raise_after=20))
    assert est.observe(0, m.sample()) is None  # the baseline
    seen = []
    for t, owner in [(5, 0), (10, 0), (15, 2), (20, 2), (25, 0), (30, 0), (40, 0), (45, 0), (50, 0)]:
        m.owner = owner
        m.advance(5)
        cap = est.observe(t, m.sample())
        assert cap is not None and cap.state is State.AVAILABLE
        seen.append(cap.cores)
    # 2 cores used over (10, 20] -> 2 offered at once, and until 20 s have passed without that use
    assert seen == [4, 4, 2, 2, 2, 2, 2, 4, 4]


def test_estimator_memory_follows_the_owner() -> None:
    m = Machine(cpus=2, mem_available=8 * GiB)
    m.workers = {50: (1.0, GiB)}
    est = CapacityEstimator(CapacityPolicy(cores=2, memory=6 * GiB, raise_after=0))
    est.observe(0, m.sample())
    m.advance(5)
    first = est.observe(5, m.sample())
    assert first is not None and first.memory == 6 * GiB and first.cores == 2
    m.mem_available = 2 * GiB  # the owner took memory; our worker still holds 1 GiB of it
    m.advance(5)
    second = est.observe(10, m.sample())
    assert second is not None and second.memory == 3 * GiB


def test_estimator_only_when_idle() -> None:
    m = Machine(cpus=4)
    policy = CapacityPolicy(
        cores=2, memory=GiB, only_when_idle=True, idle_threshold=0.2, idle_seconds=20, raise_after=0
    )
    est = CapacityEstimator(policy)
    est.observe(0, m.sample())
    states = []
    for t, owner in [(5, 0.1), (10, 0.1), (15, 0.1), (20, 0.1), (25, 0.1), (30, 3.0), (35, 0.1), (40, 0.5)]:
        m.owner = owner
        m.advance(5)
        cap = est.observe(t, m.sample())
        assert cap is not None
        states.append((cap.state, cap.cores))
    assert states == [
        (State.WAITING, 0),
        (State.WAITING, 0),
        (State.WAITING, 0),
        (State.WAITING, 0),
        (State.AVAILABLE, 2),  # quiet from t=5 to t=25
        (State.OWNER_BUSY, 0),  # 3 of 4 cores is above 20 %
        (State.WAITING, 0),
        (State.OWNER_BUSY, 0),  # 0.5 of 4 cores is above 10 % (half the threshold)
    ]


@pytest.mark.parametrize("only_when_idle", [False, True])
def test_a_bursty_owner_does_not_make_the_offer_flap(only_when_idle: bool) -> None:
    m = Machine(cpus=4)
    est = CapacityEstimator(
        CapacityPolicy(cores=4, memory=GiB, only_when_idle=only_when_idle, idle_seconds=20, raise_after=30)
    )
    est.observe(0, m.sample())
    offers = set()
    for step in range(1, 60):
        m.owner = 2.0 if step % 3 == 0 else 0.0  # 2 cores for one interval in three
        m.advance(5)
        cap = est.observe(step * 5, m.sample())
        assert cap is not None
        if step >= 3:
            offers.add(cap.offered)
    assert offers == ({(0, 0)} if only_when_idle else {(2, GiB)})


def test_estimator_only_when_idle_unmeasurable() -> None:
    est = CapacityEstimator(CapacityPolicy(cores=2, memory=GiB, only_when_idle=True, idle_seconds=0))
    est.observe(0, Sample(cpus=2, cpu=None))
    cap = est.observe(5, Sample(cpus=2, cpu=None))
    assert cap == Capacity(0, 0, State.UNMEASURED, None)
    assert cap.to_json() == {"cores": 0, "memory_bytes": 0, "state": "unmeasured", "owner_cpu_cores": None}
    plain = CapacityEstimator(CapacityPolicy(cores=2, memory=GiB))
    plain.observe(0, Sample(cpus=2, cpu=None))
    assert plain.observe(5, Sample(cpus=2, cpu=None)) == Capacity(2, GiB, State.AVAILABLE, None)


# --- the real /proc ---------------------------------------------------------------------------------

linux_only = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")


@linux_only
def test_read_sample_on_the_real_machine() -> None:
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 30: pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        first = read_sample([child.pid, 2**22 + 7, -3])  # a pid that does not exist, one that cannot
        deadline = time.monotonic() + 10
        while True:
            time.sleep(0.05)
            second = read_sample([child.pid])
            if second.worker_cpu[child.pid] > first.worker_cpu[child.pid] or time.monotonic() > deadline:
                break
    finally:
        child.kill()
        child.wait()
    assert list(first.worker_cpu) == [child.pid] and first.workers == 2
    assert first.cpu is not None and second.cpu is not None
    assert second.cpu.total > first.cpu.total and second.cpu.busy >= first.cpu.busy
    assert second.worker_cpu[child.pid] > first.worker_cpu[child.pid]  # the spinning worker's time
    assert second.worker_rss > 0 and second.mem_available is not None and second.mem_available > 0
    assert first.cpus >= 1 and first.loadavg is None
    mine = owner_cpu(first, second)
    theirs = owner_cpu(first, Sample(second.cpus, second.cpu))  # the same, with the worker not ours
    assert mine is not None and theirs is not None and mine < theirs


def test_read_sample_without_proc_falls_back(tmp_path: Path) -> None:
    sample = read_sample([os.getpid()], proc=tmp_path)
    assert sample.cpu is None and sample.mem_available is None and sample.worker_cpu == {}
    assert sample.workers == 1 and sample.cpus == (os.cpu_count() or 1)
    if hasattr(os, "getloadavg"):
        assert sample.loadavg is not None and sample.loadavg >= 0


def test_read_sample_with_garbled_proc(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("garbage\n")
    (tmp_path / "meminfo").write_text("\x00\x01")
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "stat").write_text("5 (x) S")
    sample = read_sample([5], proc=tmp_path)
    assert sample.cpu is None and sample.mem_available is None and sample.worker_cpu == {}


# --- the monitor service ----------------------------------------------------------------------------


async def _monitor(
    policy: CapacityPolicy, machine: Machine, reports: list[Capacity], nursery: trio.Nursery
) -> None:
    last = [trio.current_time()]

    def sampler(pids: Sequence[int]) -> Sample:
        now = trio.current_time()
        machine.advance(now - last[0])
        last[0] = now
        return machine.sample(pids)

    await nursery.start(
        lambda task_status: run_capacity_monitor(
            policy=policy,
            on_change=reports.append,
            interval=5.0,
            worker_pids=lambda: list(machine.workers),
            sampler=sampler,
            task_status=task_status,
        )
    )


async def test_capacity_follows_a_synthetic_load(autojump_clock: trio.testing.MockClock) -> None:
    machine = Machine(cpus=4, mem_available=16 * GiB)
    machine.workers = {100: (1.0, GiB)}  # our own job: never held against the owner
    reports: list[Capacity] = []
    policy = CapacityPolicy(cores=4, memory=8 * GiB, raise_after=10)
    async with trio.open_nursery() as nursery:
        await _monitor(policy, machine, reports, nursery)
        script = [(0.0, 16), (1.0, 16), (2.0, 6), (3.0, 4), (1.0, 12), (0.0, 16)]
        offered = []
        for owner, mem_gib in script:
            machine.owner, machine.mem_available = owner, mem_gib * GiB
            await trio.sleep(60)
            offered.append((reports[-1].cores, reports[-1].memory // GiB))
        nursery.cancel_scope.cancel()
    assert offered == [(4, 8), (3, 8), (2, 7), (1, 5), (3, 8), (4, 8)]
    assert all(r.state is State.AVAILABLE for r in reports)
    assert all(a.reported != b.reported for a, b in itertools.pairwise(reports))  # changes only
    assert reports[-1].owner_cpu == pytest.approx(0.0)


async def test_only_when_idle_offers_nothing_while_the_owner_works(
    autojump_clock: trio.testing.MockClock,
) -> None:
    machine = Machine(cpus=4)
    reports: list[Capacity] = []
    policy = CapacityPolicy(
        cores=2, memory=2 * GiB, only_when_idle=True, idle_threshold=0.25, idle_seconds=120, raise_after=0
    )
    async with trio.open_nursery() as nursery:
        await _monitor(policy, machine, reports, nursery)
        await trio.sleep(100)
        assert reports[-1].reported == (0, 0, State.WAITING)
        await trio.sleep(40)
        assert reports[-1].reported == (2, 2 * GiB, State.AVAILABLE)
        machine.owner = 2.0  # the owner starts working: half the machine
        await trio.sleep(5.5)
        assert reports[-1].reported == (0, 0, State.OWNER_BUSY)
        machine.owner = 0.8  # 20 %: below the threshold, above half of it: still working
        await trio.sleep(300)
        assert reports[-1].reported == (0, 0, State.OWNER_BUSY)
        machine.owner = 0.0
        await trio.sleep(60)
        assert reports[-1].reported == (0, 0, State.WAITING)
        await trio.sleep(70)
        assert reports[-1].reported == (2, 2 * GiB, State.AVAILABLE)
        nursery.cancel_scope.cancel()
    assert [r.state for r in reports] == [
        State.WAITING,
        State.AVAILABLE,
        State.OWNER_BUSY,
        State.WAITING,
        State.AVAILABLE,
    ]


async def test_monitor_rejects_a_bad_interval() -> None:
    with pytest.raises(CapacityError):
        await run_capacity_monitor(policy=CapacityPolicy(cores=1, memory=GiB), on_change=print, interval=0)
