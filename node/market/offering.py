"""The line of jobs waiting to be offered, the signed offers that take them, and the answers.

Each job's driver (submitter.py) joins the line for a round; `run` takes the waiting jobs as many to
one signed offer as fit (MAX_SET, the gossip size cap), in the scheduling policy's order (jobs at risk
first, then fair turns across the groups of jobs submitted together: policy.offer_key), paced by a
token bucket under what every node accepts from one signer, gossips it and shows it to this node's own
executor, and opens each job's round. Bids and declines for that offer land in the round they answer
(`on_answer`), where the driver waits for them. When the first of an offer's jobs is ready to take a
bid, the offer's jobs are spread across all their bidders at once (`choose`, spread.py); a job whose
spread bid is gone, or a replica lane, takes its own (rules.choose_bid).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio
from e31.protocol.envelope import VerifiedEnvelope, sign_message, sign_verified
from e31.protocol.errors import ProtocolError
from e31.protocol.gossip import message_cost
from e31.protocol.ids import Digest, NodeId
from e31.protocol.messages import MAX_SET, Award, Bid, Decline, Offer

from ..net.links import TokenBucket
from ..store.db import Store, call
from .context import MarketContext
from .policy import UNMEASURED, Task, Usage, offer_key
from .probe import probe
from .rules import BidView, choose_bid, held_bytes
from .spread import AWARD_MIN, Wanted, awards, spread
from .submitted import Jobs, Joining, Round, SubmittedJob, in_round

log = logging.getLogger("e31.submitter")

RUNS_NOTHING_KEPT = 4096
"""Nodes remembered as running no jobs (OfferLine.runs_nothing)."""

Publish = Callable[[bytes | VerifiedEnvelope[Any]], int]
"""Gossip a signed message; returns how many peers it went to."""
LocalOffer = Callable[[VerifiedEnvelope[Offer]], None]
"""Show an offer to this node's own executor."""

OFFER_RATE = 45.0
OFFER_BURST = 90.0
"""Offers gossiped per second, and at once: under what each node accepts from one signer (GossipConfig:
50 per second, burst 100), so none is dropped at the first hop. Rounds wait in line for a token, so a
sweep of thousands of jobs is offered at this pace instead of spinning."""
OFFER_BYTES = 240 * 1024
"""Manifest bytes in one offer at most: under the gossip cap of an offer (256 KiB) with room for its
envelope. A manifest alone over it is still offered, alone (gossip refuses it; this node may run it)."""
EXPIRIES_PRUNE_MIN = 4096
"""Expiries of offers signed here held before the past ones are first forgotten (no two live offers of
this node share an expiry, so none is the same message as another)."""
DECIDE_WAIT = 0.25
"""Seconds an offer waits at most for the spread of the one before it to be made and its awards sent
(a decision takes a round trip to the bidders, a few milliseconds). Sent at once, it would reach
executors whose queues still count every job they bid for in the offer before, and be declined
`busy` by all of them; sent after the awards, it finds the room the other bidders' jobs left."""
AWARD_SEND_S = 1.0
"""Seconds one award may take to go (a link whose peer does not read holds it up): past it, it is
dropped, so one stalled bidder does not hold back the others' awards and the next offers."""
AWARDS_QUEUED = 256
"""Signed awards waiting to be sent, at most (four offers' worth of bidders on a network of 64 nodes)."""
SPREADS_PRUNE_MIN = 1024
"""Offers with rounds open past which those whose rounds all ended are dropped (each is dropped with
its last round anyway; this bounds what a driver cancelled before its round began leaves behind)."""


@dataclass(eq=False)
class Spread:
    """The jobs of one offer (their rounds open with it) and, once the first took a bid, each one's."""

    members: dict[bytes, SubmittedJob]
    chosen: dict[bytes, BidView] | None = None
    decided: trio.Event = field(default_factory=trio.Event)
    """Set once its spread is made and its awards are sent (or it can no longer be made: every round
    of it ended): the next offer waits for it (a while at most: DECIDE_WAIT)."""


