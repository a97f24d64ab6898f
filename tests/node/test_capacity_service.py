"""The capacity service over a real scheduler with a synthetic owner (autojump clock): suspend and
resume with only-when-idle, what bids count on, signed advertisements, the peers' table, and the
deadline check while suspended."""

from __future__ import annotations

from pathlib import Path

import nacl.signing
import pytest
import trio
import trio.testing
from e31.node.host.capacity import CapacityPolicy, State, SyntheticOwnerLoad, sampler_from_env
from e31.node.market.adverts import ADVERT_TTL_MS, CapacityService, LateJobs
from e31.node.market.scheduler import Scheduler
from e31.protocol.envelope import sign_message, verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.messages import Capacity as CapacityAd

NET = "capacity-test"
PROFILE = bytes(range(32))
T0 = 1_900_000_000_000


class Pool:
    def start_job(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("no job runs in these tests")

    def close(self, timeout: float = 10.0) -> None:
        pass


class Late:
    def __init__(self) -> None:
        self.calls = 0

    async def give_back_late(self) -> int:
        self.calls += 1
        return 0


def service(
    tmp_path: Path, *, only_when_idle: bool, published: list[bytes], late: LateJobs | None = None
) -> tuple[CapacityService, Path]:
    load = tmp_path / "load"
    load.write_text("0")
    policy = CapacityPolicy(
        cores=2, memory=1 << 30, only_when_idle=only_when_idle, idle_seconds=0.0, raise_after=0.0
    )
    svc = CapacityService(
        identity=nacl.signing.SigningKey(bytes(32)),
        network=NET,
        policy=policy,
        scheduler=Scheduler(2, Pool),
        profile=PROFILE,
        interval=1.0,
        worker_pids=list,
        sampler=SyntheticOwnerLoad(load, cpus=2),
        clock=lambda: T0 + int(trio.current_time() * 1000),
        publish=published.append,
        late=late,
    )
    return svc, load


def ads(published: list[bytes]) -> list[CapacityAd]:
    return [verify(raw, CapacityAd).message for raw in published]


async def test_only_when_idle_suspends_while_the_owner_works(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    published: list[bytes] = []
    late = Late()
    svc, load = service(tmp_path, only_when_idle=True, published=published, late=late)
    await nursery.start(svc.run)
    assert svc.scheduler.suspended and svc.for_bids == (0, 0)  # until the owner is seen away
    await trio.sleep(1.5)
    assert svc.current.state is State.AVAILABLE and not svc.scheduler.suspended
    assert svc.for_bids == (2, 1 << 30)
    load.write_text("2")
    await trio.sleep(1.0)
    assert svc.current.state is State.OWNER_BUSY and svc.scheduler.suspended and svc.offered == (0, 0)
    calls = late.calls
    await trio.sleep(3.0)
    assert late.calls > calls  # late jobs are looked for while suspended
    load.write_text("0")
    await trio.sleep(1.0)
    assert not svc.scheduler.suspended
    await trio.sleep(2.0)  # the advertisement follows the change
    cores = [ad.cores for ad in ads(published)]
    assert cores[0] == 0 and 2 in cores and cores[-1] == 2
    assert cores.index(2) < len(cores) - 1 - cores[::-1].index(0)  # 2, then 0 again, then 2
    ad = ads(published)[-1]
    assert (ad.network, ad.node, ad.profiles) == (NET, svc.node, (Digest(PROFILE),))
    assert svc.clock() < ad.expires <= svc.clock() + ADVERT_TTL_MS
    doc = svc.to_json()
    assert (doc["state"], doc["suspended"], doc["only_when_idle"]) == ("available", False, True)


async def test_without_only_when_idle_the_owner_lowers_bids_but_never_to_a_refusal(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    published: list[bytes] = []
    svc, load = service(tmp_path, only_when_idle=False, published=published)
    await nursery.start(svc.run)
    assert not svc.scheduler.suspended and svc.for_bids == (2, 1 << 30)
    load.write_text("2")
    await trio.sleep(2.5)
    assert svc.offered == (0, 1 << 30) and svc.for_bids == (1, 1 << 30)
    assert not svc.scheduler.suspended
    assert ads(published)[-1].cores == 0


async def test_the_peer_table_keeps_the_latest_unexpired_advertisement(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    svc, _ = service(tmp_path, only_when_idle=False, published=[])
    send, receive = trio.open_memory_channel[object](10)
    nursery.start_soon(svc.listen, receive)
    peer = nacl.signing.SigningKey(bytes([1]) * 32)
    peer_id = NodeId(bytes(peer.verify_key))

    def ad(cores: int, expires: int, network: str = NET) -> object:
        msg = CapacityAd(network, peer_id, expires, cores, 1 << 30, (Digest(PROFILE),), 3, 10**9)
        return verify(sign_message(msg, peer))

    now = svc.clock()
    for env in (ad(4, now + 10_000), ad(1, now + 5_000), ad(9, now + 20_000, "other-net")):
        await send.send(env)
    await trio.sleep(0.1)
    assert svc.peer_table() == {
        str(peer_id): {
            "cores": 4,
            "memory_bytes": 1 << 30,
            "queue_length": 3,
            "fuel_rate": 10**9,
            "expires": now + 10_000,
        }
    }
    await trio.sleep(11)
    assert svc.peer_table() == {}


def test_the_synthetic_owner_is_used_only_when_asked(tmp_path: Path) -> None:
    from e31.node.host.capacity import read_sample

    assert sampler_from_env({}) is read_sample
    chosen = sampler_from_env({"E31_TEST_OWNER_LOAD_FILE": str(tmp_path / "missing")})
    assert isinstance(chosen, SyntheticOwnerLoad) and chosen.load() == 0.0
    (tmp_path / "bad").write_text("lots")
    assert SyntheticOwnerLoad(tmp_path / "bad").load() == 0.0
    (tmp_path / "big").write_text("99")
    assert SyntheticOwnerLoad(tmp_path / "big", cpus=4).load() == 4.0


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_a_synthetic_sample_gives_the_owner_the_load_written(tmp_path: Path, value: str) -> None:
    from e31.node.host.capacity import owner_cpu

    (tmp_path / "load").write_text(value)
    sampler = SyntheticOwnerLoad(tmp_path / "load", cpus=2)
    first, second = sampler(), sampler()
    assert owner_cpu(first, second) == pytest.approx(float(value))
