"""An executor's answers to offers: a signed `bid` for the jobs it can finish in time, a `decline` per
reason for the others, and the live bids kept until assigned or lapsed.

An offer (from gossip, or from this node's own submitter) gets its answers sent straight to the
submitter: each job is checked alone (rules.plan_bid: profile, memory, room in the queue, a finish by
its deadline on an idle core), then the offer's jobs are planned together with every job this node has
promised (policy.admit: those queued, fetching or running, and those of its live bids not yet
assigned); a job that would finish late, or make a promised job late, is declined `deadline`. A bid
item's start and finish are the plan's.
When the submitter's `award` for a bid comes (it spread the offer: spread.awards), only the jobs it
names still count as promised. Without one, a bid's jobs that its submitter has not assigned
CHOSEN_GRACE_MS after it assigned the first of them count no more as promised (they went to other
bidders: the submitter spreads an offer's jobs at once, spread.py), nor do those of a bid none of
whose jobs was assigned UNCHOSEN_MS after it was made (the submitter chose other bidders when its bid
window closed). Either way a late assignment of one is still taken while the bid lives. An offer gets
bids for at most as many jobs as the queue has room for (`max_queue_per_core`, counting the jobs
still promised); the rest are declined `busy`.
A node whose last bids to a submitter won nothing answers that submitter's next offers with one
unplanned `busy` decline each, and bids again on every few (standing.py: a probe at least every
SKIP_MAX offers or PROBE_MS); a node with a core free always bids. The jobs still promised by live
bids (`_counted`) are found once per offer, from the bids that may still count (`_counting`), not by
a walk over every job of every live bid.
A bid names the blobs of its jobs this node holds already (`held`: the submitter prefers such a bid
when all else is equal), and its finish counts the time to fetch the others (fetch_estimate.py), so a
node holding a job's large blobs bids an earlier finish. The offer is remembered under the bid's id
until the bid expires, so an `assign` naming the bid can be matched to the exact manifest (`live`,
`assigned`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from e31.protocol.envelope import VerifiedEnvelope, check_fresh, sign_verified
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest
from e31.protocol.jobs import JobManifest
from e31.protocol.messages import MAX_HELD, REASON_TEXT_MAX, Award, Bid, BidItem, Decline, Offer

from ..store.db import Store
from .context import MarketContext
from .fetch_estimate import FetchRate, fetch_shares
from .policy import Admitted, Task, admit
from .rules import BidPlan, DeclinePlan, ExecutorView, OfferView, plan_bid
from .scheduler import Scheduler
from .standing import Standing

log = logging.getLogger("e31.executor")

ROLE = "executor"
PROMISED_BYTES_MAX = 16 << 20
"""Bytes of offers that this node's live bids may keep (each keeps the offer it answers, decoded, for
the assignment): past it, offers are declined `busy` until bids lapse or are assigned. A set of 64 tiny
jobs is about 20 KiB, so this is hundreds of open bids; it bounds what a signer gossiping large offers
that it never assigns can make every executor hold."""
CHOSEN_GRACE_MS = 250
"""How long after a bid's first assignment its other jobs still count as promised here: a submitter
assigns an offer's jobs all at once, when its bid window closes; those it gave to other nodes would
otherwise hold this node's queue (`busy`, `deadline`) until the bid lapses."""
UNCHOSEN_MS = 1500
"""How long a bid none of whose jobs has been assigned still counts as promised here: a submitter
chooses among an offer's bids when its bid window closes (every expected bidder answered, or at most
WindowSettings.window, 1 s, after the offer); a bid not chosen by then held this node's queue until it
lapsed (bid_ttl_ms, 30 s), declining later offers `busy` while idle."""
SUBMIT_ONLY_TEXT = "this node runs no jobs (cores = 0: it only submits)"
LOSING_TEXT = "this node's last {} bid(s) to this submitter won no job: it bids on some of its offers"
ANSWERED_PRUNE_MIN = 1024
"""Answered offers held before the expired ones are first forgotten (an expired offer is refused anyway)."""


class BidCapacity(Protocol):
    """What this node offers now (adverts.CapacityService)."""

    @property
    def for_bids(self) -> tuple[int, int]:
        """(cores, memory) bids are made with."""
        ...


