"""Invariant 3: after any round, every lane's KV and recurrent state equal those of plain decoding of its tokens.

Several lanes of different acceptance share each round (the oracle drafter corrupts a share of its drafts),
and with two slots for five requests every slot is freed and reused mid-run.
"""

import pytest
import torch

from speclane.stages.models.decode import greedy_decode
from speclane.stages.models.state import AttnCache
from tests.round.conftest import engine, mixed_prompts, requests


def reference_state(target, prompt: list[int], out: list[int]):
    """Plain decoding of the lane's output (the shared loop, forced to its tokens): the prompt in one pass, then one
    token at a time; the last token (the anchor) is not run."""
    state = target.new_state(1, 512)
    greedy_decode(target, [prompt], len(out), state=state, forced=[out])
    return state


def assert_slot_equal(state, slot, ref, n):
    for layer, ref_layer in zip(state.layers, ref.layers):
        if isinstance(layer, AttnCache):
            assert torch.equal(layer.k[slot, :, :n], ref_layer.k[0, :, :n])
            assert torch.equal(layer.v[slot, :, :n], ref_layer.v[0, :, :n])
        else:
            assert torch.equal(layer.conv[slot], ref_layer.conv[0])
            assert torch.equal(layer.recurrent[slot], ref_layer.recurrent[0])


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_next", "llama"])
def test_state_after_every_round_equals_plain_decoding(family, targets):
    target = targets[family]
    prompts = mixed_prompts(5)
    alone = [engine(target).generate(requests([p], 16))[0].tokens for p in prompts]
    eng = engine(
        target,
        "oracle",
        k=5,
        max_lanes=2,
        options={"corrupt": 0.4, "seed": 1},
        oracle={i: list(t) for i, t in enumerate(alone)},
    )
    for req in requests(prompts, 16):
        eng.submit(req)
    checked, reused = 0, set()
    while eng.busy():
        eng.step()
        for slot, lane in eng.lanes.active.items():
            if lane.finish_reason is not None or lane.anchor < 0:
                continue
            # KV holds the prompt and every output token but the anchor
            tokens = lane.prompt_ids + lane.out_ids[:-1]
            assert lane.kv_len == len(tokens)
            assert_slot_equal(eng.state, slot, reference_state(target, lane.prompt_ids, lane.out_ids), len(tokens))
            checked += 1
            if lane.order >= 2:
                reused.add(slot)
    assert checked > 10 and reused == {0, 1}
    stats = eng.stats(list(eng.retired))
    assert 0 < stats["accepted"] < stats["drafted"]
