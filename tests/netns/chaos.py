"""A chaos run: a sweep over hosts in network namespaces while a seeded schedule of faults strikes,
then an invariant check over every node's store and exported receipts.

The network (harness.py): a public segment with the submitter and `public` executors, and `homes`
home networks behind NAT routers with `per_home` executors each (they dial out to the public nodes:
nothing dials into a home). The submitter runs no job itself (its owner is at work for good), so
every run is an executor's and shows in that executor's own store.

The schedule (`random.Random(seed)`): `faults` steps, each one fault held for a while and then undone:
kill -9 of a node (the submitter among them) and a restart on its data dir; a pulled link (a host's,
or a router's uplink, cutting its whole home off); or a partition of the network into two random
halves, healed after. Between steps the sweep's jobs are submitted a few at a time, so the faults
fall over the whole sweep. Everything is bounded in count and time.

The check (`check`), after every fault is undone and every job has ended (or the bound passed):
- lost: a job not in a terminal state at its submitter, or ended without a verified receipt (`done`)
  or a stated reason;
- overlap: two executors ran one job (a receipt each) and the later one was assigned before the
  earlier one's lease ran out; a job that ran twice must also have only one receipt counted (verified
  and acknowledged by the submitter);
- rerun_after_submitter_restart: a job run again although an executor had finished it, with the
  submitter restarted in between and that executor never cut off from it meanwhile (what a returning
  submitter must never do);
- unacknowledged / acks_lost: a counted receipt its executor holds no acknowledgement of, or an
  acknowledgement an executor holds for a receipt the submitter does not count;
- audit: `e31 audit` of any node's exported bundle that does not pass.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from e31.protocol.assignments import Assignment, assignments
from e31.protocol.envelope import verify
from e31.protocol.receipts import UsageReceipt
from harness import Host, Router, Topology
from netnodes import NetNode, audit, wait_until

ROOT = Path(__file__).resolve().parents[2]
MONTECARLO = ROOT / "sandbox" / "workloads" / "montecarlo.wasm"
TERMINAL = ("done", "failed", "expired", "cancelled", "disputed")
FAST = ["--capacity-interval", "0.2", "--capacity-raise-after", "0", "--idle-seconds", "0"]


@dataclass
class ChaosConfig:
    seed: int = 1
    jobs: int = 300
    faults: int = 100
    public: int = 2
    """Executors on the public segment (with the submitter)."""
    homes: int = 2
    per_home: int = 1
    samples: int = 5_000_000
    """Monte Carlo samples per job (5M: about a quarter of a second alone here)."""
    hold: tuple[float, float] = (0.5, 3.0)
    """Seconds a fault is held (a node dead, a link down, a partition) before it is undone."""
    gap: tuple[float, float] = (0.2, 1.0)
    """Seconds between one fault's end and the next one."""
    kill_submitter: float = 0.25
    """Of the kills, the share that strikes the submitter."""
    weights: tuple[int, int, int] = (4, 3, 2)
    """Relative odds of a kill, a pulled link and a partition."""
    settle: float = 300.0
    """Seconds at most for every job to end once the faults are over."""
    timing: str = "lease_slack_ms=4000,collect_wait=6"
    """E31_TEST_MARKET_TIMING of every node: short leases, a short wait for an executor that is gone."""


@dataclass
class Fault:
    kind: str
    target: str
    at: float
    held: float
    cut: list[str] = field(default_factory=list)
    """The executors it cut off from the submitter (killed, unplugged, or on the other side)."""
    end: float = 0.0


