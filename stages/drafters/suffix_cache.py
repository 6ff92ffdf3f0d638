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
CALIBRATION_WEIGHT = 4.0  # pseudo-drafts at the trees' own estimate in each bucket's factor
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
    expected ones (decayed sums), pulled towards 1 while evidence is thin and never above 1 (a count ratio already
    says all the trees know)."""

    expected: list = attrs.field(factory=lambda: [0.0] * (len(MATCH_BUCKETS) + 1))
    accepted: list = attrs.field(factory=lambda: [0.0] * (len(MATCH_BUCKETS) + 1))

    @staticmethod
    def bucket(match: int) -> int:
        return sum(match > b for b in MATCH_BUCKETS)

    def factor(self, match: int) -> float:
        b = self.bucket(match)
        return min(1.0, (self.accepted[b] + CALIBRATION_WEIGHT) / (self.expected[b] + CALIBRATION_WEIGHT))

    def chances(self, draft: Draft) -> tuple[float, ...]:
        """Each draft's chance of being accepted given the ones before it: the path's own ratios, the first scaled by
        what drafts from a match of that length have been worth (so their running product sums to `worth`)."""
        out, before = [], 1.0
        for i, c in enumerate(draft.chances):
            out.append(min(1.0, c / before) * (self.factor(draft.match) if i == 0 else 1.0))
            before = c
        return tuple(out)

    def worth(self, draft: Draft) -> float:
        """The drafts of `draft` the target is expected to accept: its score, calibrated by its match length."""
        return draft.score * self.factor(draft.match)

    def settle(self, draft: Draft, accepted: int) -> None:
        """A proposal `draft` of which the target accepted the first `accepted` drafts."""
        b = self.bucket(draft.match)
        self.expected[b] = self.expected[b] * CALIBRATION_DECAY + draft.score
        self.accepted[b] = self.accepted[b] * CALIBRATION_DECAY + accepted