@dataclass(slots=True)
class Promise:
    """A live bid of this node: the offer it answers and the jobs of it the bid names (each leaves
    when it is assigned: one assignment per job of a bid)."""

    offer: VerifiedEnvelope[Offer]
    bid_expires: int
    jobs: dict[bytes, JobManifest]
    made: int
    """When the bid was made (ms): UNCHOSEN_MS later, unassigned, its jobs count no more."""
    awarded: frozenset[bytes] | None = None
    """The jobs its submitter's `award` said it will assign here (None: no award came): they count
    until assigned or the bid lapses, the others no more."""
    decided: bool | None = None
    """What `Bids.standing` was told of it: it won some job (True), none (False), nothing yet (None)."""


class Bids:
    def __init__(
        self,
        ctx: MarketContext,
        *,
        scheduler: Scheduler,
        profile: bytes,
        memory_bytes: int,
        capacity: BidCapacity | None,
        held_tasks: Callable[[], list[Task]] = list,
        fetch_rate: FetchRate | None = None,
    ) -> None:
        self.ctx = ctx
        self.fetch_rate = fetch_rate or FetchRate()
        """The rate fetches are planned at (the blob transfer's, measured)."""
        self.held_tasks = held_tasks
        """The jobs assigned here and not yet ended, as the policy sees them (the executor's)."""
        self.scheduler = scheduler
        self.profile = profile
        self.memory_bytes = memory_bytes
        self.capacity = capacity
        """What this node offers now; None: the configured ceiling."""
        self._promises: dict[bytes, Promise] = {}
        self._promised_bytes = 0
        """The offers' bytes the live bids keep (at most PROMISED_BYTES_MAX)."""
        self._chosen_at: dict[bytes, int] = {}
        """When each live bid's first assignment came (ms): CHOSEN_GRACE_MS later its rest lapses."""
        self._answered: dict[bytes, int] = {}
        """Offers (message id) answered, with their expiry: an offer heard again is not answered twice."""
        self._answered_prune_at = ANSWERED_PRUNE_MIN
        self._counting: dict[bytes, None] = {}
        """The live bids whose jobs may still count as promised (`_counted` drops the others)."""
        self.standing = Standing()
        """How this node's bids to each submitter fared lately: whether its next offer gets a bid."""

    def first_hearing(self, env: VerifiedEnvelope[Offer]) -> bool:
        """Whether the offer is new here (then it is remembered as answered, and is to be `answer`ed)."""
        if env.message_id.raw in self._answered:
            return False
        self._answered[env.message_id.raw] = env.message.expires
        if len(self._answered) >= self._answered_prune_at:  # amortized: the live set at least doubles
            now = self.ctx.clock()
            self._answered = {o: exp for o, exp in self._answered.items() if exp > now}
            self._answered_prune_at = max(ANSWERED_PRUNE_MIN, 2 * len(self._answered))
        return True

    def live(self, bid_id: bytes) -> Promise | None:
        """The live bid of ours with that id, if any (only a live bid can be assigned)."""
        promise = self._promises.get(bid_id)
        if promise is not None and promise.bid_expires <= self.ctx.clock():
            return None
        return promise

    def award(self, env: VerifiedEnvelope[Award]) -> bool:
        """The submitter's choice for one of our live bids: only the jobs it names still count as
        promised (until assigned, or the bid lapses). Ignored (False) unless the bid is ours, live, and
        answers an offer of the award's signer; a second award for a bid replaces the first."""
        msg = env.message
        promise = self.live(msg.bid_id.raw)
        if (
            promise is None
            or msg.executor != self.ctx.node
            or promise.offer.message.submitter != msg.submitter
            or msg.network != self.ctx.network
        ):
            return False
        promise.awarded = frozenset(j.raw for j in msg.job_ids)
        self._counting[msg.bid_id.raw] = None  # its named jobs count again, whatever its timers said
        self._decide(promise, bool(promise.awarded))
        return True

    def assigned(self, bid_id: bytes, promise: Promise, job_id: bytes) -> None:
        """A job of the bid was assigned (and stored): the bid keeps its other jobs, or goes."""
        promise.jobs.pop(job_id, None)
        self._chosen_at.setdefault(bid_id, self.ctx.clock())
        self._decide(promise, True)
        if not promise.jobs and self._promises.get(bid_id) is promise:
            self._drop_promise(bid_id)  # (its bid may have lapsed and gone meanwhile)

    async def answer(self, env: VerifiedEnvelope[Offer]) -> None:
        """Answer an offer with one `bid` for the jobs this node can finish in time (the offer planned
        once with every job promised here: policy.admit) and a `decline` per reason for the others."""
        now = self.ctx.clock()
        try:
            check_fresh(env, now, network=self.ctx.network)
        except ProtocolError:
            return
        offer = env.message
        if self.scheduler.workers == 0:  # a submit-only node can never take a job: no plan, no store call
            await self._decline_all(env, now, "policy", SUBMIT_ONLY_TEXT)
            return
        counted = self._counted(now)
        if not self._worth_bidding(offer.submitter.raw, now, len(counted)):
            await self._decline_all(
                env, now, "busy", LOSING_TEXT.format(self.standing.lost(offer.submitter.raw))
            )
            return
        held = await self.ctx.store.run(Store.jobs_held, [m.job_id.raw for m in offer.manifests], ROLE)
        cores, memory = self.scheduler.workers, self.memory_bytes
        if self.capacity is not None:
            offered_cores, offered_memory = self.capacity.for_bids
            cores, memory = min(cores, offered_cores), min(memory, offered_memory)
        # plan_bid's own deadline check sees the job alone on an idle core at the bare rate: admission
        # below plans it with every job promised here (policy.admit)
        me = ExecutorView(
            self.profile,
            0 if self.scheduler.suspended else cores,
            memory,
            0,
            self.scheduler.queue_length + len(counted),
            cores * self.ctx.settings.max_queue_per_core,
            self.scheduler.fuel_rate,
        )
        items: list[BidItem] = []
        manifests: dict[bytes, JobManifest] = {}
        bid_expires = None
        declined: dict[str, tuple[list[Digest], str, int]] = {}
        candidates: dict[bytes, tuple[JobManifest, BidPlan]] = {}
        self._forget_old_promises(now)
        room = self._promised_bytes + len(env.raw) <= PROMISED_BYTES_MAX
        reserved = len(env.raw) if room else 0  # taken now: answers to other offers run meanwhile
        self._promised_bytes += reserved
        full = DeclinePlan(
            "busy", "this node holds as many open bids as it keeps", now + self.ctx.settings.bid_ttl_ms
        )
        # plan_bid's answer depends on the job's view and on whether the queue has room: the jobs of a
        # sweep share one view, so it is asked once per (view, room), not once per job
        plans: dict[tuple[tuple[bytes, int, int, int, int], bool], BidPlan | DeclinePlan] = {}
        queued = me.queue_length
        for manifest in offer.manifests:
            job_id = manifest.job_id
            if job_id.raw in held:
                continue
            limits = manifest.limits
            seen = (manifest.profile.raw, limits.fuel, limits.memory_bytes, limits.wall_ms, manifest.deadline)
            asked = (seen, queued < me.max_queue)
            plan = plans.get(asked) if room else full
            if plan is None:  # every live bid keeps its offer: their memory is bounded (PROMISED_BYTES_MAX)
                view = OfferView(*seen, offer.expires)
                plan = plans[asked] = plan_bid(
                    view, replace(me, queue_length=queued), now, bid_ttl_ms=self.ctx.settings.bid_ttl_ms
                )
            if isinstance(plan, BidPlan):  # each job bid for takes a place in the queue
                queued += 1
            if isinstance(plan, DeclinePlan):
                ids, text, expires = declined.get(plan.reason, ([], plan.text, plan.expires))
                ids.append(job_id)
                # one text for all: the first job's, unless another job's differs (then the code says it)
                declined[plan.reason] = (ids, text if text == plan.text else "", min(expires, plan.expires))
                continue
            candidates[job_id.raw] = (manifest, plan)
        admitted = self._admit(now, cores, [m for m, _ in candidates.values()], counted)
        for key, (manifest, plan) in candidates.items():
            job_id = manifest.job_id
            if key not in admitted.accepted:
                # one text for the offer (the jobs' lateness differs): what they would wait behind
                text = f"it cannot finish by its deadline behind the {admitted.promised} job(s) promised here"
                ids, first, expires = declined.get("deadline", ([], text, plan.expires))
                ids.append(job_id)
                declined["deadline"] = (ids, first if first == text else "", min(expires, plan.expires))
                continue
            start, finish = admitted.accepted[key]
            items.append(BidItem(job_id, start, finish))
            manifests[key] = manifest
            # the latest any item allows: a job near its deadline does not cut the others' bids short
            # (the submitter assigns no job after its deadline, whatever the bid's expiry)
            bid_expires = plan.expires if bid_expires is None else max(bid_expires, plan.expires)
        for reason, (ids, text, expires) in list(declined.items()):  # in the offer's (job id) order
            declined[reason] = (sorted(ids, key=lambda d: d.raw), text, expires)
        answers: list[Bid | Decline] = [
            Decline(self.ctx.network, tuple(ids), env.message_id, self.ctx.node, expires, reason, clip(text))
            for reason, (ids, text, expires) in declined.items()
        ]
        if bid_expires is not None:
            held_blobs = self._held_blobs(manifests.values())
            answers.append(
                Bid(self.ctx.network, env.message_id, self.ctx.node, bid_expires, tuple(items), held_blobs)
            )
        else:
            self._promised_bytes -= reserved  # no bid keeps this offer
        for answer in answers:  # bid items and declined ids are in the offer's (job id) order already
            signed = sign_verified(answer, self.ctx.identity)
            if isinstance(answer, Bid):
                self._promises[signed.message_id.raw] = Promise(env, answer.expires, manifests, now)
                self._counting[signed.message_id.raw] = None
                self.standing.bid(offer.submitter.raw, now)
            await self.ctx.send_to(offer.submitter.raw, signed.raw)

    def _held_blobs(self, manifests: Iterable[JobManifest]) -> tuple[Digest, ...]:
        """The roots of the bid's jobs' blobs this node holds already (a stat each: the blob store's
        `has`), the largest first when there are more than MAX_HELD, in the wire's order."""
        refs = {
            r.root.raw: r for m in manifests for r in (m.module, *(f.blob for f in m.inputs), m.stdin) if r
        }
        held = sorted((r for r in refs.values() if self.ctx.blobs.has(r.root.raw)), key=lambda r: -r.size)
        return tuple(sorted((r.root for r in held[:MAX_HELD]), key=lambda d: d.raw))

    async def _decline_all(self, env: VerifiedEnvelope[Offer], now: int, reason: str, text: str) -> None:
        """Answer the offer with one decline of all its jobs, unplanned: this node's last bids to its
        submitter won nothing (standing.py: `busy`), or it runs no jobs at all (`policy`). No store
        call, no plan, no bid to keep."""
        offer = env.message
        job_ids = tuple(sorted((m.job_id for m in offer.manifests), key=lambda d: d.raw))
        expires = now + self.ctx.settings.bid_ttl_ms
        decline = Decline(
            self.ctx.network, job_ids, env.message_id, self.ctx.node, expires, reason, clip(text)
        )
        await self.ctx.send_to(offer.submitter.raw, sign_verified(decline, self.ctx.identity).raw)

    def _worth_bidding(self, submitter: bytes, now: int, promised: int) -> bool:
        """Whether to plan a bid for the submitter's offer (standing.py); always while a core is free
        here (fewer jobs queued, running and promised than cores), and on a suspended node (its own
        declines say why)."""
        cores = self.scheduler.workers
        if self.scheduler.suspended or self.scheduler.queue_length + promised < cores:
            return True
        return self.standing.worth_bidding(submitter, now)

    def _decide(self, promise: Promise, won: bool) -> None:
        """Tell `standing` how the bid fared: a loss once, before anything else is known of it; a win
        once (after a loss told, say an assignment after the award that named nothing, too)."""
        if promise.decided is True or (promise.decided is False and not won):
            return
        self.standing.decided(promise.offer.message.submitter.raw, won)
        promise.decided = won

    def _admit(
        self, now: int, cores: int, manifests: list[JobManifest], counted: list[JobManifest]
    ) -> Admitted:
        """Plan the offered jobs, each with its share of fetching the blobs this node lacks
        (fetch_estimate.py), with every job promised here (policy.admit): those queued or held, and
        those named by live bids not yet assigned (a bid is a promise until it lapses)."""
        if not manifests:
            return Admitted({}, {})
        slots = sorted(self.scheduler.slots(now), key=lambda s: s.free_at)[: max(0, cores)]
        shares = fetch_shares(manifests, self.ctx.blobs.has, self.fetch_rate, cores)  # as with_fetches
        offered = [self.task(m, now, shares.get(m.job_id.raw, 0)) for m in manifests]
        keys = {t.key for t in offered}  # a job offered again replaces its earlier bid's promise
        bid_tasks = [self.task(m, now) for m in counted if m.deadline > now]
        promised = {t.key: t for t in (*bid_tasks, *self.held_tasks()) if t.key not in keys}
        return admit(slots, list(promised.values()), offered, now)

    def task(self, manifest: JobManifest, now: int, fetch_ms: int = 0) -> Task:
        """The job as the policy sees it, estimated at this node's calibrated rate and margin, for the
        fuel its module's runs here use (history.py) when it has run here often enough (plus
        `fetch_ms`, its share of fetching the blobs this node lacks)."""
        lim = manifest.limits
        module = manifest.module.root.raw
        estimate = self.scheduler.estimate_ms(manifest.profile.raw, lim.fuel, lim.wall_ms, module) + fetch_ms
        return Task(manifest.job_id.raw, manifest.submitter.raw, manifest.deadline, estimate, now, lim.fuel)

    def _counted(self, now: int) -> list[JobManifest]:
        """The jobs of live bids not yet assigned that still count as promised: those an `award` named;
        with no award, all of a bid's jobs for UNCHOSEN_MS after it was
        made while none is assigned, and for CHOSEN_GRACE_MS after its first assignment (the
        submitter's choice for that offer is made).

        Only the bids in `_counting` are looked at, and a bid whose jobs count no more leaves it (an
        award puts it back): an offer costs the bids still open, not every bid of the last bid_ttl_ms.
        A bid that lapses unchosen, with no award, is told to `standing` as lost."""
        chosen, promises, counting = self._chosen_at, self._promises, self._counting
        counted: list[JobManifest] = []
        for bid_id in list(counting):
            p = promises.get(bid_id)
            if p is None or p.bid_expires <= now:
                del counting[bid_id]
            elif p.awarded is not None:
                named = [p.jobs[key] for key in p.awarded if key in p.jobs]
                if named:
                    counted += named
                else:
                    del counting[bid_id]
            elif bid_id in chosen:
                if now - chosen[bid_id] < CHOSEN_GRACE_MS:
                    counted += p.jobs.values()
                else:
                    del counting[bid_id]
            elif now - p.made < UNCHOSEN_MS:
                counted += p.jobs.values()
            else:
                del counting[bid_id]
                self._decide(p, False)
        return counted

    def _bid_tasks(self, now: int) -> list[Task]:
        return [self.task(m, now) for m in self._counted(now) if m.deadline > now]

    def _promised_jobs(self, now: int) -> int:
        """Jobs named by live bids, not yet assigned, and still counted (`_counted`)."""
        return len(self._counted(now))

    def _forget_old_promises(self, now: int) -> None:
        """Drop lapsed bids from the front: bids are made with one TTL (or expire earlier, with their
        jobs' deadline), so the dict, in insertion order, is nearly in expiry order, and this costs O(1)
        a bid instead of a scan of every live one. A lapsed bid kept a little longer (behind a live one,
        or after a clock step) is refused by `live` all the same."""
        promises = self._promises
        while promises:
            bid_id = next(iter(promises))
            if promises[bid_id].bid_expires > now:
                return
            self._drop_promise(bid_id)

    def _drop_promise(self, bid_id: bytes) -> None:
        promise = self._promises.pop(bid_id, None)
        self._chosen_at.pop(bid_id, None)
        self._counting.pop(bid_id, None)
        if promise is not None:
            self._promised_bytes -= len(promise.offer.raw)


def clip(text: str) -> str:
    """`text` cut to fit a decline's reason text (REASON_TEXT_MAX bytes of UTF-8)."""
    return text.encode("utf-8", "replace")[:REASON_TEXT_MAX].decode("utf-8", "ignore")