@dataclass
class ChaosReport:
    config: dict[str, Any]
    hosts: int = 0
    faults: list[Fault] = field(default_factory=list)
    submitter_starts: list[float] = field(default_factory=list)
    states: dict[str, int] = field(default_factory=dict)
    runs: int = 0
    """Receipts signed by executors for the sweep's jobs (a job run twice counts twice)."""
    reruns: int = 0
    """Jobs that ran more than once (allowed: reassigned after a lease ran out)."""
    lost: list[str] = field(default_factory=list)
    overlap: list[str] = field(default_factory=list)
    rerun_after_submitter_restart: list[str] = field(default_factory=list)
    unacknowledged: list[str] = field(default_factory=list)
    acks_lost: list[str] = field(default_factory=list)
    audit_failures: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def fault_counts(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.faults))

    @property
    def sound(self) -> bool:
        return not (
            self.lost
            or self.overlap
            or self.rerun_after_submitter_restart
            or self.unacknowledged
            or self.acks_lost
            or self.audit_failures
        )

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["faults"] = self.fault_counts
        doc["fault_total"] = len(self.faults)
        doc["sound"] = self.sound
        return doc

    def summary(self) -> str:
        doc = self.to_json()
        del doc["config"], doc["submitter_starts"]
        return json.dumps(doc, default=str)


