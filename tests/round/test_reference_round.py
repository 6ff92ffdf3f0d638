"""The reference round (stages/reference_round.py) beside the engine's graph (specs/verify.toml): after every round
both hold the same committed tokens, events, KV lengths, keys and values of committed positions, and conv and
recurrent states, bit for bit (float32 targets of the three families, one and two lanes, several rounds each).

The reference side prefills with the plain decode loop in a state of its own and runs its own drafter instance, so
nothing but the models and kernels is shared with the engine.
"""

import pytest
import torch

from speclane.stages.contract.events import TokenEvent
from speclane.stages.contract.lanes import Lane, push_token
from speclane.stages.contract.resources import Resources
from speclane.stages.drafters import build_backend
from speclane.stages.models.decode import greedy_decode
from speclane.stages.models.state import AttnCache
from speclane.stages.reference_round import reference_round
from tests.round.conftest import IdDetok, engine, mixed_prompts, requests

FAMILIES = ["llama", "qwen3_5_text", "qwen3_next"]
MAX_TOKENS = 24
K = 5


def _reference_lane(lane: Lane, target, state) -> Lane:
    """A copy of the engine's just prefilled `lane`, its prompt prefilled in `state` by the plain decode loop. The
    first token is prefill's, not a round's: the copy takes the engine's (a sampled one is drawn by prefill)."""
    ref = Lane(
        rid=lane.rid,
        order=lane.order,
        slot=lane.slot,
        prompt_ids=list(lane.prompt_ids),
        request=lane.request,
        draft_tokens=lane.draft_tokens,
        eos_ids=lane.eos_ids,
        detok=IdDetok(),
        seed=lane.seed,
    )
    first = greedy_decode(target, [ref.prompt_ids], 1, state=state, slots=[ref.slot], forced=[lane.out_ids[:1]])[0][0]
    push_token(ref, first)
    ref.anchor, ref.kv_len = first, len(ref.prompt_ids)
    return ref


def _assert_same_lane(eng_lane: Lane, ref: Lane, eng_state, ref_state, where: str) -> None:
    for field in ("out_ids", "text", "anchor", "kv_len", "finish_reason", "rounds", "drafted", "accepted"):
        assert getattr(eng_lane, field) == getattr(ref, field), f"{where}: {field}"
    n, slot = ref.kv_len, ref.slot
    for i, (mine, theirs) in enumerate(zip(eng_state.layers, ref_state.layers)):
        if isinstance(mine, AttnCache):
            assert torch.equal(mine.k[slot, :, :n], theirs.k[slot, :, :n]), f"{where}: layer {i} keys"
            assert torch.equal(mine.v[slot, :, :n], theirs.v[slot, :, :n]), f"{where}: layer {i} values"
        else:
            assert torch.equal(mine.conv[slot], theirs.conv[slot]), f"{where}: layer {i} conv state"
            assert torch.equal(mine.recurrent[slot], theirs.recurrent[slot]), f"{where}: layer {i} recurrent state"


def side_by_side(target, backend: str, lanes: int, ref_target=None, **fields) -> dict:
    """Run `lanes` requests through the engine and, round for round, through `reference_round` (on `ref_target`,
    default the same target), comparing after each round. Returns the engine's acceptance stats."""
    prompts = mixed_prompts(lanes)
    options = oracle = None
    if backend == "oracle":  # the target's own continuation (seeded: sampled ones too), a share corrupted
        plain = engine(target).generate(requests(prompts, MAX_TOKENS, **fields))
        oracle = {i: list(done.tokens) for i, done in enumerate(plain)}
        options = {"corrupt": 0.4, "seed": 3}
    eng = engine(target, backend, k=K, max_lanes=lanes, options=options, oracle=oracle)
    drafter = build_backend(eng.drafter.name, eng.drafter.options, eng.drafter.head, Resources(target=target))
    if oracle is not None:
        drafter.replay(oracle)
    ref_state, drafter_state = target.new_state(lanes, eng.max_len), drafter.new_state(lanes, eng.max_len)
    for req in requests(prompts, MAX_TOKENS, **fields):
        eng.submit(req)
    refs: dict = {}
    rounds = 0
    while eng.busy():
        running = eng.lanes.running()  # this step's round: lanes that prefill in it sit it out
        events = eng.step()
        for lane in eng.lanes.active.values():
            if lane.rid not in refs and lane.anchor >= 0:
                refs[lane.rid] = _reference_lane(lane, ref_target or target, ref_state)
        if not running:
            continue
        mine = [refs[lane.rid] for lane in running]
        ref_events = reference_round(ref_target or target, ref_state, drafter, drafter_state, mine, K)
        rids = {lane.rid for lane in running}
        assert [e for e in events if isinstance(e, TokenEvent) and e.rid in rids] == ref_events, f"round {rounds}"
        for lane, ref in zip(running, mine):
            _assert_same_lane(lane, ref, eng.state, ref_state, f"round {rounds}, lane {lane.rid}")
        rounds += 1
    assert rounds >= MAX_TOKENS // (K + 1) and len(refs) == lanes
    return eng.stats(list(eng.retired))


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("backend", ["ngram", "oracle"])
@pytest.mark.parametrize("family", FAMILIES)
def test_reference_round_matches_the_graph(family, backend, lanes, targets):
    stats = side_by_side(targets[family], backend, lanes)
    assert stats["drafted"] > 0
    if backend == "oracle":  # accepted and rejected drafts both happened, so replay had a row to choose
        assert 0 < stats["accepted"] < stats["drafted"]


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_round_matches_the_graph_when_sampling(family, targets):
    stats = side_by_side(targets[family], "oracle", 2, temperature=0.8, top_k=20, top_p=0.9, seed=11)
    assert 0 < stats["accepted"] < stats["drafted"]


class _NoReplay:
    """The target with recurrent replay skipped: every slot keeps its pre-round conv and recurrent state."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        return getattr(self._target, name)

    def commit(self, state, batch, committed_len, out):
        if out.record == "last":  # prefill still commits, so only the rounds' replay is missing
            self._target.commit(state, batch, committed_len, out)


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_next"])
def test_the_comparison_sees_a_skipped_replay(family, targets):
    with pytest.raises(AssertionError, match="conv state|recurrent state"):
        side_by_side(targets[family], "oracle", 2, ref_target=_NoReplay(targets[family]))
