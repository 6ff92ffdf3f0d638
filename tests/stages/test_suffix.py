"""The suffix backend: drafts from the lane's own tokens and from finished requests; the cache of finished requests
stays within its token budget; a slot's new lane starts from its own tokens alone."""

from pathlib import Path

import attrs
import pytest
import torch

from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.resources import Resources
from speclane.stages.drafters import SPEC_BACKENDS, backend_class
from speclane.stages.drafters.ngram import NGram
from speclane.stages.drafters.suffix import CACHE_TOKENS, MAX_DRAFTS, WIDE_COST, WIDE_DRAFTS, Suffix


@attrs.define(eq=False)
class FakeLane:
    prompt_ids: list
    out_ids: list = attrs.field(factory=list)
    slot: int = 0
    finish_reason: str | None = None

    @property
    def tokens(self):
        return self.prompt_ids + self.out_ids


def suffix(**options) -> Suffix:
    return Suffix(options, "full", Resources(target=None))


def drafts(backend, lanes, limits, state) -> list[list[int]]:
    anchors = torch.tensor([lane.tokens[-1] for lane in lanes])
    p = backend.propose(lanes, anchors, limits, state)
    return [p.drafts[i, :n].tolist() for i, n in enumerate(p.draft_len)]


def test_suffix_is_a_spec_backend():
    assert "suffix" in SPEC_BACKENDS and backend_class("suffix") is Suffix
    assert suffix().cache_tokens == CACHE_TOKENS


@pytest.mark.parametrize(
    "tokens, k, expected",
    [
        ([1, 2, 3, 4, 9, 1, 2, 3], 3, [4, 9, 1]),  # 1 2 3 seen before: what followed it
        ([5, 6, 7], 3, []),  # nothing repeats
        ([1, 2, 3, 4, 9, 1, 2, 3], 0, []),  # a lane with no room drafts nothing
        ([1, 2, 3, 1, 2, 3, 1, 2], 1, [3]),
    ],
)
def test_own_tokens_case_table(tokens, k, expected):
    backend = suffix()
    assert drafts(backend, [FakeLane(tokens)], (k,), backend.new_state(1, 64)) == [expected]


def test_a_finished_request_drafts_for_the_next_where_prompt_lookup_finds_nothing():
    backend, ngram = suffix(), NGram({}, "full", Resources(target=None))
    state = backend.new_state(1, 64)
    first = FakeLane([10, 11, 12], out_ids=[20, 21, 22, 23, 24, 25, 26, 27])
    assert drafts(backend, [first], (3,), state) == [[]]
    first.finish_reason = "stop"
    # a new request in the same slot whose answer starts as the first one's did
    second = FakeLane([30, 31, 32], out_ids=[20, 21, 22])
    assert drafts(ngram, [second], (4,), ngram.new_state(1, 64)) == [[]]
    assert drafts(backend, [second], (4,), state) == [[23, 24, 25]]  # a 3-token match drafts 3 at most
    assert drafts(backend, [second], (2,), state) == [[23, 24]]  # and never past the lane's limit


def test_forget_drops_what_finished_requests_taught_and_keeps_running_lanes():
    backend = suffix()
    state = backend.new_state(2, 64)
    dropped = []
    state.cache.on_drop = dropped.append
    first = FakeLane([10, 11, 12], out_ids=[20, 21, 22, 23, 24, 25, 26, 27])
    running = FakeLane([1, 2, 3, 4, 9, 1, 2, 3], slot=1)
    drafts(backend, [first, running], (3, 3), state)
    first.finish_reason = "stop"
    backend.forget(state)
    assert state.cache.tokens == 0 and state.cache.tree.held() == 0 and not state.spare and len(dropped) == 1
    again = FakeLane([30, 31, 32], out_ids=[20, 21, 22])  # what drafted [23, 24, 25] before forgetting
    assert drafts(backend, [again, running], (3, 3), state) == [[], [4, 9, 1]]


def test_a_reused_slot_starts_without_the_old_lanes_tree():
    backend = suffix(cache_tokens=0)  # no cache: only the lane's own tree could draft
    state = backend.new_state(1, 64)
    old = FakeLane([1, 2, 3, 4, 1, 2, 3])
    assert drafts(backend, [old], (3,), state) == [[4, 1, 2]]
    old.finish_reason = "length"
    new = FakeLane([9, 1, 2, 3])
    assert drafts(backend, [new], (3,), state) == [[]]
    tree = state.lanes[0].tree
    assert state.lanes[0].owner is new and tree.tokens == [9, 1, 2, 3] and tree.held() == 4