class Chaos:
    def __init__(self, topo: Topology, tmp: Path, config: ChaosConfig, log: Callable[[str], None] = print):
        self.topo = topo
        self.tmp = tmp
        self.cfg = config
        self.log = log
        self.rng = random.Random(config.seed)
        self.jobs: list[str] = []
        self.report = ChaosReport(config=asdict(config))
        env = {"E31_TEST_MARKET_TIMING": config.timing}
        public = topo.segment("public", "10.61.0.0/24")
        busy = tmp / "owner-busy"
        busy.write_text("8")
        s_host = topo.host("sub", public)
        self.submitter = NetNode(
            s_host, tmp / "sub", owner_load=busy, args=["--only-when-idle", *FAST], env=env
        )
        first = self.submitter.address
        self.executors: list[NetNode] = []
        for i in range(config.public):
            host = topo.host(f"pub{i}", public)
            self.executors.append(NetNode(host, tmp / host.name, bootstrap=[first], args=FAST, env=env))
        self.routers: list[Router] = []
        for h in range(config.homes):
            home = topo.segment(f"home{h}", f"10.62.{h}.0/24")
            router = topo.nat_router(f"r{h}", public, home)
            self.routers.append(router)
            for k in range(config.per_home):
                host = topo.host(f"h{h}n{k}", home, gateway=router.lan_ip)
                boot = [first] + ([self.executors[0].address] if self.executors else [])
                self.executors.append(NetNode(host, tmp / host.name, bootstrap=boot, args=FAST, env=env))
        self.nodes = [self.submitter, *self.executors]
        self.report.hosts = len(self.nodes)

    # --- running ---

    def start(self) -> None:
        t0 = time.monotonic()
        self.submitter.start()
        self.report.submitter_starts.append(time.time())
        for node in self.executors:
            node.start(wait=False)
        for node in self.executors:
            node.wait_ready()
        ids = {n.node_id for n in self.executors}
        wait_until("every executor to link to the submitter", lambda: self.submitter.connected() >= ids, 120)
        self.report.seconds["start"] = round(time.monotonic() - t0, 1)

    def submit(self, count: int) -> None:
        """Submit up to `count` more jobs of the sweep, if the submitter is up (else at a later step)."""
        if not (self.submitter.running() and self.submitter.ready()):
            return
        for _ in range(count):
            if len(self.jobs) >= self.cfg.jobs:
                return
            seed = len(self.jobs)
            body = {
                "module": str(MONTECARLO),
                "args": [str(seed), str(self.cfg.samples)],
                "limits": {"fuel": 5_000_000_000, "timeout": 60},
            }
            self.jobs.append(self.submitter.post("/v1/jobs", body)["job_id"])

    def run(self) -> ChaosReport:
        """Start, the sweep under the fault schedule, the settling, the check; returns the report."""
        self.start()
        t0 = time.monotonic()
        per_step = -(-self.cfg.jobs // max(1, self.cfg.faults))
        for _ in range(self.cfg.faults):
            self.submit(per_step)
            self.fault()
            time.sleep(self.rng.uniform(*self.cfg.gap))
        self.report.seconds["faults"] = round(time.monotonic() - t0, 1)
        self.submitter.wait_ready()
        self.submit(self.cfg.jobs)
        self.settle()
        self.check()
        return self.report

    def fault(self) -> None:
        kind = self.rng.choices(["kill", "link", "partition"], weights=self.cfg.weights)[0]
        held = self.rng.uniform(*self.cfg.hold)
        at = time.time()
        if kind == "kill":
            if self.rng.random() < self.cfg.kill_submitter:
                node = self.submitter
            else:
                node = self.rng.choice(self.executors)
            target = node.name
            cut = [] if node is self.submitter else [node.name]
            node.kill()
            time.sleep(held)
            node.start(wait=False)  # (it comes up while the schedule goes on)
            if node is self.submitter:
                self.report.submitter_starts.append(time.time())
        elif kind == "link":
            where: list[Host | Router] = [n.host for n in self.nodes] + list(self.routers)
            pulled = self.rng.choice(where)
            target = pulled.name
            cut = self._behind(pulled)
            self.topo.switch_sh("ip", "link", "set", pulled.port, "down")
            time.sleep(held)
            self.topo.switch_sh("ip", "link", "set", pulled.port, "up")
        else:
            # the public hosts and the homes (by their routers), split in two random halves
            parts: list[Host | Router] = [n.host for n in self.nodes if n.host.gateway is None]
            parts += self.routers
            self.rng.shuffle(parts)
            half = self.rng.randint(1, len(parts) - 1)
            one, two = parts[:half], parts[half:]
            target = "|".join(",".join(p.name for p in g) for g in (one, two))
            away = two if self.submitter.host in one else one
            cut = [n for p in away for n in self._behind(p)]
            self.topo.partition(one, two)
            time.sleep(held)
            self.topo.heal()
        self.report.faults.append(Fault(kind, target, at, round(held, 2), cut, time.time()))

    def _behind(self, part: Host | Router) -> list[str]:
        """The executors a cut at `part` separates from the submitter (all of them at its own host)."""
        if part is self.submitter.host:
            return [n.name for n in self.executors]
        if isinstance(part, Router):
            return [n.name for n in self.executors if n.host.gateway == part.lan_ip]
        return [n.name for n in self.executors if n.host is part]

    def settle(self) -> None:
        """Every fault undone; wait for every job to end and every counted receipt to be acknowledged."""
        t0 = time.monotonic()
        self.topo.heal()
        for node in self.nodes:
            if not node.running():
                node.start(wait=False)
        for node in self.nodes:
            node.wait_ready()

        def ended() -> bool:
            docs = self.submitter.try_get("/v1/jobs?role=submitter") or []
            states = {d["job_id"]: d["state"] for d in docs}
            return all(states.get(j) in TERMINAL for j in self.jobs)

        try:
            wait_until("every job to end", ended, self.cfg.settle, every=1.0)
        except AssertionError as e:
            self.log(str(e))
        try:
            wait_until("every counted receipt to be acknowledged", lambda: not self._unacked(), 60, every=1.0)
        except AssertionError as e:
            self.log(str(e))
        self.report.seconds["settle"] = round(time.monotonic() - t0, 1)

    # --- reading the stores ---

    def _submitted(self) -> dict[str, tuple[str, str | None]]:
        rows = self.submitter.store_rows("SELECT job_id, state, reason FROM jobs WHERE role = 'submitter'")
        return {bytes(j).hex(): (s, r) for j, s, r in rows}

    def _counted(self) -> dict[str, list[bytes]]:
        """Receipts the submitter verified and counts (acknowledged), by job."""
        rows = self.submitter.store_rows("SELECT job_id, digest FROM receipts WHERE delivered IS NOT NULL")
        out: dict[str, list[bytes]] = defaultdict(list)
        for job, digest in rows:
            out[bytes(job).hex()].append(bytes(digest))
        return out

    def _signed(self) -> list[tuple[NetNode, str, bytes, bool, UsageReceipt]]:
        """Every receipt an executor signed for the sweep: (executor, job, digest, acknowledged, receipt)."""
        wanted = set(self.jobs)
        out = []
        for node in self.executors:
            rows = node.store_rows(
                "SELECT r.job_id, r.digest, r.delivered, e.raw FROM receipts r "
                "JOIN envelopes e ON e.message_id = r.message_id WHERE r.executor = ?",
                node.node_id,
            )
            for job, digest, delivered, raw in rows:
                if bytes(job).hex() in wanted:
                    receipt = verify(bytes(raw), UsageReceipt).message
                    out.append((node, bytes(job).hex(), bytes(digest), delivered is not None, receipt))
        return out

    def _unacked(self) -> list[str]:
        counted = {d for ds in self._counted().values() for d in ds}
        return [f"{n.name}:{j[:12]}" for n, j, d, acked, _ in self._signed() if d in counted and not acked]

    def check(self) -> None:
        t0 = time.monotonic()
        r = self.report
        submitted = self._submitted()
        counted = self._counted()
        signed = self._signed()
        assigns: dict[tuple[bytes, bytes], tuple[Assignment, float]] = {}  # by (assignment, job)
        for raw, received in self.submitter.store_rows(
            "SELECT raw, received FROM envelopes WHERE kind IN ('assign', 'assigns')"
        ):
            for a in assignments(verify(bytes(raw))):
                assigns[a.key] = (a, received)
        r.states = dict(Counter(submitted.get(j, ("missing", None))[0] for j in self.jobs))
        for job in self.jobs:
            state, reason = submitted.get(job, ("missing", None))
            if state not in TERMINAL:
                r.lost.append(f"{job[:12]} {state}")
            elif state == "done" and len(counted.get(job, [])) != 1:
                r.lost.append(f"{job[:12]} done with {len(counted.get(job, []))} counted receipts")
            elif state != "done" and not reason:
                r.lost.append(f"{job[:12]} {state} without a reason")
        runs: dict[str, list[tuple[NetNode, UsageReceipt]]] = defaultdict(list)
        for node, job, _, _, receipt in signed:
            runs[job].append((node, receipt))
        r.runs = len(signed)
        r.reruns = sum(1 for v in runs.values() if len(v) > 1)
        for job, ran in runs.items():
            ran.sort(key=lambda x: x[1].finished_at)
            for (n1, first), (n2, later) in itertools.pairwise(ran):
                a1 = assigns.get((first.assignment_id.raw, first.job_id.raw))
                a2 = assigns.get((later.assignment_id.raw, later.job_id.raw))
                if a1 is None or a2 is None:
                    r.overlap.append(f"{job[:12]}: a receipt names an assignment the submitter never made")
                    continue
                assigned_later = a2[1]
                if a2[0].attempt > a1[0].attempt and assigned_later * 1000 < a1[0].lease_expires - 50:
                    r.overlap.append(f"{job[:12]}: {n2.name} assigned while {n1.name}'s lease held")
                finished = first.finished_at / 1000
                restarted = any(finished <= t <= assigned_later for t in r.submitter_starts)
                cut_off = any(
                    n1.name in f.cut and f.at <= assigned_later and f.end >= finished for f in r.faults
                )
                if finished < assigned_later and restarted and not cut_off:
                    r.rerun_after_submitter_restart.append(
                        f"{job[:12]}: done on {n1.name}, run again on {n2.name} after a submitter restart"
                    )
        counted_digests = {d for ds in counted.values() for d in ds}
        for node, job, digest, acked, _ in signed:
            if digest in counted_digests and not acked:
                r.unacknowledged.append(f"{node.name}:{job[:12]}")
            if acked and digest not in counted_digests:
                r.acks_lost.append(f"{node.name}:{job[:12]} acknowledged but not counted by the submitter")

        def audited(node: NetNode) -> str | None:
            bundle = self.tmp / f"{node.name}.bundle"
            node.export(bundle)
            done = audit(bundle)
            return None if done.returncode == 0 else f"{node.name}: {(done.stdout + done.stderr)[-400:]}"

        with ThreadPoolExecutor(len(self.nodes)) as pool:
            r.audit_failures = [f for f in pool.map(audited, self.nodes) if f is not None]
        r.seconds["check"] = round(time.monotonic() - t0, 1)
