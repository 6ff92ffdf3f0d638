"""The chained backends (suffix+mtp, suffix+dflash2): registered by name with their parts' options; per lane the
suffix drafts where their expected accepted drafts beat the model drafter's expectation times `trust`, the model
drafter elsewhere where what it adds pays for its measured time; a lane the trees draft leaves the network's window
rows queued (out of the backlog, not caught up), yet the window takes every committed row once it drafts."""

import collections

import attrs
import pytest
import torch

from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.resources import Resources
from speclane.stages.drafters import CHAINS, SPEC_BACKENDS, backend_class, build_backend
from speclane.stages.drafters.chain import SuffixDFlash2, SuffixMtp
from speclane.stages.drafters.suffix import Suffix
from tests.drafters.conftest import write_drafter
from tests.round.conftest import engine, prompt, requests
from tests.stages.test_suffix import FakeLane


@attrs.define(eq=False)
class ModelLane(FakeLane):
    kv_len: int = 0  # what a model drafter reads of a lane besides its slot


@pytest.fixture(scope="module")
def files(tiny, tmp_path_factory):
    directory = tmp_path_factory.mktemp("chain-drafters")
    for name in ("mtp", "dflash2"):
        write_drafter(name, tiny, directory)
    return directory


def chain(name, tiny, files, **options):
    return build_backend(name, {"path": str(files), **options}, "full", Resources(target=tiny))


def test_the_chains_are_spec_backends_with_the_suffix_row_budget():
    assert set(CHAINS) <= set(SPEC_BACKENDS)
    assert backend_class("suffix+mtp") is SuffixMtp and backend_class("suffix+dflash2") is SuffixDFlash2
    assert SuffixMtp.default_rows == Suffix.default_rows == 0 and SuffixDFlash2.default_rows == 0


def test_options_go_to_their_part(tiny, files):
    b = chain("suffix+dflash2", tiny, files, cache_tokens=77, min_prob=0.3, lookup_trust=0, trust=2)
    assert (b.suffix.cache_tokens, b.suffix.min_prob, b.model.lookup_trust, b.trust) == (77, 0.3, 0, 2.0)
    assert b.taps == b.model.taps and b.taps and b.files == b.model.files


@pytest.mark.parametrize(
    "options, message",
    [
        ({"trust": -1}, "option trust must be a number >= 0"),
        ({"trust": True}, "option trust must be a number >= 0"),
        ({"cache_tokens": -1}, "option cache_tokens must be an integer >= 0"),
        ({"corrupt": 1}, r"not \['corrupt'\]"),  # the oracle's option, not suffix+mtp's
    ],
)
def test_bad_options(tiny, files, options, message):
    with pytest.raises(ValueError, match=message):
        chain("suffix+mtp", tiny, files, **options)


@pytest.mark.parametrize(
    "trust, expected",
    [
        (1.0, ([[4, 9, 1]], [[]], (0, 3))),  # a 3-token repeat scores 3 > the model's 0.875; a random lane: model
        (0.0, ([[4, 9, 1]], [[]], (0, 3))),  # 0: the trees wherever they find a continuation
        (10.0, ([[]], [[]], (3, 3))),  # a demanding trust leaves both lanes to the model
    ],
)
def test_each_lane_goes_to_the_suffix_trees_where_they_are_confident(tiny, files, trust, expected):
    b = chain("suffix+mtp", tiny, files, trust=trust, cache_tokens=0)
    state = b.new_state(2, 64)
    lanes = [FakeLane([1, 2, 3, 4, 9, 1, 2, 3]), FakeLane([5, 6, 7, 8], slot=1)]
    assert state.rates.expected(lanes[1], 3) == pytest.approx(0.5 + 0.25 + 0.125)  # untrained file: the prior 1/2
    rows, rest = b.choose(state, lanes, (3, 3))
    assert (rows[:1], rows[1:], rest) == expected
    assert state.rounds == {"suffix": 1 if rows[0] else 0, "model": sum(1 for k in rest if k)}


