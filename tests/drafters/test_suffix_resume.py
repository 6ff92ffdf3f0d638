"""After the target puts its own token where a long match's draft stood (an edit of one token: `# 3.` for `# 2.`),
the suffix drafter drafts on as if the refused draft had been taken, from the lane's own tree, and learns what such
drafts are worth in a calibration bucket of their own, by their first draft; a short match's refused draft is not
resumed."""

import pytest

from speclane.stages.drafters.suffix_cache import MATCH_BUCKETS
from speclane.stages.drafters.suffix_tree import EDIT_MATCH, LONG_MATCH, RESUME_MATCH
from tests.stages.test_suffix import FakeLane, drafts, suffix

ECHO = list(range(50, 50 + LONG_MATCH + 4))  # a context long enough to be an echo
REST = list(range(80, 100))  # what followed it, after token 1


def echo_lane() -> FakeLane:
    """A lane whose prompt holds ECHO, 1, REST, then ECHO again: the trees draft 1 and REST."""
    return FakeLane(ECHO + [1] + REST + [5] + ECHO)


def test_a_substituted_draft_is_resumed_from_the_lanes_own_tree():
    backend = suffix(cache_tokens=0)
    state = backend.new_state(1, 256)
    lane = echo_lane()
    assert drafts(backend, [lane], (8,), state) == [[1] + REST[:7]]
    lane.out_ids.append(2)  # the target's own token in place of the first draft
    assert drafts(backend, [lane], (8,), state) == [REST[:8]]  # drafted as if 1 had been taken
    draft = state.found[lane.slot][3]
    assert draft.resume and draft.drafts == tuple(REST[:8])
    resume = len(MATCH_BUCKETS) + 1
    assert state.calibration.expected[resume] == 0.0  # not settled before a round ran
    lane.out_ids += REST[:8] + [7]  # every resumed draft held, then the target's token
    drafts(backend, [lane], (8,), state)
    # settled by its first draft: whether the edit was one token (the rest is the echo's path)
    assert state.calibration.accepted[resume] == 1.0 and state.calibration.expected[resume] == 1.0
    assert state.calibration.factor(0, resume=True) > state.calibration.factor(0)  # the prior, for a match of 0


def test_a_short_matchs_refused_draft_is_not_resumed():
    backend = suffix(cache_tokens=0)
    state = backend.new_state(1, 256)
    lane = FakeLane([1, 2, 3, 4, 9, 1, 2, 3])
    assert drafts(backend, [lane], (3,), state) == [[4, 9, 1]]
    lane.out_ids.append(100)
    assert drafts(backend, [lane], (3,), state) == [[]]  # as if 4 were taken would draft 9 1 2: not from 3 tokens
    assert not state.outcomes.refused


@pytest.mark.parametrize("m", [EDIT_MATCH - 1, EDIT_MATCH])
def test_a_path_after_a_match_shorter_than_an_echo_is_resumed_from_EDIT_MATCH_tokens(m):
    """A conversation's next turn: its last answer follows the same few tokens of the user's message, fewer than an
    echo's, and the target edits one token of it: resumed where the match held EDIT_MATCH tokens, not below."""
    backend = suffix(cache_tokens=0)
    state = backend.new_state(1, 256)
    tail = list(range(50, 50 + m))
    lane = FakeLane([7] + tail + [1] + REST + [5, 8] + tail)
    assert drafts(backend, [lane], (8,), state) == [([1] + REST)[:m]]  # `spec_factor`: a draft a matched token
    lane.out_ids.append(2)
    assert drafts(backend, [lane], (8,), state) == ([REST[:8]] if m >= EDIT_MATCH else [[]])
    assert state.found[lane.slot][3].resume == (m >= EDIT_MATCH)


def test_a_resume_does_not_beat_an_equal_draft_of_the_lanes_real_tokens():
    backend = suffix(cache_tokens=0)
    state = backend.new_state(1, 256)
    lane = FakeLane(ECHO + [1] + REST + [5] + ECHO + [2] + REST[:2] + [5] + ECHO)  # `5 ECHO` was followed by 2
    assert drafts(backend, [lane], (8,), state) == [[2] + REST[:2] + [5] + ECHO[:4]]
    lane.out_ids.append(1)  # the target's 1 for the draft 2: as if 2 were taken drafts as long a path
    assert drafts(backend, [lane], (8,), state) == [REST[:8]]  # what followed `ECHO 1`, the lane's real tokens
    assert not state.found[lane.slot][3].resume


def test_a_path_cut_by_the_plan_is_resumed_where_the_target_left_it():
    backend = suffix(cache_tokens=0)
    state = backend.new_state(1, 256)
    lane = echo_lane()
    backend.chances(state, [lane], (8,))  # the plan reads the path at the cap, then gives the lane two drafts
    assert drafts(backend, [lane], (2,), state) == [[1, REST[0]]]
    lane.out_ids += [1, REST[0], 99]  # both held; the target's 99 where the path went on with REST[1]
    assert drafts(backend, [lane], (8,), state) == [REST[2:10]]
    assert state.found[lane.slot][3].resume


def test_a_resume_the_plan_gave_no_rows_is_settled_by_its_first_draft():
    backend = suffix(cache_tokens=0)
    state = backend.new_state(1, 256)
    lane = echo_lane()
    drafts(backend, [lane], (8,), state)
    lane.out_ids.append(2)
    backend.chances(state, [lane], (8,))  # the resume is found, and the plan drafts none of it
    resume = len(MATCH_BUCKETS) + 1
    lane.out_ids.append(REST[0])  # the target's token: the resume's first draft would have held
    drafts(backend, [lane], (8,), state)
    assert state.calibration.expected[resume] == 1.0 and state.calibration.accepted[resume] == 1.0


def test_a_resume_drafts_as_far_as_its_path_goes_after_a_short_match_of_its_own():
    """The echo's long match, in another request's answer, stands for the resume's: the lane's own tree matches the
    path's token after RESUME_MATCH - 1 tokens of its own context, and still drafts to the limit (`spec_factor` would
    give four)."""
    backend = suffix()
    state = backend.new_state(1, 256)
    state.cache.add(ECHO + [1] + list(range(200, 220)))  # an earlier answer: the echo went on with 1 there
    own = ECHO[-(RESUME_MATCH - 1) :] + [1]
    lane = FakeLane([7] + own + REST + [5] + ECHO)  # this lane wrote 1 REST after the echo's last tokens only
    assert drafts(backend, [lane], (8,), state) == [[1] + list(range(200, 207))]
    lane.out_ids.append(2)
    assert drafts(backend, [lane], (8,), state) == [REST[:8]]
    assert state.found[lane.slot][3].match == RESUME_MATCH


def test_a_resume_that_matches_fewer_tokens_of_its_own_is_not_taken():
    """Where the lane's own tree holds the path's token only after fewer than RESUME_MATCH tokens of its context, what
    followed there is the lane's text elsewhere, not the echo: no resume."""
    backend = suffix()
    state = backend.new_state(1, 256)
    state.cache.add(ECHO + [1] + list(range(200, 220)))
    lane = FakeLane([7, 8] + ECHO[-(RESUME_MATCH - 2) :] + [1] + REST + [5] + ECHO)
    assert drafts(backend, [lane], (8,), state) == [[1] + list(range(200, 207))]
    lane.out_ids.append(2)
    assert drafts(backend, [lane], (8,), state) == [[]]
    assert not state.found[lane.slot][3].resume
