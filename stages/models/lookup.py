"""Prompt lookup: the tokens that followed the latest earlier occurrence of a sequence's suffix.

Owns the one rule both users share, so they cannot drift apart: the `ngram` drafter proposes what it finds, and
dflash2 (version 5) reads it as its block rows' candidate tokens, in serving (`stages/drafters/dflash2.py`) and in
fitting (`stages/fitting/losses.py`, through `lookup_rows`). The longest suffix (n from `max_n` down to `min_n`)
that occurred earlier wins; its latest earlier occurrence proposes the tokens after it, never past the sequence's
end. An index from n-gram to the position after its latest occurrence is extended incrementally, so a lookup costs
O(new tokens x n range), not a scan. `find` may be told where a copy in progress would go on (the ngram drafter:
after its last draft's source): that occurrence wins over the latest where it matches as long a suffix. dflash2's
candidates keep the latest, the rule its block rows were fitted on.
"""

from __future__ import annotations

import torch


class LookupIndex:
    """n-grams of one token sequence -> the position after their latest occurrence, for grams ending before
    position `upto` - 1 (the suffix being looked up never matches itself)."""

    __slots__ = ("grams", "upto")

    def __init__(self):
        self.grams: dict[tuple[int, ...], int] = {}
        self.upto = 0


def lookup(
    tokens: list[int], index: LookupIndex, k: int, min_n: int, max_n: int, end: int | None = None
) -> tuple[list[int], int]:
    """(up to k tokens after the latest earlier occurrence of the longest matching suffix of tokens[:end], the
    suffix's length n; 0 when nothing matched). `index` must have seen only tokens[:end] of this sequence."""
    end = len(tokens) if end is None else end
    at, n = find(tokens, index, min_n, max_n, end)
    return (tokens[at : min(at + k, end)], n) if n else ([], 0)


def find(
    tokens: list[int], index: LookupIndex, min_n: int, max_n: int, end: int, prefer: int | None = None
) -> tuple[int, int]:
    """(the position after an earlier occurrence of the longest suffix of tokens[:end] that occurred earlier, that
    suffix's length n), or (0, 0) when none did. The occurrence is the latest, or `prefer` where the same n tokens
    end there too: a copy in progress goes on from where it was, not from a later repeat of its last few tokens."""
    for stop in range(max(index.upto, min_n), end):
        for n in range(min_n, min(max_n, stop) + 1):
            index.grams[tuple(tokens[stop - n : stop])] = stop
    index.upto = max(index.upto, end)
    for n in range(min(max_n, end), min_n - 1, -1):
        suffix = tuple(tokens[end - n : end])
        at = index.grams.get(suffix)
        if at is not None:
            if (
                prefer is not None
                and n <= prefer < end
                and prefer != at
                and tuple(tokens[prefer - n : prefer]) == suffix
            ):
                return prefer, n
            return at, n
    return 0, 0


def lookup_rows(
    tokens: list[int], anchors: list[int], width: int, min_n: int, max_n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each anchor a (ascending), what `lookup` finds over tokens[:a + 1], the anchor last: candidate tokens
    [A, width] (-1 where none) and the matched suffix length per candidate [A, width] (0 where none)."""
    cand = torch.full((len(anchors), width), -1, dtype=torch.int64)
    level = torch.zeros((len(anchors), width), dtype=torch.int64)
    index = LookupIndex()
    for i, a in enumerate(anchors):
        found, n = lookup(tokens, index, width, min_n, max_n, end=a + 1)
        if found:
            cand[i, : len(found)] = torch.tensor(found)
            level[i, : len(found)] = n
    return cand, level


def lane_candidates(lanes, lookups: dict, width: int, min_n: int, max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What prompt lookup finds after each lane's tokens (its anchor last), as host tensors: candidate tokens
    [lanes, width] (-1 where none) and the matched suffix's length (0 where none). `lookups` maps a slot to (its
    lane, that lane's index): an index is kept while its lane holds the slot and extended by the new tokens only."""
    cand = torch.full((len(lanes), width), -1, dtype=torch.int64)
    level = torch.zeros((len(lanes), width), dtype=torch.int64)
    for i, lane in enumerate(lanes):
        owner, index = lookups.get(lane.slot, (None, None))
        if owner is not lane:
            index = LookupIndex()
            lookups[lane.slot] = (lane, index)
        tokens, n = lookup(lane.tokens, index, width, min_n, max_n)
        if tokens:
            cand[i, : len(tokens)] = torch.tensor(tokens)
            level[i, : len(tokens)] = n
    return cand, level


def trust_option(backend: str, value) -> int:
    """A drafter's `lookup_trust` option checked: where prompt lookup's matched suffix is at least this many tokens
    long, lookup's tokens are the drafts (0: never)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"{backend} option lookup_trust must be an integer >= 0 (0: never draft lookup's tokens), got {value!r}"
        )
    return value
