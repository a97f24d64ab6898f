"""Idle capacity: what this node can spare, given what the machine's owner uses right now.

How it works (docs/operating.md, "Capacity and the machine's owner", has the formulas):
- A *sample* is a snapshot of counters: busy and total CPU jiffies of the whole machine (/proc/stat), the
  CPU jiffies and resident memory of the node's own worker processes (/proc/PID/stat), and the memory the
  kernel could hand out (MemAvailable in /proc/meminfo). `read_sample` takes one; elsewhere than Linux it
  falls back to the load average and leaves memory unmeasured.
- `owner_cpu(prev, cur)` turns two samples into the cores the owner used in between: all busy time minus
  our workers' time. `target(policy, owner, sample)` is what could be offered at that moment.
- `CapacityEstimator` is the pure state machine over a stream of (time, sample): it offers the smallest
  target of the last `raise_after` seconds (drops at once, rises only once the higher level has held), and
  with "only when idle" offers nothing while the owner works (`IdleGate`, with hysteresis in level and time).
- `run_capacity_monitor` is the trio service that samples every `interval` seconds and reports changes.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..errors import UsageError
from ..logs import logger

if TYPE_CHECKING:
    from ..config import NodeConfig

CORE_SLACK = 0.25
"""Owner use below this many cores (background noise) does not cost a whole offered core."""
MEMORY_STEP = 64 << 20
"""Offered memory is rounded down to a multiple of this, so it does not change with every sample."""
DEFAULT_IDLE_THRESHOLD = 0.2
DEFAULT_RAISE_AFTER = 30.0
DEFAULT_INTERVAL = 5.0
PROC = Path("/proc")


class CapacityError(UsageError):
    """A capacity policy that cannot be used (bad ceiling, threshold or time)."""


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """CPU time summed over all CPUs, in clock ticks (USER_HZ) since boot."""

    busy: int
    total: int


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of the machine's counters. Fields that could not be read are None."""

    cpus: int
    cpu: CpuTimes | None
    worker_cpu: Mapping[int, int] = field(default_factory=dict)
    """pid -> utime + stime in clock ticks, for each of our workers that could be read."""
    worker_rss: int = 0
    """Resident memory of our workers in bytes."""
    mem_available: int | None = None
    workers: int = 0
    """How many worker pids we were given (used only with the load-average fallback)."""
    loadavg: float | None = None
    """The 1-minute load average; read only where /proc/stat is missing."""


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    """The ceiling the operator configured and how eagerly to give way to the owner."""

    cores: int
    memory: int
    only_when_idle: bool = False
    idle_threshold: float = DEFAULT_IDLE_THRESHOLD
    """Owner CPU use, as a fraction of the whole machine, above which the owner counts as working."""
    idle_seconds: float = 300.0
    """With only_when_idle: how long the owner must stay under half the threshold before we offer."""
    raise_after: float = DEFAULT_RAISE_AFTER
    """A higher capacity is offered only once it has held this long; a lower one at once."""

    def __post_init__(self) -> None:
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 0:
            raise CapacityError(f"the core ceiling is a whole number of at least 0, got {self.cores!r}")
        if isinstance(self.memory, bool) or not isinstance(self.memory, int) or self.memory < 0:
            raise CapacityError(f"the memory ceiling is a number of bytes of at least 0, got {self.memory!r}")
        if not 0.0 < self.idle_threshold <= 1.0:
            raise CapacityError(f"the idle threshold is a fraction in (0, 1], got {self.idle_threshold!r}")
        for name in ("idle_seconds", "raise_after"):
            value = getattr(self, name)
            if not 0.0 <= value < math.inf:
                raise CapacityError(f"{name} must be a finite number of seconds >= 0, got {value!r}")

    @classmethod
    def from_config(cls, config: NodeConfig) -> CapacityPolicy:
        return cls(
            cores=config.cores,
            memory=config.memory,
            only_when_idle=config.only_when_idle,
            idle_threshold=config.idle_load,
            idle_seconds=config.idle_seconds,
            raise_after=config.capacity_raise_after,
        )