def test_the_cache_keeps_within_its_budget_the_newest_requests_first():
    budget = 100
    backend = suffix(cache_tokens=budget)
    state = backend.new_state(2, 64)
    seqs = []
    for i in range(60):
        lane = FakeLane([i % 7, 100 + i], out_ids=[200 + i] * (i % 9 + 1), slot=i % 2)
        backend.observe(state, [lane], None, None, None)
        lane.finish_reason = "stop" if i % 3 else "length"
        seqs.append(tuple(lane.tokens))
    backend.observe(state, [], None, None, None)
    cache = state.cache
    assert cache.tokens == cache.tree.held() <= budget
    kept = list(cache.held)
    assert kept == seqs[len(seqs) - len(kept) :]  # the newest, in order
    assert cache.tokens + len(seqs[-len(kept) - 1]) > budget  # and as many as fit
    nodes, stack = 0, [cache.tree.root]
    while stack:
        node = stack.pop()
        nodes += 1
        stack.extend(node.children.values())
    assert nodes <= 2 * budget + 1  # nothing of a dropped request is left in the tree


def test_a_request_longer_than_the_budget_keeps_its_end_and_errors_are_not_kept():
    backend = suffix(cache_tokens=5)
    state = backend.new_state(1, 64)
    long = FakeLane(list(range(10)), finish_reason=None)
    backend.observe(state, [long], None, None, None)
    long.finish_reason = "stop"
    failed = FakeLane([40, 41], slot=0)
    backend.observe(state, [failed], None, None, None)
    assert list(state.cache.held) == [(5, 6, 7, 8, 9)]
    failed.finish_reason = "error"
    backend.observe(state, [], None, None, None)
    assert list(state.cache.held) == [(5, 6, 7, 8, 9)] and not state.lanes


def test_the_cache_takes_each_answer_after_the_end_of_its_prompt_that_a_path_holds():
    backend = suffix(max_depth=4)  # a path: 3 tokens of context and a draft
    state = backend.new_state(1, 64)
    lane, short = FakeLane(list(range(10)), out_ids=[20, 21]), FakeLane([30], out_ids=[31], slot=1)
    backend.observe(state, [lane, short], None, None, None)
    lane.finish_reason = short.finish_reason = "stop"
    backend.observe(state, [], None, None, None)
    assert list(state.cache.held) == [(7, 8, 9, 20, 21), (30, 31)]


