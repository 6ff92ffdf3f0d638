"""The `oracle` backend: drafts replayed from a continuation known beforehand (a benchmark control).

With the target's own greedy continuation every draft is accepted, which measures the ceiling of speculation
at each k; `corrupt` swaps a share of the drafts for a wrong token (chosen by a hash of request and position, of
the id's own bytes rather than Python's salted `hash`, so runs repeat in any process), which gives tests every
acceptance length. The continuations are the backend's own: whoever built the engine hands them to the built
drafter with `replay` before its rounds, and they reach every round with the drafter, on the draft stage's
`drafter` input. `max_drafts` lets a lane take more than the draft stage's draft tokens a round, as suffix's does:
the ceiling of a drafter as sure at that width. Not a `--spec-backend`: tests and the bench name it in the spec.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Mapping, Sequence

from speclane.stages.contract.lanes import MAX_DRAFT_TOKENS
from speclane.stages.drafters.base import DraftBackend, proposal_from_lists


def _rid_key(rid) -> int:
    """An integer id as it is; any other id by a checksum of its text (Python salts `hash` of a str per process)."""
    return rid if isinstance(rid, int) else zlib.crc32(repr(rid).encode())


def _hash01(*parts: int) -> float:
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = ((x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return (x >> 11) / float(1 << 53)


class Oracle(DraftBackend):
    name = "oracle"
    option_names = ("corrupt", "seed", "max_drafts")

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        self.corrupt = float(options.get("corrupt", 0.0))
        self.seed = int(options.get("seed", 0))
        if not 0.0 <= self.corrupt <= 1.0:
            raise ValueError(f"backend 'oracle' needs 0 <= corrupt <= 1, got {self.corrupt}")
        self.max_drafts = int(options.get("max_drafts", 0))
        if not 0 <= self.max_drafts <= 63:
            raise ValueError(f"backend 'oracle' needs 0 <= max_drafts <= 63, got {self.max_drafts}")
        self.vocab = resources.target.config.vocab_size if resources.target is not None else 1 << 30
        self.answers: dict[Hashable, tuple[int, ...]] = {}  # request id -> continuation; key None: every request

    def draft_cap(self, costs=None) -> int:
        return self.max_drafts if self.max_drafts > MAX_DRAFT_TOKENS else 0

    def replay(self, answers: Mapping[Hashable, Sequence[int]]) -> None:
        """Replace the continuations the drafts are read from: request id -> the tokens it outputs, from its first
        (key None: the one for every request without its own). A request with none gets no drafts."""
        if not isinstance(answers, Mapping):
            raise TypeError(f"oracle replay: answers must map request id -> token ids, got {type(answers).__name__}")
        table = {}
        for rid, tokens in answers.items():
            if isinstance(tokens, (str, bytes)) or not all(isinstance(t, int) and t >= 0 for t in tokens):
                raise ValueError(f"oracle replay: answers[{rid!r}] must be token ids (ints >= 0), got {tokens!r:.80}")
            table[rid] = tuple(tokens)
        self.answers = table

    def propose(self, lanes, anchors, limits, state):
        rows = []
        for lane, k in zip(lanes, limits):
            at = len(lane.out_ids)  # the continuation's index of the token after the anchor
            found = list(self.answers.get(lane.rid, self.answers.get(None, ()))[at : at + k])
            for j, tok in enumerate(found):
                if self.corrupt and _hash01(self.seed, _rid_key(lane.rid), at + j) < self.corrupt:
                    found[j] = (tok + 1) % self.vocab
            rows.append(found)
        return proposal_from_lists(rows, limits, anchors.device)


BACKEND = Oracle
