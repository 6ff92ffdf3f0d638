"""The oracle control: drafts read from the continuations handed to it with `replay`, nothing read from Resources
after it is built (the round contract test runs it behind the guard)."""

import pytest
import torch

from speclane.stages.contract.resources import Resources
from speclane.stages.drafters import build_backend
from tests.stages.conftest import make_lane


def _oracle(**options):
    return build_backend("oracle", options, "full", Resources(target=None))


def _drafts(oracle, lanes, limits):
    proposal = oracle.propose(lanes, torch.zeros(len(lanes), dtype=torch.int64), limits, None)
    return proposal.drafts.tolist(), proposal.draft_len


def test_drafts_continue_each_lane_from_its_output_so_far():
    oracle = _oracle()
    oracle.replay({0: [10, 11, 12, 13, 14], None: [20, 21, 22, 23]})
    lanes = [make_lane(slot=0, out=[10]), make_lane(slot=1, out=[20, 21]), make_lane(slot=2, rid="x", out=[])]
    # lane 0: its own table after one token; lane 1: the shared one (key None) after two; lane 2 by the same rule
    assert _drafts(oracle, lanes, (3, 5, 1)) == (
        [[11, 12, 13, -1, -1], [22, 23, -1, -1, -1], [20, -1, -1, -1, -1]],
        (3, 2, 1),
    )


def test_a_request_without_a_continuation_gets_no_drafts():
    oracle = _oracle()
    assert _drafts(oracle, [make_lane(slot=0)], (4,)) == ([[-1, -1, -1, -1]], (0,))  # nothing replayed yet
    oracle.replay({1: [5, 6]})
    assert _drafts(oracle, [make_lane(slot=0)], (2,)) == ([[-1, -1]], (0,))


def test_corrupt_swaps_drafts_for_the_next_token_and_repeats():
    oracle = _oracle(corrupt=1.0, seed=2)
    oracle.replay({0: [7, 8, 9]})
    assert _drafts(oracle, [make_lane(slot=0)], (3,))[0] == [[8, 9, 10]]
    half = _oracle(corrupt=0.5, seed=2)
    half.replay({None: list(range(100, 164))})
    lane = make_lane(slot=0)
    first = _drafts(half, [lane], (64,))[0][0]
    assert first == _drafts(half, [lane], (64,))[0][0]  # a hash of request and position: the same every time
    assert 0 < sum(d != t for d, t in zip(first, range(100, 164))) < 64


def test_replay_replaces_the_table():
    oracle = _oracle()
    oracle.replay({0: [1, 2]})
    oracle.replay({0: [3, 4]})
    assert _drafts(oracle, [make_lane(slot=0)], (2,))[0] == [[3, 4]]


@pytest.mark.parametrize(
    "answers, error, words",
    [
        ([[1, 2]], TypeError, "answers must map request id -> token ids, got list"),
        ({0: "abc"}, ValueError, r"answers\[0\] must be token ids"),
        ({"r": [1, -2]}, ValueError, r"answers\['r'\] must be token ids \(ints >= 0\)"),
        ({0: [1.5]}, ValueError, r"answers\[0\] must be token ids"),
    ],
)
def test_bad_answers_are_refused_naming_the_entry(answers, error, words):
    with pytest.raises(error, match=words):
        _oracle().replay(answers)


def test_max_drafts_widens_the_cap_past_the_draft_stages():
    assert _oracle().draft_cap() == 0  # the draft stage's draft tokens
    assert _oracle(max_drafts=15).draft_cap() == 15
    assert _oracle(max_drafts=5).draft_cap() == 0  # within the draft stage's own
    with pytest.raises(ValueError, match="max_drafts"):
        _oracle(max_drafts=64)
