"""What the `suffix` backend keeps beyond its lanes' trees: the tree over finished requests within its token budget
(`RequestCache`), how far the trees' estimates have been borne out (`Calibration`), and the proposals whose outcome
is yet to be read, with where the target left each lane's path (`Outcomes`).

Not here: the trees themselves (suffix_tree.py), which trees a lane reads and when requests are taken in (suffix.py).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

import attrs

from speclane.stages.drafters.suffix_tree import EDIT_MATCH, Draft, SuffixTree

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

    expected: list = attrs.field(factory=lambda: [0.0] * (len(MATCH_BUCKETS) + 2))
    accepted: list = attrs.field(factory=lambda: [0.0] * (len(MATCH_BUCKETS) + 2))

    @staticmethod
    def bucket(match: int, resume: bool = False) -> int:
        """The match length's bucket; the last one holds the resumed drafts (`Draft.resume`)."""
        return len(MATCH_BUCKETS) + 1 if resume else sum(match > b for b in MATCH_BUCKETS)

    def factor(self, match: int, prior: float = CALIBRATION_PRIOR, resume: bool = False) -> float:
        """What the trees' estimate after a match of this length (or of a resumed draft) is worth: `prior` before any
        evidence."""
        b = self.bucket(match, resume)
        return min(1.0, (self.accepted[b] + CALIBRATION_WEIGHT * prior) / (self.expected[b] + CALIBRATION_WEIGHT))

    def chances(self, draft: Draft) -> tuple[float, ...]:
        """Each draft's chance of being accepted given the ones before it, for the plan: the path's own ratios, the
        first scaled by what drafts from a match of that length have been worth (their running products sum to
        `worth` but for the priors' pull, which fades as the bucket gathers evidence)."""
        out, before = [], 1.0
        for i, c in enumerate(draft.chances):
            out.append(min(1.0, c / before) * (self.factor(draft.match, resume=draft.resume) if i == 0 else 1.0))
            before = c
        return tuple(out)

    def worth(self, draft: Draft) -> float:
        """The drafts of `draft` the target is expected to accept: its score, calibrated by its match length (the
        trees' own estimate before any evidence, see CALIBRATION_PRIOR)."""
        return draft.score * self.factor(draft.match, prior=1.0, resume=draft.resume)

    def settle(self, draft: Draft, accepted: int) -> None:
        """A proposal `draft` of which the target accepted the first `accepted` drafts."""
        b = self.bucket(draft.match, draft.resume)
        self.expected[b] = self.expected[b] * CALIBRATION_DECAY + draft.score
        self.accepted[b] = self.accepted[b] * CALIBRATION_DECAY + accepted


def lane_tokens(lane) -> int:
    """The lane's tokens so far, prompt and answer: what marks its round."""
    return len(lane.prompt_ids) + len(lane.out_ids)


def _held(drafts: Sequence[int], got: Sequence[int]) -> int:
    """How many of `drafts` the tokens `got` bear out, from the first."""
    return next((i for i, (a, b) in enumerate(zip(got, drafts)) if a != b), min(len(got), len(drafts)))


@attrs.define(eq=False)
class Outcomes:
    """The proposals whose outcome is not yet known, the trees' widest draft of each lane's round (`found`), and
    where each lane's last round left its path: a proposal is settled into the calibration when its lane is next
    seen with more tokens (never another lane's, never before a round ran). Where the target's own token took the
    place of the path's after a match of EDIT_MATCH tokens or more, whether drafted or cut by the plan, the path's
    token is kept for the lane's next proposal (suffix.py's `_resume`). A resumed draft is settled by its first draft
    alone, whether the plan gave it rows or not: what is uncertain is whether the edit was one token, which the first
    draft after it tests (the rest is the path's); and a bucket sunk below what the plan drafts on learns still."""

    proposed: dict = attrs.field(factory=dict)  # slot -> (lane, its token count then, the Draft)
    paths: dict = attrs.field(factory=dict)  # slot -> (lane, its token count then, the widest Draft found then)
    refused: dict = attrs.field(factory=dict)  # slot -> (lane, its token count since, the path's token it left)

    def propose(self, lane, draft: Draft) -> None:
        if draft.drafts:
            self.proposed[lane.slot] = (lane, lane_tokens(lane), draft)

    def found(self, lane, draft: Draft) -> None:
        lane_then, at, old = self.paths.get(lane.slot, (None, 0, None))
        if lane_then is not lane or at != lane_tokens(lane) or len(draft.drafts) > len(old.drafts):
            self.paths[lane.slot] = (lane, lane_tokens(lane), draft)

    def settle(self, lanes, calibration: Calibration) -> None:
        for lane in lanes:
            now, start = lane_tokens(lane), len(lane.prompt_ids)
            lane_then, at, draft = self.proposed.get(lane.slot, (None, 0, None))
            proposed = lane_then is lane and at < now  # else another lane's, or no round has run since
            if proposed:
                del self.proposed[lane.slot]
                held = _held(draft.drafts, lane.out_ids[at - start :])
                if draft.resume:
                    draft, held = draft.cut(1), min(held, 1)
                calibration.settle(draft, held)
            lane_then, at, path = self.paths.get(lane.slot, (None, 0, None))
            if lane_then is not lane or now <= at:
                continue
            del self.paths[lane.slot]
            new = lane.out_ids[at - start : now - start]
            held = _held(path.drafts, new)
            if path.resume and path.drafts and not proposed:
                calibration.settle(path.cut(1), min(held, 1))
            if path.match >= EDIT_MATCH and held == len(new) - 1 < len(path.drafts):
                self.refused[lane.slot] = (lane, now, path.drafts[held])

    def refused_draft(self, lane) -> int | None:
        """The path's token whose place `lane`'s newest token took (None: it took none's)."""
        lane_then, at, token = self.refused.get(lane.slot, (None, 0, None))
        return token if lane_then is lane and at == lane_tokens(lane) else None
