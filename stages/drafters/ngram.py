"""The `ngram` backend: prompt lookup over each lane's own prompt and output.

The longest suffix of the lane's tokens (n from `max_n` down to `min_n`) that occurred earlier proposes the
tokens that followed its latest earlier occurrence (`stages/models/lookup.py`, the rule dflash2's block rows also
read). Each slot keeps the lookup's index of its lane, extended incrementally, so a round costs
O(new tokens x n range), not a scan.
"""

from __future__ import annotations

from speclane.stages.drafters.base import DraftBackend, proposal_from_lists
from speclane.stages.models.lookup import LookupIndex, lookup


class _SlotIndex(LookupIndex):
    __slots__ = ("owner",)

    def __init__(self, owner: object):
        super().__init__()
        self.owner = owner


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
        return lookup(tokens, idx, k, self.min_n, self.max_n)[0]

    def propose(self, lanes, anchors, limits, state):
        rows = []
        for lane, k in zip(lanes, limits):
            found = self.lookup(lane.tokens, self._index(state, lane), k) if k > 0 else []
            rows.append(found)
        return proposal_from_lists(rows, limits, anchors.device)


BACKEND = NGram
