"""The expert cache: routed experts computed from a few fast slots give exactly what all experts resident give,
and the counters add up (hits + misses = distinct experts looked up, bytes copied = misses x one expert's bytes)."""

import pytest
import torch

from speclane.kernels.moe import moe_experts_ref
from speclane.stages.contract.errors import ArtifactError, ConfigError
from speclane.stages.models.expert_cache import ExpertCache
from speclane.stages.models.expert_tiers import StackedTier
from speclane.stages.models.ops import linear
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from speclane.stages.models.weights import MlpWeights, MoeWeights
from tests.models.target_artifacts import artifacts, prompt  # noqa: F401  (fixtures)

EXPERTS, HIDDEN, INTER, K = 7, 20, 12, 3


def _layer(gen: torch.Generator) -> MoeWeights:
    """A MoE layer's weights; only the routed experts are read here."""
    unused = torch.zeros(1, HIDDEN)
    return MoeWeights(
        router=unused,
        gate_up=torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5,
        down=torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER**0.5,
        shared=MlpWeights(gate_up=unused, down=unused),
        shared_gate=unused,
    )


def _route(rows: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    top_i = torch.stack([torch.randperm(EXPERTS, generator=gen)[:K] for _ in range(rows)])
    top_w = torch.rand(rows, K, generator=gen)
    return top_i, top_w / top_w.sum(-1, keepdim=True)


@pytest.mark.parametrize("slots", [1, 2, 3, 5, 14])
def test_layers_through_the_slots_equal_the_twin_and_count_every_lookup(slots):
    # 1 and 2 slots are fewer than one row chooses (K = 3): every layer streams its experts through the slots
    gen = torch.Generator().manual_seed(slots)
    layers = {1: _layer(gen), 4: _layer(gen)}  # decoder layers 1 and 4 are the MoE ones
    cache = ExpertCache(StackedTier(layers), slots)
    one = 3 * HIDDEN * INTER * 4
    lookups = 0
    for step, rows in enumerate([13, 1, 5, 1, 1, 9, 2]):
        for layer, w in layers.items():
            x = torch.randn(rows, HIDDEN, generator=gen)
            top_i, top_w = _route(rows, gen)
            want = moe_experts_ref(x, w.gate_up, w.down, top_i, top_w, linear)
            got = cache.run(layer, x, top_i, top_w, linear)
            assert torch.equal(got, want), (slots, step, layer)
            lookups += len(set(top_i.flatten().tolist()))
            c = cache.counts()
            assert c.hits + c.misses == lookups
            assert c.bytes_copied == c.misses * one
    assert (c.slots, c.resident_bytes) == (slots, slots * one)
    if slots < K:  # two layers alternate and each chooses more than the slots hold: nothing survives to a hit
        assert c.hits == 0


def test_a_slot_holds_whichever_expert_it_was_given():
    gen = torch.Generator().manual_seed(0)
    cache = ExpertCache(StackedTier({0: _layer(gen)}), 2)
    x = torch.randn(1, HIDDEN, generator=gen)
    for experts in ([[0, 1, 2]], [[3, 4, 5]], [[5, 6, 0]]):
        cache.run(0, x, torch.tensor(experts), torch.full((1, 3), 1 / 3), linear)
    w = cache.slow.layers[0]
    for s in range(2):  # each slot's bytes are exactly one expert's of the slow tier
        assert any(
            torch.equal(cache.gate_up[s], w.gate_up[e]) and torch.equal(cache.down[s], w.down[e])
            for e in range(EXPERTS)
        )


# The tiny Qwen3-Next target: 4 MoE layers (layer 2 is dense) of 7 experts, top-3, hidden 48, expert inter 24.
MOE_LAYERS, ONE_EXPERT = 4, 3 * 48 * 24 * 4  # float32 bytes of one expert's gate, up and down


@pytest.fixture(scope="module")
def qwen3_next(artifacts):
    return artifacts["qwen3_next"][0]


def _passes(target: Target) -> list:
    """Two lanes prefilled in one pass, then six verify-like passes of 3 rows; every pass's output."""
    state, dev = target.new_state(2, 128), target.device
    p = prompt(17, seed=3)
    batch = RowBatch.build([(0, 0, p), (1, 0, p[:9])], device=dev)
    outs = [target.forward(batch, state, record="last")]
    target.commit(state, batch, torch.tensor([17, 9], device=dev), outs[-1])
    for step in range(6):
        batch = RowBatch.build([(0, 17 + step, [5 + step, 7]), (1, 9 + step, [11 + step])], device=dev)
        outs.append(target.forward(batch, state))
        target.commit(state, batch, torch.tensor([1, 1], device=dev), outs[-1])
    return outs


@pytest.fixture(scope="module")
def resident(qwen3_next):
    return _passes(Target.load(qwen3_next, dtype=torch.float32))


@pytest.mark.parametrize("slots", [2, 5, 28])
def test_target_passes_are_bit_identical_to_all_experts_resident(qwen3_next, resident, slots):
    # 2 slots: fewer than one row chooses in one layer; 5: fewer than a layer's 7; 28: every expert of the model
    target = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=slots * ONE_EXPERT)
    outs = _passes(target)
    for a, b in zip(resident, outs):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden)
    assert resident[0].experts is None
    total = target.expert_stats()
    assert total.hits == sum(o.experts.hits for o in outs) and total.misses == sum(o.experts.misses for o in outs)
    assert total.bytes_copied == total.misses * ONE_EXPERT
    assert (total.slots, total.resident_bytes) == (slots, slots * ONE_EXPERT)
    for o in outs[1:]:  # 3 rows a pass: each MoE layer looks up between 3 and 7 distinct experts
        assert 3 * MOE_LAYERS <= o.experts.hits + o.experts.misses <= 7 * MOE_LAYERS
    if slots < 3:
        assert total.hits == 0
    if slots == 28:  # the prefill's 26 rows choose every expert of every layer: copied in once, then only hits
        assert outs[0].experts.misses == 28 and all(o.experts.misses == 0 for o in outs[1:]) and total.hits > 0


