"""Prompt lookup (`stages/models/lookup.py`), the rule `ngram` proposes by and dflash2 version 5 reads: fitting's
per-anchor table (`lookup_rows`, one index extended along the sequence) must be what serving finds for the same
prefix from a fresh index, and never look past the anchor."""

import random

import torch

from speclane.stages.models.lookup import LookupIndex, lookup, lookup_rows


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    out = [rng.randrange(12) for _ in range(n // 2)]
    return out + out[5 : 5 + n - len(out)]  # a small vocabulary, then a copy: every suffix length matches somewhere


def test_the_table_is_what_a_fresh_lookup_finds_at_every_anchor():
    tokens = _tokens(120, 0)
    cand, level = lookup_rows(tokens, list(range(len(tokens))), 7, 1, 4)
    lengths = set()
    for a in range(len(tokens)):
        found, n = lookup(tokens[: a + 1], LookupIndex(), 7, 1, 4)
        assert cand[a, : len(found)].tolist() == found and bool((cand[a, len(found) :] == -1).all())
        assert level[a].tolist() == [n] * len(found) + [0] * (7 - len(found))
        lengths.add(n)
    assert lengths == {0, 1, 2, 3, 4}


def test_the_table_never_reads_past_the_anchor():
    tokens = _tokens(80, 1)
    cand, _ = lookup_rows(tokens, list(range(len(tokens))), 7, 1, 4)
    for a in range(len(tokens)):
        changed = tokens[: a + 1] + [99] * (len(tokens) - a - 1)  # the future replaced by a token never seen
        again, _ = lookup_rows(changed, [a], 7, 1, 4)
        assert torch.equal(again[0], cand[a])
        assert 99 not in cand[a].tolist()


def test_an_incremental_index_agrees_with_a_fresh_one():
    """The ngram backend keeps one index per lane and extends it round by round."""
    tokens, index = _tokens(100, 2), LookupIndex()
    for end in range(1, len(tokens) + 1, 3):
        assert lookup(tokens[:end], index, 5, 2, 3) == lookup(tokens[:end], LookupIndex(), 5, 2, 3)
