"""The chained backends `suffix+mtp` and `suffix+dflash2`: suffix drafts where the trees are confident, the model
drafter's elsewhere, chosen per lane and round.

A chain holds a `suffix` backend and a model drafter (`mtp` or `dflash2`) and reaches both through the backend
interface only (stages/drafters/base.py). Each round the suffix trees read every drafting lane first
(`Suffix.speculate`: drafts and their score, the expected accepted drafts along the path); a lane whose score is at
least `trust` times what the model drafter is expected to accept at the lane's limit (the sum of a^j for j = 1..k,
a being the drafter's fitted first-draft acceptance, else 1/2) takes the suffix drafts, the others are passed to
the model drafter with their limits, the suffix lanes with limit 0 (so a round the trees win for every lane runs
no network at all). Both are greedy, so the proposal's q stays None (a one-hot q). Every pass is observed by both
parts: the model drafter's window takes the committed rows of every round, whoever drafted it, and a lane's
backlog and catch-up are both parts' together. Prompt checkpoints keep the model drafter's window (the suffix
trees are rebuilt from the tokens). Options: the two parts' own (flat: `cache_tokens`, `min_prob`, ... and `path`,
`window`, ...) and `trust` (a number >= 0; 0: the trees draft wherever they find a continuation).
`state.rounds` counts the lane rounds each part drafted. Not here: the trees (suffix.py, suffix_tree.py), the
networks (mtp.py, dflash2.py), how many drafts a lane takes (stages/draft_plan.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import torch

from speclane.stages.drafters.base import DraftBackend, Proposal, proposal_from_lists
from speclane.stages.drafters.dflash2 import DFlash2
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.drafters.mtp import Mtp
from speclane.stages.drafters.suffix import Suffix, SuffixState

TRUST = 1.0  # the suffix drafts win a lane when their score is at least this times the model drafter's expectation
PRIOR = 0.5  # the model drafter's first-draft acceptance assumed where its file records none


@attrs.define(eq=False)
class ChainState:
    suffix: SuffixState
    model: Any  # the model drafter's per-slot state (its window and carried vectors)
    rounds: dict = attrs.field(factory=lambda: {"suffix": 0, "model": 0})  # lane rounds each part drafted

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


class Chain(DraftBackend):
    model_class: ClassVar[type[ModelBackend]]

    def state_stats(self, state: ChainState) -> dict[str, int]:
        return self.suffix.state_stats(state.suffix)

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        trust = self.options.get("trust", TRUST)
        if isinstance(trust, bool) or not isinstance(trust, (int, float)) or not trust >= 0:
            raise ValueError(
                f"backend '{self.name}' option trust must be a number >= 0 (how many times the model drafter's "
                f"expected accepted drafts the suffix path must score; 0: always the suffix path), got {trust!r}"
            )
        self.trust = float(trust)
        self.suffix = Suffix(self._part(Suffix), head, resources)
        self.model = self.model_class(self._part(self.model_class), head, resources)
        self.taps = self.model.taps
        self.files = self.model.files  # the drafter's identity for checkpoint files is its network's
        a = self.model.prior_acceptance() or PRIOR
        self._expect = [sum(a**j for j in range(1, k + 1)) for k in range(65)]  # [limit] model's expected accepts

    def _part(self, cls) -> dict:
        return {k: v for k, v in self.options.items() if k in cls.option_names}

    def expected(self, limit: int) -> float:
        """The drafts the model drafter is expected to have accepted at `limit`: sum of a^j, j = 1..limit."""
        return self._expect[min(limit, len(self._expect) - 1)]

    def new_state(self, slots, max_len) -> ChainState:
        return ChainState(self.suffix.new_state(slots, max_len), self.model.new_state(slots, max_len))

    def observe(self, state, lanes, batch, out, committed_len):
        self.suffix.observe(state.suffix, lanes, batch, out, committed_len)
        self.model.observe(state.model, lanes, batch, out, committed_len)

    def backlog(self, state, lanes):
        own, model = self.suffix.backlog(state.suffix, lanes), self.model.backlog(state.model, lanes)
        return tuple(a + b for a, b in zip(own, model))

    def catch_up(self, state, lanes=None):
        self.suffix.catch_up(state.suffix, lanes)
        self.model.catch_up(state.model, lanes)

    def choose(self, state: ChainState, lanes, limits) -> tuple[list[list[int]], tuple[int, ...]]:
        """Per lane the suffix drafts where they win (else []), and the limits left to the model drafter."""
        rows, rest = [], []
        for (drafts, score), k in zip(self.suffix.speculate(state.suffix, lanes, limits), limits):
            wins = k > 0 and bool(drafts) and score >= self.trust * self.expected(k)
            rows.append(drafts if wins else [])
            rest.append(0 if wins else k)
        state.rounds["suffix"] += sum(1 for r in rows if r)
        state.rounds["model"] += sum(1 for k in rest if k)
        return rows, tuple(rest)

    def propose(self, lanes, anchors, limits, state) -> Proposal:
        rows, rest = self.choose(state, lanes, limits)
        own = proposal_from_lists(rows, limits, anchors.device)
        if not any(rest):
            return own
        theirs = self.model.propose(lanes, anchors, rest, state.model)
        assert theirs.q is None, "a chained model drafter proposes greedily"
        drafts = own.drafts.clone()  # [lanes, max(limits)]
        drafts[:, : theirs.drafts.shape[1]] = torch.where(
            theirs.drafts >= 0, theirs.drafts, drafts[:, : theirs.drafts.shape[1]]
        )
        draft_len = tuple(m if k else s for s, m, k in zip(own.draft_len, theirs.draft_len, rest))
        return Proposal(drafts=drafts, draft_len=draft_len)

    def snapshot(self, state, slot, base=None):
        return self.model.snapshot(state.model, slot, base)

    def restore(self, state, lane, snap):
        self.model.restore(state.model, lane, snap)

    def request_cache(self, state: ChainState):
        return self.suffix.request_cache(state.suffix)

    def memory_bytes(self) -> int:
        return self.model.memory_bytes()

    def prior_acceptance(self) -> float | None:
        return self.model.prior_acceptance()


class SuffixMtp(Chain):
    name = "suffix+mtp"
    model_class = Mtp
    default_rows = Mtp.default_rows
    option_names = Suffix.option_names + Mtp.option_names + ("trust",)


class SuffixDFlash2(Chain):
    name = "suffix+dflash2"
    model_class = DFlash2
    default_rows = DFlash2.default_rows
    option_names = Suffix.option_names + DFlash2.option_names + ("trust",)


BACKENDS = {cls.name: cls for cls in (SuffixMtp, SuffixDFlash2)}