class State(Enum):
    AVAILABLE = "available"
    """Offering the ceiling reduced by the owner's use."""
    OWNER_BUSY = "owner-busy"
    """Only when idle: the owner works (use above the threshold, or since then not under half of it)."""
    WAITING = "waiting-for-idle"
    """Only when idle: the owner is quiet but not yet for idle_seconds; nothing offered."""
    UNMEASURED = "unmeasured"
    """Only when idle, but the owner's use cannot be measured here: nothing offered."""


@dataclass(frozen=True, slots=True)
class Capacity:
    cores: int
    memory: int
    state: State
    owner_cpu: float | None = None
    """Cores the owner used over the last interval (None: not measurable here)."""

    @property
    def offered(self) -> tuple[int, int]:
        """What peers see. It is smoothed and does not flap; `state` may change between two samples
        while `offered` stays (an owner between bursts goes from owner-busy to waiting-for-idle)."""
        return (self.cores, self.memory)

    @property
    def reported(self) -> tuple[int, int, State]:
        """What a report is about: changes of owner_cpu alone are not worth one."""
        return (self.cores, self.memory, self.state)

    def to_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "memory_bytes": self.memory,
            "state": self.state.value,
            "owner_cpu_cores": None if self.owner_cpu is None else round(self.owner_cpu, 3),
        }


# --- pure computation -------------------------------------------------------------------------------


def owner_cpu(prev: Sample, cur: Sample) -> float | None:
    """Cores the machine's owner kept busy between two samples, not counting our workers.

    From jiffies: (busy delta - our workers' delta) / total delta * cpus. A worker absent from `prev`
    (new since) counts with all its time; one whose counter went backwards (a reused pid) likewise.
    Without /proc/stat: the load average minus the number of our workers. None when neither is known.
    """
    if prev.cpu is not None and cur.cpu is not None:
        total = cur.cpu.total - prev.cpu.total
        busy = cur.cpu.busy - prev.cpu.busy
        if total <= 0 or busy < 0:
            return None
        ours = 0
        for pid, ticks in cur.worker_cpu.items():
            before = prev.worker_cpu.get(pid, 0)
            ours += ticks - before if ticks >= before else ticks
        fraction = min(max((busy - ours) / total, 0.0), 1.0)
        return fraction * cur.cpus
    if cur.loadavg is not None:
        return min(max(cur.loadavg - cur.workers, 0.0), float(cur.cpus))
    return None


