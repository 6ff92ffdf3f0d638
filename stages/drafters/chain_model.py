"""What a chain (stages/drafters/chain.py) knows of its model drafter: what it is expected to have accepted in a lane
(`ModelRates`, learnt from the rounds it drafted there) and what its drafting costs as a share of a round
(`ModelCosts`, timed by the chain itself).

Each lane's rounds are attributed to the part that drafted them (`drafted`, as the chain chooses); at the lane's
next choice (`update`) the drafts the target verified and accepted since (the lane's own counters) are counted for
that part. Only the model drafter's are kept: a per-position acceptance a (accepted drafts over drafts reached:
the accepted ones and the first rejected one), decayed per round the model drafted the lane, pulled towards the
engine's mean while the lane has little evidence; the engine's mean itself starts at, and is pulled towards, the
drafter's fitted prior. So a lane where the network's drafts keep failing leaves more rounds to the trees, and one
where they hold takes them. The estimates mirror the measured draft plan's (stages/draft_plan.py) for one part.

The chain times each model proposal and each catch-up of the network's window (per row), and the period between
its own proposals, less the model's time in it: a round without the network. Medians of the recent samples, so a
round that also ran a prompt's prefill (between two requests) does not move them; an engine's first proposal,
which pays one-time set-up, is not a sample. Before any sample, the network costs nothing.
Not here: the trees' own estimate (the suffix backend calibrates it), the choice itself (chain.py).
"""

from __future__ import annotations

import collections
import statistics
import time
from collections.abc import Callable

import attrs

LANE_WEIGHT = 4.0  # pseudo-drafts of the engine's mean in a lane's estimate
ENGINE_WEIGHT = 2.0  # pseudo-drafts of the prior in the engine's mean
LANE_DECAY = 0.9  # per round the model drafted the lane
ENGINE_DECAY = 0.98  # per lane round the model drafted
SAMPLES = 9  # recent samples a time is the median of


@attrs.define(eq=False)
class LaneRate:
    lane: object
    part: str = ""  # who drafted the lane's last round: "suffix", "model" or "" (nobody)
    drafted: int = 0  # the lane's counters when last read
    accepted: int = 0
    hits: float = 0.0  # the model drafter's accepted drafts in this lane (decayed)
    tested: float = 0.0  # its drafts reached in this lane (decayed)


@attrs.define(eq=False)
class ModelRates:
    prior: float  # the model drafter's first-draft acceptance before any evidence
    hits: float = 0.0  # the engine's, over every lane (decayed)
    tested: float = 0.0
    lanes: dict = attrs.field(factory=dict)  # slot -> LaneRate of the lane holding it

    def _entry(self, lane) -> LaneRate:
        entry = self.lanes.get(lane.slot)
        if entry is None or entry.lane is not lane:
            entry = self.lanes[lane.slot] = LaneRate(
                lane, drafted=getattr(lane, "drafted", 0), accepted=getattr(lane, "accepted", 0)
            )
        return entry

    def update(self, lanes) -> None:
        """Count what each lane's last round accepted for the part that drafted it."""
        for lane in lanes:
            entry = self._entry(lane)
            drafted, accepted = getattr(lane, "drafted", 0), getattr(lane, "accepted", 0)
            d, a = drafted - entry.drafted, accepted - entry.accepted
            entry.drafted, entry.accepted = drafted, accepted
            if entry.part == "model" and d > 0:
                reached = a + (1 if a < d else 0)
                entry.hits, entry.tested = entry.hits * LANE_DECAY + a, entry.tested * LANE_DECAY + reached
                self.hits, self.tested = self.hits * ENGINE_DECAY + a, self.tested * ENGINE_DECAY + reached
            entry.part = ""

    def drafted(self, lane, part: str) -> None:
        """`part` drafts the lane this round."""
        self._entry(lane).part = part

    def engine_rate(self) -> float:
        return (self.hits + ENGINE_WEIGHT * self.prior) / (self.tested + ENGINE_WEIGHT)

    def rate(self, lane) -> float:
        entry = self.lanes.get(lane.slot)
        h, t = (entry.hits, entry.tested) if entry is not None and entry.lane is lane else (0.0, 0.0)
        return (h + LANE_WEIGHT * self.engine_rate()) / (t + LANE_WEIGHT)

    def expected(self, lane, k: int) -> float:
        """The drafts of k the model drafter is expected to have accepted in `lane`: sum of a^j, j = 1..k."""
        a = self.rate(lane)
        return sum(a**j for j in range(1, k + 1))


@attrs.define(eq=False)
class ModelCosts:
    clock: Callable[[], float] = time.perf_counter
    proposals: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=SAMPLES))  # seconds each
    periods: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=SAMPLES))  # rounds without it
    rows: float = 0.0  # rows caught up (decayed) and the seconds they took
    row_seconds: float = 0.0
    warm: bool = False  # the first proposal (one-time set-up) was seen
    last: float | None = None  # when the chain last proposed
    spent: float = 0.0  # the model's seconds since

    def tick(self) -> None:
        """The chain proposes: the period since its last proposal, less the model's time in it, is a sample."""
        now = self.clock()
        if self.last is not None:
            self.periods.append(max(0.0, now - self.last - self.spent))
        self.last, self.spent = now, 0.0

    def proposed(self, seconds: float) -> None:
        self.spent += seconds
        if self.warm:
            self.proposals.append(seconds)
        self.warm = True

    def caught_up(self, rows: int, seconds: float) -> None:
        self.spent += seconds
        if rows > 0:
            self.rows, self.row_seconds = self.rows * LANE_DECAY + rows, self.row_seconds * LANE_DECAY + seconds

    def share(self, rows: int) -> float:
        """What a model proposal that first catches up `rows` window rows costs, as a share of a round without the
        network (0 before it has been timed)."""
        if not self.proposals or not self.periods:
            return 0.0
        per_row = self.row_seconds / self.rows if self.rows else 0.0
        base = statistics.median(self.periods)
        return (statistics.median(self.proposals) + rows * per_row) / base if base > 0 else 0.0