def test_a_lane_with_no_room_drafts_from_neither(tiny, files):
    b = chain("suffix+mtp", tiny, files, trust=0)
    state = b.new_state(1, 64)
    assert b.choose(state, [FakeLane([1, 2, 3, 1, 2])], (0,)) == ([[]], (0,))


@pytest.mark.parametrize("name", ["suffix+mtp", "suffix+dflash2"])
def test_the_model_drafter_takes_every_committed_row_while_the_trees_draft(tiny, files, name):
    # trust 0 and a prompt that repeats one phrase: the trees draft every round; the network never does, yet its
    # window holds every committed position, as if it had drafted them all
    eng = engine(tiny, name, k=4, max_lanes=1, options={"path": str(files), "trust": 0})
    phrase = prompt(6, seed=4)
    (got,) = eng.generate(requests([phrase * 5], max_tokens=16))
    state, lane = eng.drafter_state, eng.retired[-1]
    assert state.rounds["suffix"] > 0 and state.rounds["model"] == 0
    assert got.spec["accepted"] > 0
    eng.drafter.catch_up(state)
    assert int(state.model.window.count[lane.slot]) == lane.kv_len


def test_drafts_from_both_parts_in_one_round(tiny, files):
    b = chain("suffix+mtp", tiny, files, cache_tokens=0)
    eng = engine(tiny, "suffix+mtp", k=3, max_lanes=2, options={"path": str(files), "cache_tokens": 0})
    eng.drafter_state.costs.clock = lambda: 0.0  # the network's time reads as free: whatever it adds pays
    repeat, plain = prompt(5, seed=8) * 4, prompt(12, seed=9)
    eng.generate(requests([repeat, plain], max_tokens=10))
    assert eng.drafter_state.rounds["suffix"] > 0 and eng.drafter_state.rounds["model"] > 0
    # a merged proposal: the suffix lane's row from the trees, the other's from the network, -1 past each length
    state = b.new_state(2, 64)
    lanes = [ModelLane([1, 2, 3, 4, 9, 1, 2, 3], kv_len=7), ModelLane([5, 6, 7, 8], slot=1, kv_len=3)]
    rows, rest = b.choose(b.new_state(2, 64), lanes, (3, 2))
    assert rows == [[4, 9, 1], []] and rest == (0, 2)
    with torch.no_grad():
        b.model.claim(state.model, lanes)
        p = b.propose(lanes, torch.tensor([3, 8]), (3, 2), state)
    assert p.draft_len == (3, 2) and p.drafts[0].tolist() == [4, 9, 1] and p.q is None
    assert (p.drafts[1, :2] >= 0).all() and p.drafts[1, 2] == -1


@pytest.mark.parametrize(
    "proposal_s, expected",
    [
        (0.05, ([[4, 9, 1], []], (0, 0))),  # the network at 5 rounds a proposal: its 0.875 drafts never pay
        (0.001, ([[4, 9, 1], []], (0, 3))),  # at a tenth of a round they do, where the trees found nothing
    ],
)
def test_the_network_drafts_only_where_what_it_adds_pays_for_its_time(tiny, files, proposal_s, expected):
    b = chain("suffix+mtp", tiny, files, cache_tokens=0)
    state = b.new_state(2, 64)
    state.costs.proposals.append(proposal_s)
    state.costs.periods.append(0.01)  # a round without the network: 10 ms
    lanes = [FakeLane([1, 2, 3, 4, 9, 1, 2, 3]), FakeLane([5, 6, 7, 8], slot=1)]
    assert b.choose(state, lanes, (3, 3)) == expected


@attrs.define(eq=False)
class RoomLane(ModelLane):
    draft_room: int = 0  # drafts the lane can still use: its answer's tokens left, less one


