"""What the `suffix` backend keeps beyond its lanes' trees: the tree over finished requests within its token budget
(`RequestCache`), and how far the trees' estimates have been borne out (`Calibration`).

Not here: the trees themselves (suffix_tree.py), which trees a lane reads and when requests are taken in (suffix.py).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import attrs

from speclane.stages.drafters.suffix_tree import Draft, SuffixTree

MATCH_BUCKETS = (1, 2, 4, 8, 16)  # calibration buckets by matched tokens: 1, 2, 3-4, 5-8, 9-16, 17 and more
CALIBRATION_WEIGHT = 4.0  # pseudo-drafts in each bucket's factor, accepted at the prior's share of the trees' chances
# What the draft plan takes a bucket's drafts to be worth before any evidence (`Calibration.chances`): half the trees'
# estimate, as it assumes of a drafter it has not seen (PRIOR in stages/draft_plan.py). Not 1: a path seen once says
# 1.0 for every draft on it, so a fresh server's first proposals were priced as sure, and where rows are dear (many
# lanes) its first rounds drafted paths the target refused. A chain's choice between the trees and its network
# (`Calibration.worth`) keeps the trees' own estimate before evidence: there a bucket priced at half lost its lanes to
# the network, so it never drafted and never learnt (an agent's echoes at four lanes went to mtp).
CALIBRATION_PRIOR = 0.5
CALIBRATION_DECAY = 0.98  # per settled proposal of the bucket: its evidence halves in about 35 of them


@attrs.define(eq=False)
class RequestCache:
    """The tree over finished requests' token sequences (suffix.py says which of their tokens), within `budget`
    tokens, oldest dropped first."""

    budget: int
    tree: SuffixTree
    held: collections.deque = attrs.field(factory=collections.deque)  # the requests' token tuples, oldest first
    tokens: int = 0
    # Called with each request's tuple as it is taken in and as it is dropped (the snapshot files keep one file a
    # held request: pipeline/runtime/snapshots.py); None: nobody listens.
    on_add: Callable[[tuple], None] | None = None
    on_drop: Callable[[tuple], None] | None = None

    def add(self, seq: Sequence[int]) -> None:
        seq = tuple(seq[len(seq) - self.budget :]) if len(seq) > self.budget else tuple(seq)
        if not seq:
            return
        self.tree.add(seq)
        self.held.append(seq)
        self.tokens += len(seq)
        if self.on_add is not None:
            self.on_add(seq)
        while self.tokens > self.budget:
            old = self.held.popleft()
            self.tree.remove(old)
            self.tokens -= len(old)
            if self.on_drop is not None:
                self.on_drop(old)

    def rebuild(self, tree: SuffixTree) -> None:
        """Hold the same requests in `tree` (another depth) instead."""
        for seq in self.held:
            tree.add(seq)
        self.tree = tree

    def clear(self) -> None:
        """Drop every held request, oldest first, as the budget drops them (`on_drop` hears each)."""
        while self.held:
            old = self.held.popleft()
            self.tree.remove(old)
            self.tokens -= len(old)
            if self.on_drop is not None:
                self.on_drop(old)


@attrs.define(eq=False)
class Calibration:
    """How far the trees' estimates are borne out, by matched context length: per bucket the accepted drafts over the
    expected ones (decayed sums), pulled towards a prior while evidence is thin (CALIBRATION_PRIOR for the plan, the
    trees' own estimate for a chain's choice) and never above 1 (a count ratio already says all the trees know)."""

    expected: list = attrs.field(factory=lambda: [0.0] * (len(MATCH_BUCKETS) + 1))
    accepted: list = attrs.field(factory=lambda: [0.0] * (len(MATCH_BUCKETS) + 1))

    @staticmethod
    def bucket(match: int) -> int:
        return sum(match > b for b in MATCH_BUCKETS)

    def factor(self, match: int, prior: float = CALIBRATION_PRIOR) -> float:
        """What the trees' estimate after a match of this length is worth: `prior` before any evidence."""
        b = self.bucket(match)
        return min(1.0, (self.accepted[b] + CALIBRATION_WEIGHT * prior) / (self.expected[b] + CALIBRATION_WEIGHT))

    def chances(self, draft: Draft) -> tuple[float, ...]:
        """Each draft's chance of being accepted given the ones before it, for the plan: the path's own ratios, the
        first scaled by what drafts from a match of that length have been worth (their running products sum to
        `worth` but for the priors' pull, which fades as the bucket gathers evidence)."""
        out, before = [], 1.0
        for i, c in enumerate(draft.chances):
            out.append(min(1.0, c / before) * (self.factor(draft.match) if i == 0 else 1.0))
            before = c
        return tuple(out)

    def worth(self, draft: Draft) -> float:
        """The drafts of `draft` the target is expected to accept: its score, calibrated by its match length (the
        trees' own estimate before any evidence, see CALIBRATION_PRIOR)."""
        return draft.score * self.factor(draft.match, prior=1.0)

    def settle(self, draft: Draft, accepted: int) -> None:
        """A proposal `draft` of which the target accepted the first `accepted` drafts."""
        b = self.bucket(draft.match)
        self.expected[b] = self.expected[b] * CALIBRATION_DECAY + draft.score
        self.accepted[b] = self.accepted[b] * CALIBRATION_DECAY + accepted
