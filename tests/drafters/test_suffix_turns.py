"""A next turn's lane takes over the tree of the lane whose tokens its prompt begins with (a conversation's earlier
turn), so only what the turn added is taken in: its backlog counts that alone, and it drafts as a tree built from
all its tokens would. The newest ended lanes' trees are kept: SPARES, or one a slot where there are more."""

import pytest

from speclane.stages.contract.resources import Resources
from speclane.stages.drafters.suffix import SPARES, Suffix
from speclane.stages.drafters.suffix_tree import SuffixTree
from tests.drafters.test_suffix_tree import strings
from tests.stages.test_suffix import FakeLane, drafts


def suffix(**options) -> Suffix:
    return Suffix({"cache_tokens": 0, **options}, "full", Resources(target=None))


def test_a_next_turn_grows_its_predecessors_tree():
    backend = suffix()
    state = backend.new_state(1, 256)
    first = FakeLane([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], out_ids=[11, 12])
    assert drafts(backend, [first], (3,), state) == [[]]
    tree = state.lanes[0].tree
    first.out_ids += [4, 5]
    first.finish_reason = "stop"
    backend.observe(state, [], None, None, None)  # the lane ends: its tree is kept, grown to its last token
    assert state.spare == [tree] and tree.tokens == first.tokens
    follow = FakeLane(first.tokens + [20, 21, 3, 4])
    assert backend.backlog(state, [follow]) == (4,)  # only the new turn's tokens
    fresh = drafts(backend, [FakeLane(list(follow.tokens))], (4,), backend.new_state(1, 256))
    assert drafts(backend, [follow], (4,), state) == fresh == [[5, 6]]  # "3 4" matched: 2 drafts at most
    assert state.lanes[0].tree is tree and not state.spare
    whole = SuffixTree(backend.max_depth)
    whole.add(follow.tokens)
    assert strings(tree) == strings(whole)


def test_a_prompt_that_does_not_begin_with_a_kept_tree_builds_its_own():
    backend = suffix()
    state = backend.new_state(1, 256)
    first = FakeLane([1, 2, 3, 4, 5], finish_reason=None)
    drafts(backend, [first], (2,), state)
    first.finish_reason = "length"
    other = FakeLane([1, 2, 3, 9, 5, 6])  # shares a beginning, not the whole of it
    assert backend.backlog(state, [other]) == (6,)
    drafts(backend, [other], (2,), state)
    assert state.lanes[0].tree.tokens == other.tokens and len(state.spare) == 1


@pytest.mark.parametrize("slots", [2, SPARES + 3])
def test_the_newest_ended_trees_are_kept_as_many_as_slots_at_least_spares(slots):
    backend = suffix()
    state = backend.new_state(slots, 256)
    ended = []
    for i in range(2 * max(slots, SPARES)):
        lane = FakeLane([100 + i, 1, 2, 3], slot=i % slots)
        drafts(backend, [lane], (2,), state)
        lane.finish_reason = "stop"
        backend.observe(state, [], None, None, None)
        ended.append(lane)
    assert [t.tokens for t in state.spare] == [x.tokens for x in ended[-max(slots, SPARES) :]]
