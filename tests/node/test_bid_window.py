"""A job's bid window (submitter.py `_offer_round`, submitted.Round): the job's wait ends on the answer
that may end it, or when the window's time is up; the answers between wake nothing."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import market_nodes
import pytest
import trio
from e31.node.market.rules import WindowSettings
from e31.node.market.submitted import Round
from e31.node.store.db import Store
from e31.protocol.envelope import VerifiedEnvelope
from e31.protocol.ids import NodeId
from market_nodes import Net, RealNode, start, until, wait_state


def test_an_answer_wakes_the_wait_only_when_it_may_end_it() -> None:
    rnd = Round(b"offer", 0.0)
    rnd.heard(False)  # the job has not started to wait yet: every answer wakes it
    assert rnd.wake.is_set()
    rnd.wake = trio.Event()
    rnd.expected = frozenset({b"a", b"b", b"c"})

    rnd.answered.add(b"a")  # a decline, no bid yet: nothing changes for the wait
    rnd.heard(False)
    assert not rnd.wake.is_set()

    rnd.answered.add(b"b")  # the first bid: the wait shortens to the bid window
    rnd.bids[b"b"] = object()  # type: ignore[assignment]
    rnd.heard(False)
    assert rnd.wake.is_set()
    rnd.wake = trio.Event()

    rnd.heard(True)  # (a copy of b's answer) a second bid before the last answer: nothing new
    assert not rnd.wake.is_set()

    rnd.answered.add(b"c")  # the last one expected: the window closes
    rnd.heard(True)
    assert rnd.wake.is_set()


def test_the_last_decline_wakes_a_wait_with_no_bid() -> None:
    rnd = Round(b"offer", 0.0, expected=frozenset({b"a", b"b"}))
    rnd.answered.add(b"a")
    rnd.heard(False)
    assert not rnd.wake.is_set()
    rnd.answered.add(b"b")  # every expected bidder declined: offered again (rules.window_state)
    rnd.heard(False)
    assert rnd.wake.is_set()


class Mute:
    """A peer the submitter counts on to answer its offers, which never does."""

    def __init__(self, net: Net) -> None:
        self.id = b"\x77" * 32
        self.offers = 0
        net.handlers[self.id] = self.message
        net.offer_sinks[self.id] = self.offer

    def offer(self, env: VerifiedEnvelope[Any]) -> None:
        self.offers += 1

    async def message(self, peer: bytes, raw: bytes) -> None:
        pass


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> WindowSettings:
    """Nodes built from here on wait 30 s for a first bid: a wait that is not woken shows."""
    window = WindowSettings(window=0.3, max_wait=30.0)
    monkeypatch.setattr(market_nodes, "SETTINGS", dataclasses.replace(market_nodes.SETTINGS, window=window))
    return window


async def test_a_job_is_assigned_when_its_window_runs_out_with_a_bidder_still_silent(
    net: Net, nursery: trio.Nursery, tmp_path: Path, patient: WindowSettings
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    mute = Mute(net)
    await start(nursery, a, b)
    began = time.time()
    job_id = await a.submitter.submit(a.manifest(("3", "1000")))
    row = await wait_state(a, job_id, "done")
    (assignment,) = await a.store.run(Store.assignments_for_job, job_id)
    waited = assignment.received - began  # when the submitter stored the assignment it signed
    assert mute.offers == 1 and row.executor == str(NodeId(b.id))
    # b's bid came at once; the silent bidder held the window open for its whole time, not longer
    assert patient.window <= waited < patient.max_wait
    assert waited < 10.0  # (what a busy host adds to the 0.3 s window, far below 30 s)


async def test_a_job_that_ends_while_it_waits_for_bids_stops_waiting(
    net: Net, nursery: trio.Nursery, tmp_path: Path, patient: WindowSettings
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    mute = Mute(net)
    await start(nursery, a)
    job_id = await a.submitter.submit(a.manifest(("3", "1000")))
    job = a.submitter.jobs[job_id]
    await until(lambda: job.round is not None)
    waiting = job.round
    assert mute.offers == 1
    job.finish()  # as a late outcome of an earlier attempt ends it (outcomes.py)
    await until(lambda: job.round is not waiting, seconds=10.0)  # not the 30 s of its window
