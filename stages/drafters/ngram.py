"""The `ngram` backend: prompt lookup over each lane's own prompt and output.

The longest suffix of the lane's tokens (n from `max_n` down to `min_n`) that occurred earlier proposes the
tokens that followed its latest earlier occurrence. Each slot keeps an index from n-gram to the position after
its latest occurrence, extended incrementally, so a round costs O(new tokens x n range), not a scan.
"""
from __future__ import annotations

from stages.drafters.base import DraftBackend, proposal_from_lists


class _SlotIndex:
    __slots__ = ("owner", "grams", "upto")

    def __init__(self, owner: object):
        self.owner = owner
        self.grams: dict[tuple[int, ...], int] = {}
        self.upto = 0  # grams ending at positions < upto are indexed


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
        # Index the grams that end before the last token, so the suffix never matches itself.
        for stop in range(max(idx.upto, self.min_n), end):
            for n in range(self.min_n, min(self.max_n, stop) + 1):
                idx.grams[tuple(tokens[stop - n:stop])] = stop
        idx.upto = max(idx.upto, end)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            at = idx.grams.get(tuple(tokens[end - n:]))
            if at is not None:
                return tokens[at:at + k]
        return []

    def propose(self, lanes, anchors, limits, state):
        rows = []
        for lane, k in zip(lanes, limits):
            found = self.lookup(lane.tokens, self._index(state, lane), k) if k > 0 else []
            rows.append(found)
        return proposal_from_lists(rows, limits, anchors.device)


BACKEND = NGram