def target(policy: CapacityPolicy, owner: float | None, sample: Sample) -> tuple[int, int]:
    """(cores, memory) that could be offered now, before smoothing and the idle rule.

    cores = min(ceiling, floor(cpus - owner + CORE_SLACK)), at least 0; the ceiling when owner is unknown.
    memory = min(ceiling, MemAvailable + our workers' RSS), rounded down to MEMORY_STEP; the ceiling
    when MemAvailable is unknown.
    """
    if owner is None:
        cores = policy.cores
    else:
        cores = max(0, min(policy.cores, math.floor(sample.cpus - owner + CORE_SLACK)))
    if sample.mem_available is None:
        memory = policy.memory
    else:
        spare = sample.mem_available + sample.worker_rss
        memory = min(policy.memory, spare // MEMORY_STEP * MEMORY_STEP)
    return cores, max(0, memory)


class IdleGate:
    """Whether the owner is away, with hysteresis so the answer does not flap.

    Working: owner use above `threshold` (a fraction of the machine); this takes effect at once.
    Away: owner use at or below threshold / 2 for `idle_seconds` without a break. In between, the gate
    keeps its answer, but a working owner's quiet time does not accumulate. It starts as "working".
    """

    def __init__(self, threshold: float, idle_seconds: float) -> None:
        self.threshold = threshold
        self.idle_seconds = idle_seconds
        self.idle = False
        self._quiet_since: float | None = None

    def update(self, now: float, fraction: float) -> bool:
        if fraction > self.threshold:
            self.idle = False
            self._quiet_since = None
        elif fraction <= self.threshold / 2:
            if self._quiet_since is None:
                self._quiet_since = now
            if now - self._quiet_since >= self.idle_seconds:
                self.idle = True
        elif not self.idle:
            self._quiet_since = None
        return self.idle


class CapacityEstimator:
    """Feed it (now, sample) in time order; it answers the capacity to offer.

    The first sample only sets the baseline (CPU use is a difference of counters): it answers None.
    """

    def __init__(self, policy: CapacityPolicy) -> None:
        self.policy = policy
        self._prev: Sample | None = None
        self._window: deque[tuple[float, int, int]] = deque()
        self._gate = IdleGate(policy.idle_threshold, policy.idle_seconds)

    def observe(self, now: float, sample: Sample) -> Capacity | None:
        prev, self._prev = self._prev, sample
        if prev is None:
            return None
        owner = owner_cpu(prev, sample)
        cores, memory = target(self.policy, owner, sample)
        window = self._window
        window.append((now, cores, memory))
        while now - window[0][0] > self.policy.raise_after:
            window.popleft()
        cores = min(c for _, c, _ in window)
        memory = min(m for _, _, m in window)
        if not self.policy.only_when_idle:
            return Capacity(cores, memory, State.AVAILABLE, owner)
        if owner is None or sample.cpus <= 0:
            return Capacity(0, 0, State.UNMEASURED, owner)
        if self._gate.update(now, owner / sample.cpus):
            return Capacity(cores, memory, State.AVAILABLE, owner)
        working = owner / sample.cpus > self.policy.idle_threshold / 2
        return Capacity(0, 0, State.OWNER_BUSY if working else State.WAITING, owner)


# --- reading the machine ----------------------------------------------------------------------------


def read_sample(worker_pids: Iterable[int] = (), *, proc: Path = PROC) -> Sample:
    """Read the counters now: from `proc` (/proc) on Linux, else the load average; never raises OSError.

    Workers that have exited (or never existed) are skipped.
    """
    pids = sorted({p for p in worker_pids if isinstance(p, int) and not isinstance(p, bool) and p > 0})
    cpus = os.cpu_count() or 1
    cpu: CpuTimes | None = None
    with contextlib.suppress(OSError, ValueError):
        cpus, cpu = parse_proc_stat((proc / "stat").read_text())
    mem_available: int | None
    try:
        mem_available = parse_meminfo((proc / "meminfo").read_text())
    except (OSError, ValueError):
        mem_available = None
    worker_cpu: dict[int, int] = {}
    worker_rss = 0
    if cpu is not None:
        page = _page_size()
        for pid in pids:
            try:
                ticks, rss_pages = parse_pid_stat((proc / str(pid) / "stat").read_text())
            except (OSError, ValueError):
                continue
            worker_cpu[pid] = ticks
            worker_rss += rss_pages * page
    loadavg = None
    if cpu is None:
        try:
            loadavg = os.getloadavg()[0]
        except (AttributeError, OSError):
            loadavg = None
    return Sample(
        cpus=cpus,
        cpu=cpu,
        worker_cpu=worker_cpu,
        worker_rss=worker_rss,
        mem_available=mem_available,
        workers=len(pids),
        loadavg=loadavg,
    )


def parse_proc_stat(text: str) -> tuple[int, CpuTimes]:
    """(number of CPUs, CpuTimes) from /proc/stat. Busy = everything but idle and iowait.

    The "cpu" line holds user nice system idle iowait irq softirq steal [guest guest_nice]; guest time
    is already part of user and nice, so it is left out of the total.
    """
    total_line: list[int] | None = None
    cpus = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            total_line = [int(x) for x in rest.split()]
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus += 1
    if total_line is None or len(total_line) < 4:
        raise ValueError("no aggregate cpu line in /proc/stat")
    fields = total_line[:8]
    total = sum(fields)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return max(cpus, 1), CpuTimes(busy=total - idle, total=total)


def parse_meminfo(text: str) -> int:
    """MemAvailable in bytes (kernels before 3.14 lack it: MemFree + Buffers + Cached instead)."""
    fallback: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key not in ("MemAvailable", "MemFree", "Buffers", "Cached"):
            continue
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            raise ValueError(f"unreadable {key} line in /proc/meminfo")
        value = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
        if key == "MemAvailable":
            return value
        fallback[key] = value
    if "MemFree" not in fallback:
        raise ValueError("neither MemAvailable nor MemFree in /proc/meminfo")
    return sum(fallback.values())


def parse_pid_stat(text: str) -> tuple[int, int]:
    """(utime + stime in clock ticks, rss in pages) from /proc/PID/stat.

    The command name (field 2) is in parentheses and may hold spaces and parentheses itself, so the
    fields are counted from the last ')'. utime, stime and rss are fields 14, 15 and 24.
    """
    end = text.rfind(")")
    if end < 0:
        raise ValueError("not a /proc/PID/stat line")
    rest = text[end + 1 :].split()
    if len(rest) < 22:
        raise ValueError("truncated /proc/PID/stat line")
    return int(rest[11]) + int(rest[12]), int(rest[21])


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 4096


class SyntheticOwnerLoad:
    """For tests only: a sampler whose owner uses exactly the number of cores written in a file.

    Chosen by `sampler_from_env` when E31_TEST_OWNER_LOAD_FILE names a file; never otherwise. A missing,
    empty or unreadable file means no owner load. Memory is left unmeasured (the ceiling applies).
    """

    TICKS = 10_000

    def __init__(self, path: Path, cpus: int | None = None) -> None:
        self.path = path
        self.cpus = cpus or os.cpu_count() or 1
        self._busy = 0
        self._total = 0

    def load(self) -> float:
        try:
            value = float(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0.0
        return min(max(value, 0.0), float(self.cpus)) if math.isfinite(value) else 0.0

    def __call__(self, worker_pids: Sequence[int] = ()) -> Sample:
        self._total += self.TICKS
        self._busy += round(self.TICKS * self.load() / self.cpus)
        return Sample(self.cpus, CpuTimes(self._busy, self._total))


TEST_OWNER_LOAD_ENV = "E31_TEST_OWNER_LOAD_FILE"


def sampler_from_env(environ: Mapping[str, str] | None = None) -> Callable[[Sequence[int]], Sample]:
    """/proc sampling, unless a test set E31_TEST_OWNER_LOAD_FILE (then SyntheticOwnerLoad)."""
    path = (os.environ if environ is None else environ).get(TEST_OWNER_LOAD_ENV)
    return SyntheticOwnerLoad(Path(path)) if path else read_sample


# --- the service ------------------------------------------------------------------------------------


async def run_capacity_monitor(
    *,
    policy: CapacityPolicy,
    on_change: Callable[[Capacity], object],
    interval: float = DEFAULT_INTERVAL,
    worker_pids: Callable[[], Iterable[int]] = tuple,
    sampler: Callable[[Sequence[int]], Sample] = read_sample,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Sample every `interval` seconds; call `on_change(capacity)` when the offer or the state changes.

    Ready once the first sample is taken; the first report follows one interval later. `worker_pids`
    names the node's worker processes at each sample. `sampler` defaults to reading /proc: two small procfs
    files plus one per worker, about 0.5 ms here, so it runs on the trio thread (where a mock clock can
    drive it). Runs until cancelled.
    """
    log = logger("capacity")
    if not 0 < interval < math.inf:
        raise CapacityError(f"the sampling interval must be a positive number of seconds, got {interval!r}")
    estimator = CapacityEstimator(policy)
    last: Capacity | None = None
    estimator.observe(trio.current_time(), sampler(tuple(worker_pids())))
    task_status.started()
    while True:
        await trio.sleep(interval)
        capacity = estimator.observe(trio.current_time(), sampler(tuple(worker_pids())))
        if capacity is None or (last is not None and capacity.reported == last.reported):
            continue
        if capacity.state is State.UNMEASURED and (last is None or last.state is not State.UNMEASURED):
            log.warning(
                "only-when-idle is set but the owner's CPU use cannot be measured here: offering nothing"
            )
        log.info(
            "capacity: %d cores, %d MiB (%s)", capacity.cores, capacity.memory >> 20, capacity.state.value
        )
        last = capacity
        on_change(capacity)
