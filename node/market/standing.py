"""How this node's bids to each submitter have fared lately, and whether its next offer is worth a bid.

Every node hears every offer, and a full bid costs its maker a plan of the offer with everything it
has promised and a signed set of items, and the submitter a larger message to check and rank. When a
node's bids to a submitter keep winning nothing (the submitter's `award` named none of the bid's jobs,
or none was assigned by the time the submitter had chosen: bidding.UNCHOSEN_MS), other bidders are the
better choice for that submitter's offers now. After `lost` such bids in a row the node answers that
submitter's next offers with one unplanned `busy` decline each (an answer all the same: the
submitter's bid window does not wait for it), and bids again on the 2^(lost-1)-th offer, at most
SKIP_MAX offers or PROBE_MS after its last bid to that submitter: a probe. A bid that wins any job
(an award naming some, or an assignment) ends the streak, and the node bids on every offer again.

So a node that cannot win stops paying for it, and a node that becomes the better choice (its
competitors fill up, its own queue empties) finds out within a few offers. A node with a free core
(no job queued or running) always bids: it never starves while idle (bidding.py checks that).

Pure: no trio, no clock read; times (ms) come in as parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

SKIP_MAX = 8
"""Offers of one submitter declined unplanned in a row at most, however many bids lost before."""
PROBE_MS = 1000
"""A node bids on a submitter's offer at least this long after its last bid to it, streak or not."""
SUBMITTERS_KEPT = 1024
"""Submitters whose streak is remembered (the one least recently bid to or decided forgotten first)."""


@dataclass(slots=True)
class Streak:
    lost: int = 0
    """Bids to this submitter that won nothing, in a row."""
    skipped: int = 0
    """Its offers answered with an unplanned decline since the last bid."""
    last_bid: int = 0
    """When the last bid to it was made (ms)."""


class Standing:
    def __init__(self, kept: int = SUBMITTERS_KEPT) -> None:
        self._streaks: dict[bytes, Streak] = {}
        self._kept = kept

    def lost(self, submitter: bytes) -> int:
        """Bids to `submitter` in a row that won nothing (0: the last that was decided won some)."""
        streak = self._streaks.get(submitter)
        return 0 if streak is None else streak.lost

    def worth_bidding(self, submitter: bytes, now: int) -> bool:
        """Whether to plan a bid on the submitter's offer heard now; False counts it as skipped."""
        streak = self._streaks.get(submitter)
        if streak is None or streak.lost == 0:
            return True
        gap = min(SKIP_MAX, 1 << min(streak.lost - 1, 16))
        if streak.skipped >= gap or now - streak.last_bid >= PROBE_MS:
            return True
        streak.skipped += 1
        return False

    def bid(self, submitter: bytes, now: int) -> None:
        """A bid to `submitter` was made now."""
        streak = self._streak(submitter)
        streak.skipped, streak.last_bid = 0, now

    def decided(self, submitter: bytes, won: bool) -> None:
        """One bid to `submitter` was decided: it won some of its jobs, or none."""
        streak = self._streak(submitter)
        streak.lost = 0 if won else streak.lost + 1

    def _streak(self, submitter: bytes) -> Streak:
        streak = self._streaks.pop(submitter, None) or Streak()
        self._streaks[submitter] = streak  # most recent last
        while len(self._streaks) > self._kept:
            del self._streaks[next(iter(self._streaks))]
        return streak
