"""The `oracle` backend: drafts replayed from a continuation known beforehand (a benchmark control).

With the target's own greedy continuation every draft is accepted, which measures the ceiling of speculation
at each k; `corrupt` swaps a share of the drafts for a wrong token (chosen by a hash of request and position,
so runs repeat), which gives tests every acceptance length. Continuations come from
`Resources.oracle`: a dict from request id to token list (key None: one for every request).
"""

from __future__ import annotations

from speclane.stages.drafters.base import DraftBackend, proposal_from_lists


def _hash01(*parts: int) -> float:
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = ((x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return (x >> 11) / float(1 << 53)


class Oracle(DraftBackend):
    name = "oracle"
    option_names = ("corrupt", "seed")

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        self.corrupt = float(options.get("corrupt", 0.0))
        self.seed = int(options.get("seed", 0))
        if not 0.0 <= self.corrupt <= 1.0:
            raise ValueError(f"backend 'oracle' needs 0 <= corrupt <= 1, got {self.corrupt}")
        self.resources = resources
        self.vocab = resources.target.config.vocab_size if resources.target is not None else 1 << 30

    def _continuation(self, rid) -> list[int]:
        table = self.resources.oracle
        return table.get(rid, table.get(None, []))

    def propose(self, lanes, anchors, limits, state):
        rows = []
        for lane, k in zip(lanes, limits):
            at = len(lane.out_ids)  # the continuation's index of the token after the anchor
            found = list(self._continuation(lane.rid)[at : at + k])
            for j, tok in enumerate(found):
                if self.corrupt and _hash01(self.seed, hash(lane.rid), at + j) < self.corrupt:
                    found[j] = (tok + 1) % self.vocab
            rows.append(found)
        return proposal_from_lists(rows, limits, anchors.device)


BACKEND = Oracle
