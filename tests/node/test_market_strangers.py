"""Throwaway keys cannot take over what a node believes of the network's capacity, nor where it sends
its work: adverts and bids are weighed by the evidence behind their keys (adverts.TrackRecord,
rules.believe, rules.choose_bid)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nacl.signing
import trio
from e31.node.host.capacity import CapacityPolicy
from e31.node.market.adverts import STRANGER_ADVERTS, CapacityService, TrackRecord
from e31.node.market.scheduler import Scheduler
from e31.protocol.envelope import VerifiedEnvelope, sign_message
from e31.protocol.ids import Digest, NodeId
from e31.protocol.messages import Assign, AssignSet, Bid, BidItem
from e31.protocol.messages import Capacity as CapacityAd
from market_nodes import NETWORK, Net, RealNode, start, wait_state, wall_ms

PROFILE = bytes(range(32))
T0 = 1_900_000_000_000


class Pool:
    def start_job(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("no job runs here")

    def close(self, timeout: float = 10.0) -> None:
        pass


def capacity_service(track: TrackRecord) -> CapacityService:
    return CapacityService(
        identity=nacl.signing.SigningKey(bytes(32)),
        network=NETWORK,
        policy=CapacityPolicy(
            cores=2, memory=1 << 30, only_when_idle=False, idle_seconds=0.0, raise_after=0.0
        ),
        scheduler=Scheduler(2, Pool),
        profile=PROFILE,
        interval=1.0,
        worker_pids=list,
        sampler=lambda pids: None,  # type: ignore[arg-type,return-value]
        clock=lambda: T0,
        track=track,
    )


def advert(key: nacl.signing.SigningKey, cores: int, memory: int) -> CapacityAd:
    node = NodeId(bytes(key.verify_key))
    return CapacityAd(NETWORK, node, T0 + 60_000, cores, memory, (Digest(PROFILE),), 0, 10**9)


def test_a_thousand_fresh_keys_with_huge_adverts_do_not_take_over_the_nodes_view() -> None:
    known = [nacl.signing.SigningKey(bytes([i]) * 32) for i in (1, 2)]
    ids = [bytes(k.verify_key) for k in known]
    track = TrackRecord(lambda: T0, bootstrap=[ids[1]])  # one pinned by the operator ...
    track.verified(ids[0], 3)  # ... one that has run jobs for this node
    svc = capacity_service(track)
    for key, cores in zip(known, (8, 4), strict=True):
        assert svc.heard(advert(key, cores, 8 << 30))
    kept = [svc.heard(advert(nacl.signing.SigningKey.generate(), 0xFFFF, 1 << 50)) for _ in range(1000)]
    assert sum(kept) == STRANGER_ADVERTS  # the others are not even kept
    view = svc.believed()
    assert view.known_cores == 12 and view.strangers == STRANGER_ADVERTS
    assert view.cores <= 15 and view.stranger_cores <= view.cores // 5
    assert view.memory_bytes <= (16 << 30) * 5 // 4
    # the known keys' adverts are kept and renewed whatever the strangers send
    assert svc.heard(
        CapacityAd(NETWORK, NodeId(ids[0]), T0 + 90_000, 8, 8 << 30, (Digest(PROFILE),), 0, 10**9)
    )
    assert set(map(str, map(NodeId, ids))) <= set(svc.peer_table())


class Stranger:
    """A fresh key that bids on every offer promising to finish at once, then stays silent."""

    def __init__(self, net: Net) -> None:
        self.key = nacl.signing.SigningKey.generate()
        self.id = bytes(self.key.verify_key)
        self.net = net
        self.assigned: list[bytes] = []
        net.handlers[self.id] = self.message
        net.offer_sinks[self.id] = self.offer

    def offer(self, env: VerifiedEnvelope[Any]) -> None:
        now = wall_ms()
        items = tuple(BidItem(m.job_id, now, now + 1) for m in env.message.manifests)
        raw = sign_message(Bid(NETWORK, env.message_id, NodeId(self.id), now + 30_000, items), self.key)
        assert self.net.nursery is not None
        self.net.nursery.start_soon(self.net.sender(self.id), env.message.submitter.raw, raw)

    async def message(self, peer: bytes, raw: bytes) -> None:
        from e31.protocol.envelope import verify

        if isinstance(verify(raw).message, Assign | AssignSet):
            self.assigned.append(raw)


async def test_an_executor_with_verified_receipts_keeps_the_work_against_many_fast_strangers(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    first = await a.submitter.submit(a.manifest(("31", "1000")))
    await wait_state(a, first, "done")
    assert b.id in a.submitter.track  # B has a receipt verified here now
    strangers = [Stranger(net) for _ in range(40)]
    for n in range(3):  # one job at a time: each goes to B, never to a stranger promising more
        job_id = await a.submitter.submit(a.manifest(("32", str(1000 + n))))
        row = await wait_state(a, job_id, "done")
        assert row.executor == str(NodeId(b.id)) and row.attempt == 1
    assert not any(s.assigned for s in strangers)
