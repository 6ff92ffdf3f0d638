"""Prompt lookup: the longest earlier suffix match proposes what followed its latest occurrence."""

import attrs
import pytest
import torch

from speclane.stages.contract.resources import Resources
from speclane.stages.drafters.ngram import NGram


@attrs.define(eq=False)
class FakeLane:
    tokens: list
    slot: int = 0


@pytest.mark.parametrize(
    "tokens, k, expected",
    [
        ([1, 2, 3, 4, 9, 1, 2, 3], 3, [4, 9, 1]),  # suffix 1 2 3 seen before: propose what followed
        ([1, 2, 3, 4, 9, 2, 3], 2, [4, 9]),  # shorter suffix 2 3
        ([5, 6, 7], 3, []),  # nothing repeats
        ([1, 2, 1, 3, 1, 2], 4, [1, 3, 1, 2]),  # latest occurrence of the longest suffix (1 2 at 0)
        ([7, 1, 7, 2, 7], 2, [2, 7]),  # latest occurrence of the 1-gram 7 wins over earlier ones
        ([1, 2, 3, 1, 2, 3, 1, 2], 1, [3]),
    ],
)
def test_lookup_case_table(tokens, k, expected):
    ngram = NGram({"min_n": 1, "max_n": 4}, "full", Resources(target=None))
    state = ngram.new_state(1, 64)
    lane = FakeLane(tokens)
    proposal = ngram.propose([lane], torch.tensor([tokens[-1]]), (k,), state)
    assert proposal.draft_len == (len(expected),)
    assert proposal.drafts[0, : len(expected)].tolist() == expected
    assert (proposal.drafts[0, len(expected) :] == -1).all()


def test_incremental_index_matches_a_fresh_one():
    ngram = NGram({"min_n": 2, "max_n": 3}, "full", Resources(target=None))
    state = ngram.new_state(1, 64)
    torch.manual_seed(0)
    lane = FakeLane([])
    for t in torch.randint(0, 5, (200,)).tolist():
        lane.tokens.append(t)
        got = ngram.propose([lane], torch.tensor([t]), (3,), state).drafts[0].tolist()
        fresh = ngram.propose([FakeLane(list(lane.tokens))], torch.tensor([t]), (3,), ngram.new_state(1, 64))
        assert got == fresh.drafts[0].tolist()


def test_limits_per_lane_and_a_new_lane_in_a_slot_starts_fresh():
    ngram = NGram({}, "full", Resources(target=None))
    state = ngram.new_state(2, 64)
    a, b = FakeLane([1, 2, 3, 1, 2], slot=0), FakeLane([4, 4, 4], slot=1)
    p = ngram.propose([a, b], torch.tensor([2, 4]), (0, 2), state)
    # 4 4 last seen ending at position 2: only one token follows it before the end
    assert p.draft_len == (0, 1) and p.drafts.tolist() == [[-1, -1], [4, -1]]
    c = FakeLane([9, 8, 9], slot=1)  # slot 1 reused: nothing of lane b may leak
    p = ngram.propose([c], torch.tensor([9]), (2,), state)
    assert p.drafts.tolist() == [[8, 9]]


@pytest.mark.parametrize("options, message", [({"min_n": 0}, "1 <= min_n <= max_n"), ({"n": 3}, "not ['n']")])
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        NGram(options, "full", Resources(target=None))
