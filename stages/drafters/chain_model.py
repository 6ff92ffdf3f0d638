"""What a chain (stages/drafters/chain.py) knows of its model drafter: what it is expected to have accepted in a lane
(`ModelRates`, learnt from the rounds it drafted there) and what its drafting costs as a share of a round
(`ModelCosts`, timed by the chain itself).

Each lane's rounds are attributed to the part that drafted them (`drafted`, as the chain chooses); at the lane's
next choice (`update`) the drafts the target verified and accepted since (the lane's own counters) are counted for
that part. Only the model drafter's are kept: a per-position acceptance a (accepted drafts over drafts reached:
the accepted ones and the first rejected one), decayed per round the model drafted the lane, pulled towards the
engine's mean while the lane has little evidence; the engine's mean itself starts at, and is pulled towards, the
drafter's fitted prior, its evidence decaying every round (so after rounds the network did not draft it is tried
again). So a lane where the network's drafts keep failing leaves more rounds to the trees, and one
where they hold takes them. The estimates mirror the measured draft plan's (stages/draft_plan.py) for one part.

The chain times each model proposal and each catch-up of the network's window (per row), and the period between
its own proposals, less the model's time in it: a round without the network. Medians of the recent samples, so a
round that also ran a prompt's prefill (between two requests) does not move them; an engine's first proposal,
which pays one-time set-up, is not a sample. Before any sample, the network costs nothing.
The chain also holds the passes the model drafter has yet to observe (`Held`): a pass is observed only when
something reads the network's state, so a round the trees draft pays nothing for the network, and a pass whose
lanes have all left their slots is never observed (observing it would be undone by the next lane's claim). A
model drafter reads only a pass's `hidden` and `taps` (`raw_rows`), so only those are held of its output, by
reference, with the batch and the committed lengths: the target's outputs must not be buffers it writes again.
The chain's per-slot state (`ChainState`) holds these with both parts' own, and this round's trees' drafts and
choices. Not here: the trees' own estimate (the suffix backend calibrates it), the choice itself (chain.py).
"""

from __future__ import annotations

import collections
import statistics
import time
from collections.abc import Callable
from typing import Any

import attrs

from speclane.stages.drafters.suffix import SuffixState
from speclane.stages.drafters.suffix_tree import Draft

LANE_WEIGHT = 4.0  # pseudo-drafts of the engine's mean in a lane's estimate
ENGINE_WEIGHT = 2.0  # pseudo-drafts of the prior in the engine's mean
LANE_DECAY = 0.9  # per round the model drafted the lane
ENGINE_DECAY = 0.98  # per round: the engine's evidence halves in about 35
SAMPLES = 9  # recent samples a time is the median of
HELD_PASSES = 16  # passes held unobserved at least (more while observing them all costs less than a round)


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
        """Count what each lane's last round accepted for the part that drafted it. The engine's evidence decays
        every round, drafted by the network or not, so its mean drifts back to the prior while the network drafts
        nothing: learnt only from the rounds it drafted, a mean sunk by a few hard answers (where the trees found
        nothing the network accepts about half its held-out rate) kept the plan from ever giving it a round again."""
        lanes = list(lanes)
        if lanes:
            self.hits, self.tested = self.hits * ENGINE_DECAY, self.tested * ENGINE_DECAY
        for lane in lanes:
            entry = self._entry(lane)
            drafted, accepted = getattr(lane, "drafted", 0), getattr(lane, "accepted", 0)
            d, a = drafted - entry.drafted, accepted - entry.accepted
            entry.drafted, entry.accepted = drafted, accepted
            if entry.part == "model" and d > 0:
                reached = a + (1 if a < d else 0)
                entry.hits, entry.tested = entry.hits * LANE_DECAY + a, entry.tested * LANE_DECAY + reached
                self.hits, self.tested = self.hits + a, self.tested + reached
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
    passes: float = 0.0  # held passes observed (decayed) and the seconds they took
    pass_seconds: float = 0.0
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

    def observed(self, passes: int, seconds: float) -> None:
        """The model drafter observed `passes` held passes in `seconds`."""
        self.spent += seconds
        if passes > 0:
            self.passes, self.pass_seconds = self.passes * LANE_DECAY + passes, self.pass_seconds * LANE_DECAY + seconds

    def held_passes(self) -> int:
        """How many passes may wait unobserved: as many as one round without the network observes, HELD_PASSES
        at least."""
        if not self.passes or not self.periods or self.pass_seconds <= 0:
            return HELD_PASSES
        return max(HELD_PASSES, int(statistics.median(self.periods) / (self.pass_seconds / self.passes)))

    def caught_up(self, rows: int, seconds: float) -> None:
        self.spent += seconds
        if rows > 0:
            self.rows, self.row_seconds = self.rows * LANE_DECAY + rows, self.row_seconds * LANE_DECAY + seconds

    def share(self, rows: float, passes: float = 0) -> float:
        """What a model proposal that first observes `passes` held passes and catches up `rows` window rows costs,
        as a share of a round without the network (0 before its proposals have been timed)."""
        if not self.proposals or not self.periods:
            return 0.0
        per_row = self.row_seconds / self.rows if self.rows else 0.0
        per_pass = self.pass_seconds / self.passes if self.passes else 0.0
        base = statistics.median(self.periods)
        spend = statistics.median(self.proposals) + rows * per_row + passes * per_pass
        return spend / base if base > 0 else 0.0