@pytest.mark.parametrize("room, expected", [(200, (0, 3)), (3, (0, 0))])
def test_the_networks_catch_up_is_spread_over_the_rounds_a_lane_has_left(tiny, files, room, expected):
    """300 window rows to project cost three rounds: charged to one round the network never pays (and a lane the
    trees held long enough would never get it); spread over the ~107 rounds a 200-token answer has left at its rate
    it pays, not over the two a 4-token one has."""
    b = chain("suffix+mtp", tiny, files, cache_tokens=0)
    state = b.new_state(2, 64)
    state.costs.proposals.append(0.001)  # a tenth of a round
    state.costs.periods.append(0.01)
    state.costs.rows, state.costs.row_seconds = 100, 0.01  # a window row: a hundredth of a round
    state.model.queue.queued_rows = lambda slot: 300 if slot == 1 else 0
    lanes = [RoomLane([1, 2, 3, 4, 9, 1, 2, 3], draft_room=room), RoomLane([5, 6, 7, 8], slot=1, draft_room=room)]
    assert b.choose(state, lanes, (3, 3)) == ([[4, 9, 1], []], expected)


def test_a_lane_the_trees_draft_leaves_the_networks_rows_queued(tiny, files):
    b = chain("suffix+mtp", tiny, files, cache_tokens=0, trust=0)
    state = b.new_state(2, 64)
    repeat, plain = ModelLane([1, 2, 3, 4, 9, 1, 2, 3], kv_len=7), ModelLane([5, 6, 7, 8], slot=1, kv_len=3)
    queued = {0: 7, 1: 3}
    state.model.queue.queued_rows = lambda slot: queued[slot]  # rows the network has yet to project
    assert b.backlog(state, [repeat, plain]) == (0, 3)  # the trees took their tokens in; the network only for plain
    caught = []
    b.model.catch_up = lambda st, lanes=None: caught.append(lanes)
    b.catch_up(state, [repeat, plain])
    assert caught == [[plain]]


def test_the_rounds_choice_holds_for_the_drafting_lanes_alone(tiny, files):
    """The plan's chances over all the round's lanes choose who drafts each; the backlog and the catch-up of the
    drafting lanes keep that choice, and the proposal weighs the same lanes. Over eight lanes mtp's row budget gives
    the network none, so the trees keep every lane; weighed alone, two lanes the trees found nothing for would give
    it three drafts each and be caught up for a proposal that then never came."""
    b = chain("suffix+mtp", tiny, files, cache_tokens=0)
    state = b.new_state(8, 64)
    lanes = [
        ModelLane([1, 2, 3, 4, 9, 1, 2, 3] if i % 2 == 0 else [5 + i, 6 + i, 7 + i], slot=i, kv_len=3) for i in range(8)
    ]
    b.chances(state, lanes, (3,) * 8)
    state.model.queue.queued_rows = lambda slot: 3
    assert b.backlog(state, lanes) == (0,) * 8  # none of the network's rows is charged
    caught = []
    b.model.catch_up = lambda st, lanes=None: caught.append(lanes)
    b.catch_up(state, [lanes[1], lanes[3]])
    assert caught == []
    rows, rest = b.choose(state, lanes, (2, 3, 2, 3, 2, 3, 2, 3))
    assert rest == (0,) * 8 and rows[0] == [4, 9] and rows[1] == []
    fresh = b.new_state(8, 64)  # no choice made this round: the two lanes weighed alone go to the network
    fresh.model.queue.queued_rows = lambda slot: 3
    b.catch_up(fresh, [lanes[1], lanes[3]])
    assert caught == [[lanes[1], lanes[3]]]


@pytest.mark.parametrize("name", ["suffix+mtp", "suffix+dflash2"])
def test_the_window_is_projected_only_when_the_network_drafts(tiny, files, name):
    # trust 0 and a repeated phrase: the trees draft every round, so the network's rows stay queued (never projected)
    # until something asks for its window
    eng = engine(tiny, name, k=4, max_lanes=1, options={"path": str(files), "trust": 0})
    eng.generate(requests([prompt(6, seed=4) * 5], max_tokens=16))
    state, lane = eng.drafter_state, eng.retired[-1]
    assert state.rounds["model"] == 0 and int(state.model.window.count[lane.slot]) == 0
    eng.drafter.catch_up(state)
    assert int(state.model.window.count[lane.slot]) == lane.kv_len


