"""Prompt checkpoints: kept slot states by token prefix, so a request that repeats a known prefix prefills only
the rest (an agent's next turn, a repeated system prompt, a chat that appends to its history).

Owns: the store (exact token prefixes, the longest match wins, least recently used evicted first within a byte
budget; on a GPU, moved to host memory first, within a budget of its own) and its counters (hits, tokens reused,
bytes held on the device and on the host, spills, evictions). A checkpoint's target snapshot and its model
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
from typing import Any, Callable

import attrs
import torch

MIN_TOKENS = 16  # shorter prefixes are not worth a copy


@attrs.frozen
class Checkpoint:
    tokens: tuple[int, ...]
    target: Any  # speclane.stages.models.checkpoint.SlotSnapshot (None in store-only tests)
    drafter: Any = None  # the drafter's own snapshot (None: it keeps nothing, or rebuilds from tokens)
    nbytes: int = 0  # its own bytes beside the shared segments (recurrent states, drafter's carry)

    def segments(self) -> tuple:
        """The target's key segments and the drafter's window segments: parts shared with the conversation's
        other checkpoints."""
        target = self.target.segments if self.target is not None else ()
        return target + tuple(getattr(self.drafter, "segments", ()))

    def moved(self, move: Callable[[torch.Tensor], torch.Tensor]) -> Checkpoint:
        """The same checkpoint with its own tensors passed through `move` (its shared segments are moved by the
        store, in place, once no checkpoint on the device holds them)."""
        target = self.target.moved(move) if self.target is not None else None
        drafter = self.drafter.moved(move) if hasattr(self.drafter, "moved") else self.drafter
        return attrs.evolve(self, target=target, drafter=drafter)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A device tensor's copy in host memory (pinned, so restoring it is a fast transfer); a CPU tensor as it is."""
    if t.device.type == "cpu":
        return t
    return t.to("cpu").pin_memory()