def test_backlog_is_the_tokens_not_yet_in_the_lanes_tree():
    backend = suffix()
    state = backend.new_state(2, 64)
    a, b = FakeLane([1, 2, 3]), FakeLane([4, 5], slot=1)
    assert backend.backlog(state, [a, b]) == (3, 2)
    backend.catch_up(state, [a])
    a.out_ids.append(7)
    assert backend.backlog(state, [a, b]) == (1, 2)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"cache_tokens": -1}, "option cache_tokens must be an integer >= 0"),
        ({"cache_tokens": 1.5}, "option cache_tokens must be an integer >= 0"),
        ({"max_depth": 1}, "option max_depth must be an integer from 2 to 256"),
        ({"min_prob": 2}, "option min_prob must be a number from 0 to 1"),
        ({"spec_factor": 0}, "option spec_factor must be a number above 0"),
        ({"cache": 3}, r"not \['cache'\]"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        suffix(**options)


def test_the_documented_defaults_are_the_backends():
    root = Path(__file__).resolve().parents[2]
    b = suffix()
    table = (
        f"options.suffix = {{ cache_tokens = {b.cache_tokens}, max_depth = {b.max_depth}, "
        f"min_prob = {b.min_prob}, spec_factor = {b.spec_factor} }}"
    )
    assert table in (root / "docs" / "spec-format.md").read_text()
    doc = " ".join((root / "docs" / "spec-format.md").read_text().split())
    assert (
        f"unset, it is {WIDE_DRAFTS} where this machine's measured pass of {WIDE_DRAFTS + 1} rows costs at most "
        f"{WIDE_COST} times one of {MAX_DRAFTS + 1}, else {MAX_DRAFTS})" in doc
    )
    assert f"--suffix-cache-tokens` (default {CACHE_TOKENS:,}" in (root / "README.md").read_text()


def test_chances_are_the_paths_ratios_and_the_proposal_is_their_draft():
    """`chances` gives each draft's chance given the ones before it (their running product is the path's own
    estimate times the calibration's factor for its match; `expected` is the trees' own before any evidence); the
    proposal at a smaller limit is the first drafts of the draft weighed."""
    backend = suffix()
    state = backend.new_state(1, 64)
    lane = FakeLane([1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 7, 8, 1, 2, 3])  # 1 2 3 -> 4 twice; then 5 or 7
    (draft,) = backend.drafts(state, [lane], (4,))
    (chances,) = backend.chances(state, [lane], (4,))
    assert draft.drafts[:2] == (4, 5) or draft.drafts[:2] == (4, 7)
    factor = state.calibration.factor(draft.match)  # no evidence yet: the prior
    running = [c * factor for c in draft.chances]
    product, got = 1.0, []
    for c in chances:
        product *= c
        got.append(product)
    assert got == pytest.approx(running)
    assert backend.expected(state, draft) == pytest.approx(draft.score * state.calibration.factor(draft.match, 1.0))
    assert chances[1] == pytest.approx(0.5)  # 4 was followed by 5 once and by 7 once
    assert drafts(backend, [lane], (1,), state) == [list(draft.drafts[:1])]
    assert backend.chances(state, [FakeLane([5, 6, 7])], (4,)) == ((),)  # nothing repeats: no draft to weigh


@pytest.mark.parametrize("value", [0, 64, 2.5, True])
def test_max_drafts_is_checked_and_sets_the_draft_cap(value):
    with pytest.raises(ValueError, match="option max_drafts must be an integer from 1 to 63"):
        suffix(max_drafts=value)
    assert suffix(max_drafts=7).draft_cap() == 0 and suffix(max_drafts=11).draft_cap() == 11
    assert suffix(max_drafts=15).max_depth == 30 and suffix(max_drafts=15, max_depth=20).max_depth == 20


def test_the_default_cap_follows_the_measured_pass_cost():
    """Unset, `max_drafts` is 31 where a 32-row pass costs at most 1.4 times a 16-row one, else 15; 31 before the
    cost is probed (the probe then measures passes that wide); a set value stands whatever the cost."""
    rows = (1, 8, 16, 32, 64)
    cheap = RoundCosts(rows, (0.018, 0.021, 0.023, 0.029, 0.043))  # the tiles' shape: 32 rows 1.26x 16
    dear = RoundCosts(rows, (0.013, 0.014, 0.021, 0.036, 0.066))  # 32 rows 1.71x 16
    b = suffix()
    assert b.max_depth == 2 * WIDE_DRAFTS  # a 31-token path after a 31-token match
    assert b.draft_cap() == b.draft_cap(RoundCosts()) == WIDE_DRAFTS == b.draft_cap(cheap) == 31
    assert b.draft_cap(dear) == MAX_DRAFTS == 15
    assert b.draft_cap(RoundCosts(rows[:3], cheap.seconds[:3])) == 15  # not probed that wide: no wider
    edge = RoundCosts((1, 16, 32), (0.01, 0.02, 0.02 * WIDE_COST))
    assert b.draft_cap(edge) == 31 and b.draft_cap(RoundCosts((1, 16, 32), (0.01, 0.02, 0.0281))) == 15
    assert suffix(max_drafts=15).draft_cap(cheap) == 15 and suffix(max_drafts=31).draft_cap(dear) == 31


def test_the_trees_depth_follows_the_cap_the_pass_cost_gives():
    """Unset, the depth is twice the cap: 62 before the cost is known, 30 where it gives 15 drafts (each new token
    steps every open suffix, so depth the cap cannot use is paid every round), and back to 62 where it gives 31. The
    finished requests' tree is made again at that depth with the same requests, and drafts as before; a set
    `max_depth` stands."""
    rows = (1, 8, 16, 32, 64)
    dear = RoundCosts(rows, (0.013, 0.014, 0.021, 0.036, 0.066))
    cheap = RoundCosts(rows, (0.018, 0.021, 0.023, 0.029, 0.043))
    backend = suffix()
    state = backend.new_state(1, 64)
    first = FakeLane([1, 2, 3], [4, 9, 8, 7, 6, 5])
    drafts(backend, [first], (4,), state)
    first.finish_reason = "stop"
    assert backend.max_depth == 2 * WIDE_DRAFTS and state.cache.tree.depth == 62
    assert backend.draft_cap(dear) == MAX_DRAFTS and backend.max_depth == 2 * MAX_DRAFTS
    second = FakeLane([7, 1, 2, 3, 4])
    assert drafts(backend, [second], (4,), state) == [[9, 8, 7, 6]]
    assert state.cache.tree.depth == 30 and state.lanes[0].tree.depth == 30
    assert state.cache.tree.held() == 9 and state.cache.tree.occurrences([4, 9, 8]) == 1
    assert backend.draft_cap(cheap) == WIDE_DRAFTS and backend.max_depth == 62
    kept = suffix(max_depth=40)
    assert kept.draft_cap(dear) == MAX_DRAFTS and kept.max_depth == 40
    assert suffix(max_drafts=15).draft_cap(cheap) == 15 and suffix(max_drafts=15).max_depth == 30
