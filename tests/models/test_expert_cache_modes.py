"""The expert cache's other modes on the tiny Qwen3-Next: computing experts in place from the mapped file, the
router look-ahead prefetch, and recording the look-ahead; each gives exactly the passes of every expert resident."""

import pytest
import torch

from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.expert_policies import POLICIES
from speclane.stages.models.expert_study import recording, replay_counts
from speclane.stages.models.target import Target
from speclane.stages.models.weights import MoeWeights
from tests.models.target_artifacts import artifacts, prompt  # noqa: F401  (fixtures)
from tests.models.test_expert_cache import ONE_EXPERT, _passes


@pytest.fixture(scope="module")
def qwen3_next(artifacts):
    return artifacts["qwen3_next"][0]


@pytest.fixture(scope="module")
def resident(qwen3_next):
    return _passes(Target.load(qwen3_next, dtype=torch.float32))


def test_the_mapped_file_gives_each_expert_in_a_slots_layout(qwen3_next):
    cached = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=3 * ONE_EXPERT)
    full = Target.load(qwen3_next, dtype=torch.float32)
    slow = cached.experts.slow
    for i, lw in enumerate(full.weights.layers):
        if isinstance(lw.mlp, MoeWeights):
            assert torch.equal(slow.router(i), lw.mlp.router)
            for e in range(7):
                gate_up, down = slow.fused(i, e)
                assert torch.equal(gate_up, lw.mlp.gate_up[e]) and torch.equal(down, lw.mlp.down[e])
    # the file holds float32: a bfloat16 cache cannot compute from it in place, only copy (and convert)
    bf16 = Target.load(qwen3_next, dtype=torch.bfloat16, expert_cache_bytes=3 * ONE_EXPERT)
    assert bf16.experts.slow.fused(0, 0) is None and bf16.experts.slow.router(0).dtype == torch.bfloat16


@pytest.mark.parametrize("slots", [2, 5])
def test_in_place_passes_equal_resident_and_copy_nothing(qwen3_next, resident, slots):
    target = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=slots * ONE_EXPERT)
    target.experts.reset(in_place=True)
    outs = _passes(target)
    for a, b in zip(resident, outs):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    c = target.expert_stats()
    assert c.bytes_copied == 0 and c.misses > 0  # the table still counts what a copying cache would copy


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_passes_equal_resident_and_every_copy_is_counted(qwen3_next, resident, prefetch):
    target = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=9 * ONE_EXPERT)
    target.experts.reset(prefetch=prefetch)
    outs = _passes(target)
    for a, b in zip(resident, outs):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    table, c = target.experts.table, target.expert_stats()
    assert table.prefetched > 0 and 0 < table.prefetch_hits <= table.prefetched
    assert c.bytes_copied == (c.misses + table.prefetched) * ONE_EXPERT


def test_a_recorded_look_ahead_replays_to_the_live_prefetch(qwen3_next):
    target = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=9 * ONE_EXPERT)
    target.experts.reset(prefetch=2)
    ahead: list = []
    with recording(target, ahead) as trace:
        _passes(target)
    assert len(ahead) == len(trace) and target.experts.ahead is None
    moe_layers = sorted(target.experts.slow.layers)
    for (layer, _), guess in zip(trace, ahead):
        rows_ok = all(len(row) == 4 and len(set(row)) == 4 for row in guess)  # AHEAD experts a row, distinct
        assert (guess == ()) == (layer == moe_layers[-1]) and rows_ok
    live = target.experts.table
    got = replay_counts(trace, 9, POLICIES[target.experts.policy](), ahead=ahead, prefetch=2)
    assert (got["hits"], got["misses"], got["prefetched"]) == (live.hits, live.misses, live.prefetched)


def test_bad_settings_are_refused(qwen3_next):
    target = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=4 * ONE_EXPERT)
    with pytest.raises(ConfigError, match=r"expert cache: prefetch must be 0 to 4 experts a row, got 5"):
        target.experts.reset(prefetch=5)
    with pytest.raises(ConfigError, match=r"expert cache: unknown policy 'mru'"):
        target.experts.reset(policy="mru")