@attrs.define
class CheckpointStore:
    """Checkpoints on the model's device within `budget_bytes`; with `host_budget_bytes` (a GPU's engine), the least
    recently used move to host memory when the device's budget is full, and only leave the host's in turn. A
    checkpoint on the host is restored from there (a copy into the slot): no API difference. On a CPU the two are
    one memory, so the host tier is off (0)."""

    budget_bytes: int
    host_budget_bytes: int = 0
    on_evict: Any = None  # called with each evicted checkpoint (checkpoint files delete theirs)
    to_host: Callable[[torch.Tensor], torch.Tensor] = host_copy
    _entries: collections.OrderedDict = attrs.field(factory=collections.OrderedDict)  # tokens -> Checkpoint
    _lengths: collections.Counter = attrs.field(factory=collections.Counter)
    # id(segment) -> [segment, checkpoints holding it, of them on the device, on the host (True) or the device]
    _segments: dict = attrs.field(factory=dict)
    _on_host: set = attrs.field(factory=set)  # tokens of the checkpoints held on the host
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0
    evictions: int = 0
    spills: int = 0  # checkpoints moved from the device to the host
    bytes_held: int = 0  # on the device
    host_bytes_held: int = 0
    added: int = 0  # checkpoints added so far: whether asking again can find anything new

    def match(self, ids: list[int], held: int | None = None) -> Checkpoint | None:
        """The longest checkpoint whose tokens are a prefix of `ids`, shorter than `ids`; counted as a hit or a miss.
        `held`: a lane asking again before its prefill starts, which holds that many tokens already (0: its first
        ask missed): only a longer checkpoint is taken, counted as what it adds (a miss turned into a hit)."""
        for length in sorted(self._lengths, reverse=True):
            if length >= len(ids):
                continue
            if held is not None and length <= held:
                return None
            found = self._entries.get(tuple(ids[:length]))
            if found is not None:
                self._entries.move_to_end(found.tokens)
                self.hits += not held
                self.misses -= held == 0
                self.tokens_reused += length - (held or 0)
                return found
        self.misses += held is None
        return None

    def wants(self, tokens: list[int] | tuple[int, ...]) -> bool:
        """Whether a checkpoint of `tokens` is worth taking (long enough, not already held)."""
        return len(tokens) >= MIN_TOKENS and tuple(tokens) not in self._entries

    def base_for(self, tokens) -> Checkpoint | None:
        """The held checkpoint of exactly `tokens`, uncounted (a new snapshot of the same slot may extend it)."""
        return self._entries.get(tuple(tokens))

    def on_host(self, tokens) -> bool:
        return tuple(tokens) in self._on_host

    def add(self, ck: Checkpoint) -> bool:
        """Keep `ck` on the device, moving the least recently used to the host (or evicting them) until the
        budgets hold; False when it alone exceeds the device's budget."""
        alone = ck.nbytes + sum(s.nbytes for s in ck.segments())
        if alone > self.budget_bytes or ck.tokens in self._entries:
            return False
        self.bytes_held += ck.nbytes
        for seg in ck.segments():
            held = self._segments.get(id(seg))
            if held is None:
                held = self._segments[id(seg)] = [seg, 0, 0, False]
                self.bytes_held += seg.nbytes
            held[1] += 1
            held[2] += 1
        self._entries[ck.tokens] = ck
        self._lengths[len(ck.tokens)] += 1
        self.added += 1
        self._fit(keep=ck.tokens)
        return True

    def _fit(self, keep) -> None:
        while self.bytes_held > self.budget_bytes:
            victim = next((t for t in self._entries if t not in self._on_host and t != keep), None)
            if victim is None:
                break
            ck = self._entries[victim]
            to_move = ck.nbytes + sum(s.nbytes for s in ck.segments() if not self._segments[id(s)][3])
            if self.host_budget_bytes and to_move <= self.host_budget_bytes:
                self._spill(ck)
            else:
                self.evict(ck)
        while self.host_bytes_held > self.host_budget_bytes:
            victim = next((t for t in self._entries if t in self._on_host), None)
            if victim is None:
                break
            self.evict(self._entries[victim])

    def _spill(self, ck: Checkpoint) -> None:
        """Move `ck` to the host: its own tensors, and each segment no checkpoint on the device holds any more."""
        self._entries[ck.tokens] = ck.moved(self.to_host)  # keeps its place in the LRU order
        self._on_host.add(ck.tokens)
        self.bytes_held -= ck.nbytes
        self.host_bytes_held += ck.nbytes
        for seg in ck.segments():
            held = self._segments[id(seg)]
            held[2] -= 1
            if not held[2] and not held[3]:
                seg.move_(self.to_host)
                held[3] = True
                self.bytes_held -= seg.nbytes
                self.host_bytes_held += seg.nbytes
        self.spills += 1

    def evict(self, ck: Checkpoint) -> None:
        """Drop `ck` (from either memory), freeing the segments no other checkpoint holds."""
        host = ck.tokens in self._on_host
        del self._entries[ck.tokens]
        self._on_host.discard(ck.tokens)
        self._forget(ck, host)
        self.evictions += 1
        if self.on_evict is not None:
            self.on_evict(ck)

    def _forget(self, ck: Checkpoint, host: bool) -> None:
        if host:
            self.host_bytes_held -= ck.nbytes
        else:
            self.bytes_held -= ck.nbytes
        for seg in ck.segments():
            held = self._segments[id(seg)]
            held[1] -= 1
            held[2] -= not host
            if not held[1]:
                del self._segments[id(seg)]
                if held[3]:
                    self.host_bytes_held -= seg.nbytes
                else:
                    self.bytes_held -= seg.nbytes
            elif not held[2] and not held[3] and self.host_budget_bytes:  # now held on the host alone
                seg.move_(self.to_host)
                held[3] = True
                self.bytes_held -= seg.nbytes
                self.host_bytes_held += seg.nbytes
        self._lengths[len(ck.tokens)] -= 1
        if not self._lengths[len(ck.tokens)]:
            del self._lengths[len(ck.tokens)]

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._entries),
            "hits": self.hits,
            "misses": self.misses,
            "tokens_reused": self.tokens_reused,
            "bytes_held": self.bytes_held,
            "evictions": self.evictions,
            "budget_bytes": self.budget_bytes,
            "host_entries": len(self._on_host),
            "host_bytes_held": self.host_bytes_held,
            "host_budget_bytes": self.host_budget_bytes,
            "spills": self.spills,
        }
