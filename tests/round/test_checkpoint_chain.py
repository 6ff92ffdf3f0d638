"""Checkpoints every N tokens of a long prefill, and a conversation's checkpoints sharing their common positions.

A long prompt leaves a checkpoint each time its prefill passes a multiple of `checkpoint_every`, at no extra target
pass; a later prompt that shares only the beginning (a re-rendered earlier turn) restores the longest of them and
decodes as a fresh prefill would (float32, three families). Each of a lane's checkpoints extends the previous one,
so the store holds each position's keys once; evicting an earlier one keeps what a later one still reads.
"""

import pytest
import torch

from speclane.pipeline.runtime.checkpoints import CheckpointStore
from speclane.pipeline.runtime.snapshots import load, save
from speclane.stages.models.checkpoint import restore_slot, snapshot_slot
from speclane.stages.models.target import Target
from tests.models.target_artifacts import FAMILIES
from tests.round.conftest import engine, prompt, requests


def _engine(target, every: int, budget: int = 64 << 20, backend: str = "none"):
    eng = engine(target, backend=backend, k=3, max_lanes=2)
    eng.set_prefill_rows(16)
    eng.prefill_idle = eng.prefill  # 16-row chunks even with no lane decoding: the chunk ends are what is tested
    eng.checkpoints = CheckpointStore(budget) if budget else None
    eng.keeper.every = every
    return eng


def _passes(monkeypatch) -> list[int]:
    calls = []
    orig = Target.forward
    monkeypatch.setattr(
        Target, "forward", lambda self, batch, *a, **kw: calls.append(batch.rows) or orig(self, batch, *a, **kw)
    )
    return calls


@pytest.mark.parametrize("name", FAMILIES)
def test_a_long_prefill_leaves_checkpoints_that_a_diverging_prompt_reuses(targets, name, monkeypatch):
    target = targets[name]
    first = prompt(100, seed=21)
    passes = _passes(monkeypatch)
    eng = _engine(target, every=32)
    (answer,) = eng.generate(requests([first], max_tokens=6))
    with_checkpoints = list(passes)
    passes.clear()
    fresh = _engine(target, every=0, budget=0)
    assert fresh.generate(requests([first], max_tokens=6))[0].tokens == answer.tokens
    assert passes == with_checkpoints  # no extra target pass, not even a wider one
    lengths = sorted(len(t) for t in eng.checkpoints._entries)
    assert lengths == [32, 64, 96, 100, 105]  # chunks of 16: every 32 tokens, the prompt, the answer
    # A prompt that keeps the first 70 tokens and then differs: restored from the 64-token checkpoint.
    other = first[:70] + prompt(20, seed=22)
    before = eng.checkpoints.tokens_reused
    got = eng.generate(requests([other], max_tokens=8))[0].tokens
    assert eng.checkpoints.tokens_reused - before == 64
    assert got == fresh.generate(requests([other], max_tokens=8))[0].tokens, name


def test_a_conversations_checkpoints_hold_each_position_once(targets):
    target = targets["llama"]  # attention only: the keys are every byte
    eng = _engine(target, every=32)
    first = prompt(100, seed=23)
    eng.generate(requests([first], max_tokens=6))
    state = target.new_state(1, 256)
    one_copy = snapshot_slot(state, 0, 105).nbytes  # the answer's end, as one snapshot
    assert eng.checkpoints.bytes_held == one_copy  # five checkpoints, each position held once
    assert sum(ck.target.nbytes for ck in eng.checkpoints._entries.values()) > 3 * one_copy


def test_evicting_an_earlier_checkpoint_keeps_what_a_later_one_reads(targets, tmp_path):
    target = targets["qwen3_5_text"]
    eng = _engine(target, every=32)
    first = prompt(100, seed=24)
    eng.generate(requests([first], max_tokens=6))
    store = eng.checkpoints
    held = store.bytes_held
    for tokens in [t for t in store._entries if len(t) < 100]:  # the every-32 ones go; the prompt's stays
        store.evict(store.base_for(tokens))
    assert 0 < store.bytes_held < held
    prompt_end = store.base_for(first)
    assert prompt_end is not None and len(prompt_end.target.segments) == 4  # it extends the evicted ones
    # Restored into a clean slot it is the state a fresh prefill leaves (to float32 rounding).
    ref = _engine(target, every=0, budget=0)
    lane = ref.submit(requests([first], max_tokens=1)[0])
    while lane.kv_len < len(first):
        ref.step()
    whole = snapshot_slot(ref.state, lane.slot, len(first))
    state = target.new_state(1, 256)
    restore_slot(state, 0, prompt_end.target)
    again = snapshot_slot(state, 0, len(first))
    for (a, b), (c, d) in zip(again.layers, whole.layers):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(b, d, rtol=1e-4, atol=1e-5)
    # A file holds the whole chain: read back it restores the same state.
    path = save(tmp_path, prompt_end, "m", "none")
    back = load(path, "m", "none", "cpu")
    assert len(back.target.segments) == 1 and back.target.length == len(first)
    state2 = target.new_state(1, 256)
    restore_slot(state2, 0, back.target)
    for x, y in zip(snapshot_slot(state2, 0, len(first)).layers, again.layers):
        assert all(torch.equal(p, q) for p, q in zip(x, y))