def test_a_one_row_pass_looks_up_k_experts_a_moe_layer(qwen3_next):
    target = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=5 * ONE_EXPERT)
    state = target.new_state(1, 64)
    out = target.forward(RowBatch.build([(0, 0, [7])]), state)
    assert out.experts.hits + out.experts.misses == 3 * MOE_LAYERS
    assert out.experts.bytes_copied == out.experts.misses * ONE_EXPERT


def test_budget_is_rounded_down_to_whole_experts_and_capped_at_the_model(qwen3_next):
    t = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=3 * ONE_EXPERT - 1)
    assert t.expert_stats().slots == 2
    t = Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=1 << 30)
    assert t.expert_stats().slots == 28 and t.expert_stats().resident_bytes == 28 * ONE_EXPERT
    assert Target.load(qwen3_next, dtype=torch.float32).expert_stats() is None


def test_a_target_built_from_loaded_weights_caches_their_stacked_experts(qwen3_next, resident):
    full = Target.load(qwen3_next, dtype=torch.float32)
    cache = ExpertCache.stacked(full.cfg, full.weights, 4 * ONE_EXPERT, full.device)
    target = Target(full.cfg, full.weights, torch.float32, full.device, (), experts=cache)
    outs = _passes(target)
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(resident, outs))
    assert isinstance(cache.slow, StackedTier) and target.expert_stats().slots == 4


