"""Prompt checkpoints: a request whose tokens begin with a kept prefix (the previous turn's prompt, or its prompt
and answer) restores that prefix's slot state and prefills only the rest, and decodes exactly as a fresh
prefill of the whole prompt would: same greedy tokens with speculation on and off, on the three target families
(float32), and the same state after the prefill (to float rounding: a fresh prefill reads the prefix in one GEMM,
the restored one computed it over earlier passes)."""

import pytest
import torch

from speclane.pipeline.runtime.checkpoints import MIN_TOKENS, Checkpoint, CheckpointStore
from speclane.pipeline.runtime.engine import Engine
from speclane.stages.models.checkpoint import snapshot_slot
from tests.models.target_artifacts import FAMILIES
from tests.round.conftest import engine, prompt, requests


def _with_checkpoints(eng: Engine, budget: int) -> Engine:
    eng.checkpoints = CheckpointStore(budget) if budget else None
    return eng


def _prefilled(eng: Engine, ids: list[int]):
    """Submit `ids`, step until its prompt is in the slot; the lane and its slot's snapshot."""
    (req,) = requests([ids], max_tokens=8)
    lane = eng.submit(req)
    while lane.kv_len < len(ids):
        eng.step()
    return lane, snapshot_slot(eng.state, lane.slot, lane.kv_len)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("backend", ["none", "ngram"])
def test_a_next_turn_restores_the_last_one_and_decodes_as_a_fresh_prefill(targets, name, backend):
    target = targets[name]
    first = prompt(40, seed=11)
    eng = _with_checkpoints(engine(target, backend=backend, k=3, max_lanes=2), 64 << 20)
    (answer,) = eng.generate(requests([first], max_tokens=12))
    follow = first + list(answer.tokens) + prompt(10, seed=12)  # the next turn quotes the conversation
    shared = first + prompt(9, seed=13)  # another request with the same opening
    fresh = _with_checkpoints(engine(target, backend=backend, k=3, max_lanes=2), 0)
    # The answer's checkpoint holds its keys up to the last committed row: all but the last token (no round drafts
    # past max_tokens, so its keys never run past the answer: tests/round/test_draft_room.py).
    conversation = len(first) + len(answer.tokens)
    for ids, reused in ((follow, (conversation - 1, conversation - 1)), (shared, (len(first), len(first)))):
        before = eng.checkpoints.tokens_reused
        got = eng.generate(requests([ids], max_tokens=16))[0].tokens
        want = fresh.generate(requests([ids], max_tokens=16))[0].tokens
        assert got == want, (name, backend, reused)
        assert reused[0] <= eng.checkpoints.tokens_reused - before <= reused[1]
    # the state after the prefill, restored against fresh
    lane_r, restored = _prefilled(eng, follow)
    lane_f, whole = _prefilled(fresh, follow)
    assert lane_r.prefix_reused > 0 and lane_f.prefix_reused == 0
    for (a, b), (c, d) in zip(restored.layers, whole.layers):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(b, d, rtol=1e-4, atol=1e-5)


def _ck(tokens, nbytes):
    return Checkpoint(tuple(tokens), target=None, nbytes=nbytes)


def test_the_store_matches_the_longest_prefix_and_evicts_the_least_recently_used():
    store = CheckpointStore(budget_bytes=300)
    a, b = list(range(20)), list(range(30))
    assert store.add(_ck(a, 100)) and store.add(_ck(b, 100))
    assert store.match(list(range(40))).tokens == tuple(b)  # the longest prefix wins
    assert store.match(b).tokens == tuple(a)  # never the whole prompt: its last token must run
    assert store.match([5] * 40) is None
    c = list(range(100, 130))
    assert store.add(_ck(c, 150))  # over budget: the least recently used goes (b)
    assert store.match(list(range(40))).tokens == tuple(a)
    assert store.stats()["evictions"] == 1 and store.stats()["bytes_held"] == 250
    assert not store.add(_ck(list(range(200, 250)), 400))  # larger than the whole budget: not kept
    assert not store.wants(list(range(MIN_TOKENS - 1))) and not store.wants(a)
    s = store.stats()
    assert (s["hits"], s["misses"], s["tokens_reused"]) == (3, 1, 30 + 20 + 20)
