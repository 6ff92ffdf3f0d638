"""Prompt checkpoints: kept slot states by token prefix, so a request that repeats a known prefix prefills only
the rest (an agent's next turn, a repeated system prompt, a chat that appends to its history).

Owns: the store (exact token prefixes, the longest match wins, least recently used evicted first within a byte
budget) and its counters (hits, tokens reused, bytes held, evictions). A checkpoint's target snapshot and its model
drafter's window may share their earlier positions with other checkpoints of the same conversation
(stages/models/checkpoint.py and drafter_window.py, `base`): each shared segment is counted once, while any
checkpoint holds it. When checkpoints are taken and restored:
keeper.py. Matching is by
tokens, exact; a checkpoint is used only for a strictly shorter prefix than the new prompt (the prompt's last token
must still go through the target to yield the first output token). Not here: what a snapshot holds
(stages/models/checkpoint.py and the drafters' `snapshot`).
"""
from __future__ import annotations

import collections
from typing import Any

import attrs

MIN_TOKENS = 16  # shorter prefixes are not worth a copy


@attrs.frozen
class Checkpoint:
    tokens: tuple[int, ...]
    target: Any                     # stages.models.checkpoint.SlotSnapshot (None in store-only tests)
    drafter: Any = None             # the drafter's own snapshot (None: it keeps nothing, or rebuilds from tokens)
    nbytes: int = 0                 # its own bytes beside the shared segments (recurrent states, drafter's carry)

    def segments(self) -> tuple:
        """The target's key segments and the drafter's window segments: parts shared with the conversation's
        other checkpoints."""
        target = self.target.segments if self.target is not None else ()
        return target + tuple(getattr(self.drafter, "segments", ()))


@attrs.define
class CheckpointStore:
    budget_bytes: int
    on_evict: Any = None            # called with each evicted checkpoint (checkpoint files delete theirs)
    _entries: collections.OrderedDict = attrs.field(factory=collections.OrderedDict)  # tokens -> Checkpoint
    _lengths: collections.Counter = attrs.field(factory=collections.Counter)
    _segments: dict = attrs.field(factory=dict)   # id(snapshot segment) -> [segment, checkpoints holding it]
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0
    evictions: int = 0
    bytes_held: int = 0

    def match(self, ids: list[int]) -> Checkpoint | None:
        """The longest checkpoint whose tokens are a prefix of `ids`, shorter than `ids`; counted."""
        for length in sorted(self._lengths, reverse=True):
            if length >= len(ids):
                continue
            found = self._entries.get(tuple(ids[:length]))
            if found is not None:
                self._entries.move_to_end(found.tokens)
                self.hits += 1
                self.tokens_reused += length
                return found
        self.misses += 1
        return None

    def wants(self, tokens: list[int] | tuple[int, ...]) -> bool:
        """Whether a checkpoint of `tokens` is worth taking (long enough, not already held)."""
        return len(tokens) >= MIN_TOKENS and tuple(tokens) not in self._entries

    def base_for(self, tokens) -> Checkpoint | None:
        """The held checkpoint of exactly `tokens`, uncounted (a new snapshot of the same slot may extend it)."""
        return self._entries.get(tuple(tokens))

    def cost(self, ck: Checkpoint) -> int:
        """Bytes keeping `ck` would add: its own, and its key segments no held checkpoint shares yet."""
        return ck.nbytes + sum(s.nbytes for s in ck.segments() if id(s) not in self._segments)

    def add(self, ck: Checkpoint) -> bool:
        """Keep `ck`, evicting the least recently used until it fits; False when it alone exceeds the budget."""
        alone = ck.nbytes + sum(s.nbytes for s in ck.segments())
        if alone > self.budget_bytes or ck.tokens in self._entries:
            return False
        while self.bytes_held + self.cost(ck) > self.budget_bytes:
            _, old = self._entries.popitem(last=False)
            self._forget(old)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(old)
        self.bytes_held += self.cost(ck)
        for seg in ck.segments():
            self._segments.setdefault(id(seg), [seg, 0])[1] += 1
        self._entries[ck.tokens] = ck
        self._lengths[len(ck.tokens)] += 1
        return True

    def _forget(self, ck: Checkpoint) -> None:
        self.bytes_held -= ck.nbytes
        for seg in ck.segments():
            held = self._segments[id(seg)]
            held[1] -= 1
            if not held[1]:
                del self._segments[id(seg)]
                self.bytes_held -= seg.nbytes
        self._lengths[len(ck.tokens)] -= 1
        if not self._lengths[len(ck.tokens)]:
            del self._lengths[len(ck.tokens)]

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "hits": self.hits, "misses": self.misses,
                "tokens_reused": self.tokens_reused, "bytes_held": self.bytes_held, "evictions": self.evictions,
                "budget_bytes": self.budget_bytes}