def test_bad_budgets_are_refused_naming_the_flag(artifacts, qwen3_next):
    with pytest.raises(
        ConfigError,
        match=r"^--expert-cache: this model \(llama\) is dense, it has no routed experts "
        r"to cache; leave --expert-cache unset$",
    ):
        Target.load(artifacts["llama"][0], dtype=torch.float32, expert_cache_bytes=1 << 20)
    with pytest.raises(
        ConfigError,
        match=r"^--expert-cache: 0\.01318 MB holds no expert; one expert of this model "
        r"is 0\.01318 MB in float32, give at least that$",
    ):
        Target.load(qwen3_next, dtype=torch.float32, expert_cache_bytes=ONE_EXPERT - 1)
    with pytest.raises(ConfigError, match=r"^--expert-cache runs with --device cpu or cuda \(got meta\)"):
        Target.load(qwen3_next, dtype=torch.float32, device="meta", expert_cache_bytes=1 << 20)
    with pytest.raises(ConfigError, match=r"expert cache: unknown policy 'mru'; use one of lru, lfu, decay"):
        ExpertCache(StackedTier({0: _layer(torch.Generator())}), 2, policy="mru")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_files_read_in_place_give_the_loaded_experts(qwen3_next, dtype):
    # the cache's target never loads its routed experts: the slow tier is the artifact's file, mapped
    cached = Target.load(qwen3_next, dtype=dtype, expert_cache_bytes=3 * ONE_EXPERT)
    full = Target.load(qwen3_next, dtype=dtype)
    slow = cached.experts.slow
    for i, lw in enumerate(full.weights.layers):
        if not isinstance(lw.mlp, MoeWeights):
            assert i not in slow.layers
            continue
        assert cached.weights.layers[i].mlp.gate_up is None and cached.weights.layers[i].mlp.down is None
        for e in range(7):
            gate, up, down = slow.parts(i, e)
            assert torch.equal(torch.cat([gate, up]).to(dtype), lw.mlp.gate_up[e])
            assert torch.equal(down.to(dtype), lw.mlp.down[e])
    state_a, state_b = full.new_state(1, 64), cached.new_state(1, 64)
    batch = RowBatch.build([(0, 0, prompt(11, seed=5))])
    assert torch.equal(full.forward(batch, state_a).logits, cached.forward(batch, state_b).logits)


def test_a_missing_or_misshapen_expert_in_the_files_is_named(qwen3_next, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(qwen3_next / "model.safetensors")
    name = "model.layers.3.mlp.experts.5.up_proj.weight"
    for case in ("missing", "shape"):
        bad = dict(tensors)
        if case == "missing":
            del bad[name]
        else:
            bad[name] = torch.zeros(24, 47)
        d = tmp_path / case
        d.mkdir()
        (d / "config.json").write_text((qwen3_next / "config.json").read_text())
        save_file(bad, str(d / "model.safetensors"))
        want = (
            rf"{d}: tensor '{name}' is missing \(expected shape \[24, 48\]\)"
            if case == "missing"
            else rf"{d}/model.safetensors: tensor '{name}' has shape \[24, 47\], expected \[24, 48\]"
        )
        with pytest.raises(ArtifactError, match=want):
            Target.load(d, dtype=torch.float32, expert_cache_bytes=4 * ONE_EXPERT)


@pytest.mark.parametrize("slots", [4, 7])
def test_grouped_kernels_over_the_slots_equal_them_over_every_expert_resident(slots):
    # the route a GPU takes (here under the triton interpreter): a layer whose chosen experts fit the slots runs
    # the grouped kernels over the slots, bit-identical to those kernels over the stacked experts; a layer that
    # does not fit streams through the slots by the twin, bit-identical to the twin
    from speclane.kernels.moe_triton import moe_experts_triton

    gen = torch.Generator().manual_seed(10 + slots)
    layers = {0: _layer(gen), 2: _layer(gen)}
    cache = ExpertCache(StackedTier(layers), slots, grouped=True)
    fitted = 0
    for rows in (1, 2, 1, 5, 1):
        for layer, w in layers.items():
            x = torch.randn(rows, HIDDEN, generator=gen)
            top_i, top_w = _route(rows, gen)
            got = cache.run(layer, x, top_i, top_w, linear)
            if len(set(top_i.flatten().tolist())) <= slots:
                fitted += 1
                assert torch.equal(got, moe_experts_triton(x, w.gate_up, w.down, top_i, top_w)), (rows, layer)
            else:
                assert torch.equal(got, moe_experts_ref(x, w.gate_up, w.down, top_i, top_w, linear)), (rows, layer)
    assert fitted >= 4
    c = cache.counts()
    assert c.bytes_copied == c.misses * 3 * HIDDEN * INTER * 4
