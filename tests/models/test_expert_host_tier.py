"""The slow tier of a model on a GPU (`HostTier`: every routed expert read once from the files into host memory,
pinned where a GPU is present) and the cache over it: the same experts as the files, passes bit-identical to every
expert resident, prefetch included. On a CPU the tier is plain host memory and the slots share it; the CUDA tests
(slots on the GPU, copies on their own stream) run where a GPU is present."""

import pytest
import torch

from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.expert_cache import ExpertCache
from speclane.stages.models.expert_tiers import HostTier, MappedTier
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts  # noqa: F401  (fixture)
from tests.models.test_expert_cache import MOE_LAYERS, ONE_EXPERT, _passes

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (slots on the GPU)")


@pytest.fixture(scope="module")
def qwen3_next(artifacts):
    return artifacts["qwen3_next"][0]


def _host_target(path, slots: int, device: str, prefetch: int = 0) -> Target:
    full = Target.load(path, dtype=torch.float32, device=device, expert_cache_bytes=slots * ONE_EXPERT)
    if device == "cpu":  # Target.load on a CPU reads in place; put the host tier under it as a GPU would
        files = full.experts.slow
        full.experts = ExpertCache(HostTier.read(files, device), slots, device=device)
    full.experts.reset(prefetch=prefetch)
    return full


def test_the_host_tier_holds_the_files_experts_and_routers(qwen3_next):
    files = MappedTier(qwen3_next, Target.load(qwen3_next, dtype=torch.float32).cfg, torch.float32)
    host = HostTier.read(files, "cpu")
    assert sorted(host.layers) == sorted(files.layers) and host.experts == 7
    for layer in files.layers:
        assert torch.equal(host.router(layer), files.router(layer))
        for e in range(7):
            assert all(torch.equal(a, b) for a, b in zip(host.parts(layer, e), files.parts(layer, e)))


@pytest.mark.parametrize("slots,prefetch", [(2, 0), (5, 0), (5, 2), (28, 2)])
def test_passes_over_the_host_tier_are_bit_identical_to_all_resident(qwen3_next, slots, prefetch):
    resident = _passes(Target.load(qwen3_next, dtype=torch.float32))
    target = _host_target(qwen3_next, slots, "cpu", prefetch)
    outs = _passes(target)
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(resident, outs))
    c = target.expert_stats()
    assert c.bytes_copied == (c.misses + target.experts.table.prefetched) * ONE_EXPERT


def test_in_place_is_refused_where_the_slots_are_not_the_tier_s_memory(qwen3_next):
    cache = _host_target(qwen3_next, 5, "cpu").experts
    cache.reset(in_place=True)  # slots and tier both on the CPU: allowed
    files = cache.slow
    away = ExpertCache(files, 5, device="meta")
    with pytest.raises(ConfigError, match="in_place computes each expert where the slow tier holds it"):
        away.reset(in_place=True)


@cuda
@pytest.mark.parametrize("prefetch", [0, 2])
def test_on_a_gpu_the_slots_give_the_resident_pass(qwen3_next, prefetch):
    resident = _passes(Target.load(qwen3_next, dtype=torch.float32, device="cuda"))
    runs = {}
    for slots in (2, 5, 28):
        target = _host_target(qwen3_next, slots, "cuda", prefetch)
        assert target.experts.gate_up.device.type == "cuda"
        assert all(t.is_pinned() for w in target.experts.slow.layers.values() for t in (w.gate_up, w.down))
        runs[slots] = _passes(target)
        c = target.expert_stats()
        assert c.misses > 0 and c.bytes_copied == (c.misses + target.experts.table.prefetched) * ONE_EXPERT
        for o in runs[slots][1:]:
            assert 3 * MOE_LAYERS <= o.experts.hits + o.experts.misses <= 7 * MOE_LAYERS
    for a, b in zip(resident, runs[28]):  # every layer fits the slots: the grouped kernels over them, bit-identical
        assert torch.equal(a.logits, b.logits)
    for slots in (2, 5):  # a layer that chose more than the slots streams by the twin, which rounds its own way
        for a, b in zip(resident, runs[slots]):
            assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1)), slots
            torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-4)
