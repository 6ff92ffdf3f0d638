"""The `ngram` backend: prompt lookup over each lane's own prompt and output.

The longest suffix of the lane's tokens (n from `max_n` down to `min_n`) that occurred earlier proposes the
tokens that followed its latest earlier occurrence (`stages/models/lookup.py`, the rule dflash2's block rows also
read), except that a copy in progress goes on: where the place after the last draft's source (moved on by the
tokens committed since) ends with the same suffix, the drafts come from there. When an answer repeats a prompt, the
latest occurrence of its last few tokens is often in the answer's own earlier part (a line like one copied before),
which proposes that line's continuation instead of the one being copied. Each slot keeps the lookup's index of its
lane, extended incrementally, so a round costs O(new tokens x n range), not a scan.
"""

from __future__ import annotations

from speclane.stages.drafters.base import DraftBackend, proposal_from_lists
from speclane.stages.models.lookup import LookupIndex, find


class _SlotIndex(LookupIndex):
    __slots__ = ("owner", "source", "length")

    def __init__(self, owner: object):
        super().__init__()
        self.owner = owner
        self.source = -1  # where the last drafts came from (-1: none yet) ...
        self.length = 0  # ... when the lane held this many tokens


class NGram(DraftBackend):
    name = "ngram"
    option_names = ("min_n", "max_n")

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        self.min_n = int(options.get("min_n", 1))
        self.max_n = int(options.get("max_n", 4))
        if not 1 <= self.min_n <= self.max_n <= 64:
            raise ValueError(f"backend 'ngram' needs 1 <= min_n <= max_n <= 64, got {self.min_n}, {self.max_n}")

    def new_state(self, slots, max_len):
        return {}

    def _index(self, state: dict, lane) -> _SlotIndex:
        idx = state.get(lane.slot)
        if idx is None or idx.owner is not lane:
            idx = state[lane.slot] = _SlotIndex(lane)
        return idx

    def lookup(self, tokens: list[int], idx: _SlotIndex, k: int) -> list[int]:
        end = len(tokens)
        going_on = idx.source + end - idx.length if idx.source >= 0 else None
        at, n = find(tokens, idx, self.min_n, self.max_n, end, prefer=going_on)
        if not n:
            idx.source = -1
            return []
        idx.source, idx.length = at, end
        return tokens[at : min(at + k, end)]

    def propose(self, lanes, anchors, limits, state):
        rows = []
        for lane, k in zip(lanes, limits):
            found = self.lookup(lane.tokens, self._index(state, lane), k) if k > 0 else []
            rows.append(found)
        return proposal_from_lists(rows, limits, anchors.device)


BACKEND = NGram