@dataclass(frozen=True, slots=True)
class Choice:
    """What the submitter's rules read for a job's bid: its failures, its own load, the known keys."""

    exclude: frozenset[bytes]
    load: Mapping[bytes, int]
    known: Container[bytes] = field(default_factory=frozenset)


class OfferLine:
    def __init__(
        self,
        ctx: MarketContext,
        jobs: Jobs,
        *,
        publish: Publish | None,
        local_offer: LocalOffer | None,
        notify: Callable[[bytes], None],
    ) -> None:
        self.ctx = ctx
        self.jobs = jobs
        self.publish = publish
        self.local_offer = local_offer
        self.notify = notify
        self._offers = TokenBucket(OFFER_RATE, OFFER_BURST)
        self._offer_line = trio.Lock()
        self._joining: list[Joining] = []
        self._joined: dict[Joining, int] = {}
        """When each job in line joined it (ms): its arrival, for the order (`_in_order`)."""
        self._usage = Usage()
        """Fuel budgets offered per group of jobs submitted together: the fair share of the line."""
        self._offer_wake = trio.Event()
        self._expiries: set[int] = set()
        self._expiries_prune_at = EXPIRIES_PRUNE_MIN
        self.runs_nothing: dict[bytes, None] = {}
        """Nodes whose last answer was a `policy` decline: they run no jobs (submit-only), so no job is
        moved to them (replan.py). A bid takes a node off; RUNS_NOTHING_KEPT at most, oldest forgotten."""
        self._spreads: dict[bytes, Spread] = {}
        """The offers with rounds open, by offer id (each leaves with its last round: `forget`)."""
        self._awards_out, self._awards_in = trio.open_memory_channel[tuple[bytes, bytes] | Spread](
            AWARDS_QUEUED
        )

    @property
    def local(self) -> bool:
        """Whether offers are shown to this node's own executor (it runs its own jobs)."""
        return self.local_offer is not None and self.ctx.settings.execute_own_jobs

    def join(self, entry: Joining) -> None:
        """Put a job in line for the next offer (the offer sets `entry.done`)."""
        self._joining.append(entry)
        self._joined[entry] = self.ctx.clock()
        self._offer_wake.set()

    def leave(self, entry: Joining) -> None:
        """Take a job out of line (its driver was cancelled before an offer took it)."""
        if entry in self._joining:
            self._joining.remove(entry)
        self._joined.pop(entry, None)

    async def _gossip_tokens(self, cost: int) -> None:
        """Wait in line until `cost` tokens of the offer pace are there, and take them."""
        cost = min(cost, int(OFFER_BURST))
        async with self._offer_line:
            while True:
                if self._offers.allow(trio.current_time(), cost):
                    return
                await trio.sleep(max(0.0, cost - self._offers.tokens) / OFFER_RATE)

    async def run(self) -> None:
        """Offer the jobs waiting for a round, as many in one signed offer as fit (MAX_SET, and the
        gossip size cap). Each offer waits for its gossip tokens (OFFER_RATE, one per started 16 KiB),
        and the jobs that join meanwhile go together in the next, so a lone job goes at once and a
        sweep goes in sets. A store failure ends the market (as any store call's would)."""
        last: Spread | None = None
        while True:
            while not self._joining:
                await self._offer_wake.wait()
                self._offer_wake = trio.Event()
            if last is not None:
                with trio.move_on_after(DECIDE_WAIT):
                    await last.decided.wait()
                last = None
            taken = self._take_set()
            if not taken:
                continue
            env = self._offer_of(taken)
            if env is None:
                continue
            gossip = self.publish is not None and bool(self.ctx.connected())
            if gossip:
                await self._gossip_tokens(message_cost(len(env.raw)))
                live = [entry for entry in taken if not entry.job.finished.is_set()]
                if len(live) < len(taken):  # some ended while the offer waited for its tokens
                    for entry in taken:
                        if entry.job.finished.is_set():
                            entry.done.set()
                    taken = live
                    env = self._offer_of(taken) if taken else None
                    if env is None:
                        continue
            moving = [e for e in taken if e.to_offered is not None]
            await self.ctx.store.atomically(  # the offer, and its jobs `offered`, in one commit
                call(
                    Store.put_shared_envelope,
                    env.message_id.raw,
                    env.kind,
                    env.raw,
                    self.ctx.now_s(),
                    [e.job_id for e in taken],
                ),
                *(e.to_offered for e in moving if e.to_offered is not None),
                durable=False,  # neither the offer nor `offered` is a promise
            )
            for entry in moving:
                self.notify(entry.job_id)
            opened = trio.current_time()
            for entry in taken:
                entry.job.round = Round(env.message_id.raw, opened)
            group = self._spreads[env.message_id.raw] = Spread({e.job_id: e.job for e in taken})
            if gossip and len(taken) >= AWARD_MIN:  # (its own executor answers at once; a smaller offer
                last = group  # gets no awards: nothing to wait for)
            if len(self._spreads) >= SPREADS_PRUNE_MIN:  # a driver cancelled before its round began
                self._spreads = {o: g for o, g in self._spreads.items() if self._wanted(o, g)}
            if gossip and self.publish is not None:
                try:
                    self.publish(env)
                except ProtocolError as e:
                    gossip = False
                    log.warning("cannot gossip an offer of %d jobs: %s", len(taken), e)
            if self.local_offer is not None and self.local:
                self.local_offer(env)
            for entry in taken:
                entry.gossiped = gossip
                entry.done.set()

    def _offer_of(self, taken: list[Joining]) -> VerifiedEnvelope[Offer] | None:
        """The signed offer of the taken jobs; a job whose manifest cannot be offered is told why (its
        driver ends it) and left out. None when no job is left."""
        try:
            return self._sign_offer(taken)
        except ProtocolError:  # one job's manifest may be at fault: it alone fails, the others go
            taken[:] = [entry for entry in taken if self._signable(entry)]
        if not taken:
            return None
        try:
            return self._sign_offer(taken)
        except ProtocolError as e:  # each goes alone, but not together (never expected): none goes
            for entry in taken:
                entry.error = e
                entry.done.set()
            return None

    def _signable(self, entry: Joining) -> bool:
        """Whether the job can be offered alone; if not, its driver is told why (and ends it)."""
        try:
            self._sign_offer([entry])
        except ProtocolError as e:
            entry.error = e
            entry.done.set()
            return False
        return True

    def _in_order(self) -> list[Joining]:
        """The line in the policy's order (policy.offer_key): the jobs at risk of missing their deadline
        first, by deadline; then fair turns across groups of jobs submitted together (a lone job is
        not offered after a whole sweep), the smaller job first, then arrival."""
        now = self.ctx.clock()

        def key(entry: Joining) -> tuple[object, ...]:
            return offer_key(self._task(entry, now), now, self._usage)

        return sorted(self._joining, key=key)  # stable: equal keys keep the line's order

    def _task(self, entry: Joining, now: int) -> Task:
        m = entry.job.manifest
        group = m.created_at.to_bytes(8, "big") + m.module.root.raw[:8]  # a batch shares both
        estimate = UNMEASURED.estimate_ms(m.profile.raw, m.limits.fuel, m.limits.wall_ms)
        return Task(entry.job_id, group, m.deadline, estimate, self._joined.get(entry, now), m.limits.fuel)

    def _take_set(self) -> list[Joining]:
        """The jobs of the next offer, in the policy's order (`_in_order`): at most MAX_SET, one round
        per job (replica lanes of one job go in different offers), within OFFER_BYTES."""
        now = self.ctx.clock()
        taken: list[Joining] = []
        rest: list[Joining] = []
        ids: set[bytes] = set()
        size = 0
        slack = int(self.ctx.settings.window.max_wait * 1000)
        soon = self.ctx.clock() + slack
        low = high = 0
        for entry in self._in_order():
            if entry.job.finished.is_set():
                entry.done.set()  # its driver sees the job finished and leaves the round
                self._joined.pop(entry, None)
                continue
            # The offer expires with its shortest-lived job: a job whose offer must expire soon goes
            # only with jobs whose offers expire about as soon (not to cut the others' rounds short).
            lo, hi = (
                (entry.expires, entry.expires)
                if not taken
                else (min(low, entry.expires), max(high, entry.expires))
            )
            close = lo >= soon or hi - lo <= slack
            fits = (size + entry.job.size <= OFFER_BYTES and close) or not taken
            if len(taken) < MAX_SET and entry.job_id not in ids and fits:
                low, high = lo, hi
                taken.append(entry)
                ids.add(entry.job_id)
                size += entry.job.size
                task = self._task(entry, now)
                self._usage.charge(task.submitter, task.fuel, now)
                self._joined.pop(entry, None)
            else:
                rest.append(entry)
        self._joining = rest
        if not rest:
            self._usage.forget_below(now)
        return taken

    def _sign_offer(self, taken: list[Joining]) -> VerifiedEnvelope[Offer]:
        """One offer of the taken jobs (job id order). Its expiry is the earliest any of them allows,
        moved a millisecond earlier while a live offer signed here has it: no two offers of this node
        are the same message, however the same jobs come together again."""
        expires = min(e.expires for e in taken)
        while expires in self._expiries:
            expires -= 1
        self._expiries.add(expires)
        if len(self._expiries) >= self._expiries_prune_at:  # amortized: the live ones at least double
            now = self.ctx.clock()
            self._expiries = {x for x in self._expiries if x > now}
            self._expiries_prune_at = max(EXPIRIES_PRUNE_MIN, 2 * len(self._expiries))
        manifests = tuple(e.job.manifest for e in sorted(taken, key=lambda e: e.job_id))
        return sign_verified(Offer(self.ctx.network, expires, self.ctx.node, manifests), self.ctx.identity)

    def choose(self, job_id: bytes, job: SubmittedJob, choice: Choice) -> BidView | None:
        """The bid the job takes now from its open round: its share of the spread of its offer
        (computed once, with the bids in hand when the first of the offer's jobs is ready), or, if
        that bid is gone or the job is a replica lane, the best bid for it alone (rules.choose_bid)."""
        rnd = job.round
        if rnd is None:
            return None
        now = self.ctx.clock()
        group = self._spreads.get(rnd.offer_id)
        if group is not None and job.manifest.replicas == 1:
            if group.chosen is None:
                wanted = self._wanted(rnd.offer_id, group)
                chosen = spread(wanted, choice.load, now=now, known=choice.known)
                group.chosen = probe(wanted, chosen, choice.load, now=now, known=choice.known)
                # an offer with replica lanes gets no awards: a lane takes its own bid (choose_bid),
                # so a bidder cannot be told which of its bid's jobs it will not be given
                lanes = any(j.manifest.replicas > 1 for j in group.members.values())
                self._award({} if lanes else awards(wanted, group.chosen), group)
            bid = group.chosen.get(job_id)
            if (
                bid is not None
                and rnd.bids.get(bid.executor) is bid
                and bid.expires > now
                and bid.executor not in choice.exclude
            ):
                return bid
        return choose_bid(
            rnd.bids.values(),
            choice.load,
            now=now,
            deadline=job.manifest.deadline,
            exclude=choice.exclude,
            known=choice.known,
        )

    def _wanted(self, offer_id: bytes, group: Spread) -> list[Wanted]:
        """The offer's single jobs whose round is still open with it, with their bids."""
        return [
            Wanted(job_id, job.manifest.deadline, dict(rnd.bids), frozenset(job.rejected))
            for job_id, job in group.members.items()
            if (rnd := job.round) is not None
            and rnd.offer_id == offer_id
            and job.manifest.replicas == 1
            and not job.finished.is_set()
        ]

    def _award(self, told: dict[bytes, tuple[bytes, list[bytes]]], group: Spread) -> None:
        """Sign an `award` for each bid that named jobs it was not given (spread.awards), for
        `send_awards` to send, and the group after them (its `decided` is set once they are sent).
        Advisory: an award that finds the line full is dropped (its executor's timers free that room
        a little later)."""
        for bid_id, (executor, won) in told.items():
            award = Award(
                self.ctx.network, Digest(bid_id), self.ctx.node, NodeId(executor), tuple(map(Digest, won))
            )
            try:
                self._awards_out.send_nowait((executor, sign_message(award, self.ctx.identity)))
            except trio.WouldBlock:
                log.debug("award for bid %s dropped: %d wait to be sent", bid_id.hex()[:12], AWARDS_QUEUED)
        try:
            self._awards_out.send_nowait(group)
        except trio.WouldBlock:
            group.decided.set()

    async def send_awards(self) -> None:
        """Send the awards `_award` signed, in order, each to its bidder; a group's `decided` is set
        once the awards queued before it are sent."""
        async for item in self._awards_in:
            if isinstance(item, Spread):
                item.decided.set()
                continue
            with trio.move_on_after(AWARD_SEND_S) as late:
                await self.ctx.send_to(*item)
            if late.cancelled_caught:
                log.debug("an award to %s took over %g s to send: dropped", item[0].hex()[:12], AWARD_SEND_S)

    def forget(self, offer_id: bytes, job_id: bytes) -> None:
        """The job's round with that offer is over: the offer's spread leaves with its last round."""
        group = self._spreads.get(offer_id)
        if group is not None:
            group.members.pop(job_id, None)
            if not group.members:
                del self._spreads[offer_id]
                group.decided.set()  # (no spread was made: no bid came, say)

    def on_answer(self, env: VerifiedEnvelope[Any]) -> None:
        """A bid or decline: each job it names whose current round is that offer's hears from it."""
        msg: Bid | Decline = env.message
        executor = msg.executor.raw
        offer_id = msg.offer_id.raw
        if isinstance(msg, Bid):
            self.runs_nothing.pop(executor, None)
            live = msg.expires > self.ctx.clock()
            for item in msg.items:
                holder = in_round(self.jobs, item.job_id.raw, offer_id)
                if holder is None or (rnd := holder.round) is None:
                    continue
                had_bids = bool(rnd.bids)
                rnd.answered.add(executor)
                if live:
                    rnd.bids[executor] = BidView(
                        env.message_id.raw,
                        executor,
                        item.expected_start,
                        item.expected_finish,
                        msg.expires,
                        held_bytes(holder.manifest, msg.held),
                    )
                    rnd.raw[env.message_id.raw] = env.raw
                rnd.heard(had_bids)
            return
        why = f"{msg.reason}: {msg.text}" if msg.text else msg.reason
        if msg.reason == "policy":
            self.runs_nothing[executor] = None
            while len(self.runs_nothing) > RUNS_NOTHING_KEPT:
                del self.runs_nothing[next(iter(self.runs_nothing))]
        for job_id in msg.job_ids:
            holder = in_round(self.jobs, job_id.raw, offer_id)
            if holder is None or (rnd := holder.round) is None:
                continue
            rnd.answered.add(executor)
            if holder.declined is None or msg.reason != "policy":  # a node that runs nothing says least
                holder.declined = why
            log.debug("job %s: %s declined (%s)", job_id.hex()[:12], msg.executor, why)
            rnd.heard(bool(rnd.bids))
