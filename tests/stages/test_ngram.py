"""Prompt lookup: the longest earlier suffix match proposes what followed its latest occurrence."""

import attrs
import pytest
import torch

from speclane.stages.contract.resources import Resources
from speclane.stages.drafters.ngram import NGram
from speclane.stages.models.lookup import LookupIndex, find


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
        ngram.propose([lane], torch.tensor([t]), (3,), state)
        fresh = LookupIndex()
        find(lane.tokens, fresh, 2, 3, len(lane.tokens))
        assert state[0].grams == fresh.grams and state[0].upto == fresh.upto


def test_a_copy_in_progress_goes_on_from_its_source():
    """The answer copies 10 2 3 4 11 2 3 5 after the prompt; at its second 2 3 the latest earlier 2 3 is the answer's
    own first one (followed by 4), but the copy was at the prompt's second 2 3 (followed by 5)."""
    ngram = NGram({"min_n": 1, "max_n": 2}, "full", Resources(target=None))
    prompt = [10, 2, 3, 4, 11, 2, 3, 5, 12, 10]
    assert ngram.propose([FakeLane(prompt + [2, 3, 4, 11, 2, 3])], torch.tensor([3]), (2,), {}).drafts.tolist() == [
        [4, 11]  # no copy in progress: the latest occurrence
    ]
    state = ngram.new_state(1, 64)
    lane = FakeLane(list(prompt))
    assert ngram.propose([lane], torch.tensor([10]), (3,), state).drafts.tolist() == [[2, 3, 4]]
    lane.tokens += [2, 3, 4, 11]  # three drafts accepted and the target's own next token, the copy's
    assert ngram.propose([lane], torch.tensor([11]), (3,), state).drafts.tolist() == [[2, 3, 5]]
    lane.tokens += [2, 3]  # a round of two (a limit of one, say) ...
    assert ngram.propose([lane], torch.tensor([3]), (1,), state).drafts.tolist() == [[5]]  # ... the copy goes on
    lane.tokens += [7, 2, 3]  # the answer left the copy: the latest occurrence again
    assert ngram.propose([lane], torch.tensor([3]), (1,), state).drafts.tolist() == [[7]]


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