@attrs.frozen
class Seen:
    """What a model drafter reads of a pass's output."""

    hidden: Any
    taps: Any


@attrs.define(eq=False)
class Held:
    """The passes the model drafter has not observed, oldest first: (lanes, batch, Seen, committed lengths)."""

    passes: collections.deque = attrs.field(factory=collections.deque)
    slots: dict = attrs.field(factory=dict)  # slot -> [the lane of its newest held pass, that lane's held rows]

    def __len__(self) -> int:
        return len(self.passes)

    def hold(self, lanes, batch, out, committed_len) -> None:
        """Hold one pass; the oldest ones whose every lane has since lost its slot to another are forgotten."""
        lanes = list(lanes)
        for lane, n in zip(lanes, batch.lane_rows):
            entry = self.slots.get(lane.slot)
            if entry is None or entry[0] is not lane:
                entry = self.slots[lane.slot] = [lane, 0]
            entry[1] += n
        self.passes.append((lanes, batch, Seen(out.hidden, out.taps), committed_len))
        while self.passes and not any(self._owns(lane) for lane in self.passes[0][0]):
            self.passes.popleft()

    def _owns(self, lane) -> bool:
        entry = self.slots.get(lane.slot)
        return entry is not None and entry[0] is lane

    def rows(self, lane) -> int:
        """The rows of `lane` in the held passes."""
        return self.slots[lane.slot][1] if self._owns(lane) else 0

    def take(self, count: int | None = None) -> list:
        """The oldest `count` held passes (None: all), no longer held."""
        count = len(self.passes) if count is None else min(count, len(self.passes))
        out = [self.passes.popleft() for _ in range(count)]
        for lanes, batch, _, _ in out:
            for lane, n in zip(lanes, batch.lane_rows):
                if self._owns(lane):
                    self.slots[lane.slot][1] -= n
        if not self.passes:
            self.slots.clear()
        return out


@attrs.frozen
class Found:
    """The trees' draft for one lane this round, at `limit`."""

    lane: object
    tokens: int  # the lane's tokens when found: a later round looks again
    limit: int
    draft: Draft


@attrs.define(eq=False)
class ChainState:
    suffix: SuffixState
    model: Any  # the model drafter's per-slot state (its window and carried vectors)
    rates: ModelRates
    costs: ModelCosts = attrs.field(factory=ModelCosts)
    held: Held = attrs.field(factory=Held)  # passes the model drafter has yet to observe
    rounds: dict = attrs.field(factory=lambda: {"suffix": 0, "model": 0})  # lane rounds each part drafted
    found: dict = attrs.field(factory=dict)  # slot -> this round's Found
    decided: dict = attrs.field(factory=dict)  # slot -> (lane, its tokens, the trees draft it): the plan's choice
    splits: dict = attrs.field(factory=dict)  # this round's choices by limits (`Chain._split`), and "at": the round

    # What the checkpoint files and the suffix cache's readers look for in a drafter's state.
    @property
    def window(self):
        return self.model.window

    @property
    def carry(self):
        return self.model.carry

    @property
    def cache(self):
        return self.suffix.cache