@pytest.mark.parametrize(
    "proposal_s, expected",
    [
        (0.05, ((0.5, 1.0, 1.0), ())),  # the network does not pay: the trees' lane by its path, the other none
        (0.001, ((0.5, 1.0, 1.0), (0.5, 0.5, 0.5))),  # it pays: the other lane by the network's learnt rate
    ],
)
def test_chances_are_those_of_the_part_that_drafts_each_lane(tiny, files, proposal_s, expected):
    b = chain("suffix+mtp", tiny, files, cache_tokens=0)
    state = b.new_state(2, 64)
    state.costs.proposals.append(proposal_s)
    state.costs.periods.append(0.01)
    lanes = [FakeLane([1, 2, 3, 4, 9, 1, 2, 3]), FakeLane([5, 6, 7, 8], slot=1)]
    assert [tuple(round(c, 6) for c in lane) for lane in b.chances(state, lanes, (3, 3))] == list(expected)
    assert b.choose(state, lanes, (2, 3))[0][0] == [4, 9]  # the proposal at the plan's limit: the path weighed, cut


@pytest.mark.parametrize("name", ["suffix+mtp", "suffix+dflash2"])
def test_holding_the_passes_unobserved_changes_nothing_the_network_sees(tiny, files, name):
    # the same requests on two engines, one whose network observes every pass at once: both parts draft (the
    # network's time reads as free), and once caught up both windows and carries are the same, bit for bit
    engines = [engine(tiny, name, k=3, max_lanes=2, options={"path": str(files)}) for _ in range(2)]
    for eng in engines:
        eng.drafter_state.costs.clock = lambda: 0.0
    repeat, plain = prompt(5, seed=8) * 4, prompt(12, seed=9)
    held, (lazy, eager) = [], (eng.drafter for eng in engines)
    observe, observe_now = lazy.observe, eager.observe

    def watch(state, *args):
        observe(state, *args)
        held.append(len(state.held))

    def at_once(state, *args):
        observe_now(state, *args)
        eager._release(state)

    lazy.observe, eager.observe = watch, at_once
    got = [eng.generate(requests([repeat, plain, plain, repeat], max_tokens=10)) for eng in engines]
    assert [r.tokens for r in got[0]] == [r.tokens for r in got[1]]
    assert max(held) > 1 and engines[1].drafter_state.held.passes == collections.deque()
    for eng in engines:
        assert eng.drafter_state.rounds["suffix"] > 0 and eng.drafter_state.rounds["model"] > 0
        eng.drafter.catch_up(eng.drafter_state)
    (a, b) = (eng.drafter_state.model for eng in engines)
    assert torch.equal(a.window.count, b.window.count) and torch.equal(a.carry, b.carry)
    ring = a.window.size  # the scratch rows past it are the proposals' own
    assert torch.equal(a.window.k[..., :ring, :], b.window.k[..., :ring, :])
    assert torch.equal(a.window.v[..., :ring, :], b.window.v[..., :ring, :])


def test_the_trees_lanes_go_past_the_stages_drafts_and_the_networks_never_do(tiny, files):
    b = chain("suffix+mtp", tiny, files, cache_tokens=0)
    assert b.draft_cap() == 31 == b.suffix.draft_cap()  # suffix's own default, before the pass cost is probed
    dear = RoundCosts((1, 16, 32), (0.01, 0.02, 0.04))
    assert b.draft_cap(dear) == 15 == b.suffix.draft_cap(dear)
    assert chain("suffix+mtp", tiny, files, max_drafts=7).draft_cap() == 0  # the stage's cap: nothing raised
    state = b.new_state(2, 64)
    state.costs.proposals.append(1e-6)  # the network, nearly free, pays where the trees find nothing
    state.costs.periods.append(0.01)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]
    lanes = [FakeLane(text + [0] + text[:12]), FakeLane([30, 31, 32, 33], slot=1)]  # 12 tokens matched: 12 drafts
    chances = b.chances(state, lanes, (15, 15))
    # the trees' path past 7; the network's 3 at most: mtp's own 8 rows over two lanes, as mtp alone drafts them
    assert len(chances[0]) > 7 and len(chances[1]) == 3
    rows, rest = b.choose(state, lanes, (15, 15))
    assert len(rows[0]) > 7 and rest == (0, 3)
    assert b.choose(state, lanes[1:], (15,))[1] == (7,)  # one lane: the stage's 7
