"""Invariant 1 with an expert cache: greedy tokens from a Qwen3-Next target whose routed experts run from a few
slots equal those with every expert resident, with speculation off, ngram, mtp and the oracle, at 1 and 3 lanes.

The random mtp head's drafts are all rejected on this target and ngram's nearly all; the oracle (the baseline's own
tokens, some corrupted) is what puts accepted and rejected drafts side by side in one verify pass."""

import pytest
import torch

from speclane.stages.models.target import Target
from tests.drafters.conftest import write_drafter
from tests.round.conftest import engine, mixed_prompts, requests

MAX_TOKENS = 16
ONE_EXPERT = 3 * 48 * 24 * 4  # float32 bytes of one routed expert of the tiny Qwen3-Next (tests/models)
# 2 slots: fewer than one row chooses in one layer (top-3), so every layer streams; 5: a few experts, fewer
# than the 7 of a layer and far fewer than the model's 28.
BUDGETS = (2, 5)


@pytest.fixture(scope="module")
def mtp_dir(targets, tmp_path_factory):
    """A random mtp head for the tiny Qwen3-Next (random drafts: some accepted, most not, both paths run)."""
    directory = tmp_path_factory.mktemp("qwen3-next-mtp")
    write_drafter("mtp", targets["qwen3_next"], directory, seed=1)
    return directory


@pytest.fixture(scope="module")
def baseline(targets):
    """Speculation off, every expert resident: each lane's tokens."""
    prompts = mixed_prompts(3)
    got = engine(targets["qwen3_next"], max_lanes=3).generate(requests(prompts, MAX_TOKENS))
    return prompts, [r.tokens for r in got]


def _cached(artifacts, slots: int) -> Target:
    return Target.load(artifacts["qwen3_next"][0], dtype=torch.float32, expert_cache_bytes=slots * ONE_EXPERT)


def _run(target, backend, lanes, prompts, mtp_dir, want=None):
    options = (
        {"path": str(mtp_dir)} if backend == "mtp" else {"corrupt": 0.3, "seed": 1} if backend == "oracle" else None
    )
    oracle = {i: list(t) for i, t in enumerate(want)} if backend == "oracle" else None
    eng = engine(target, backend, k=3, max_lanes=lanes, options=options, oracle=oracle)
    got = eng.generate(requests(prompts, MAX_TOKENS))
    return [r.tokens for r in got], eng.stats(list(eng.retired))


@pytest.mark.parametrize("slots", BUDGETS)
@pytest.mark.parametrize("backend", ["none", "ngram", "mtp", "oracle"])
def test_greedy_tokens_equal_all_experts_resident(artifacts, baseline, mtp_dir, backend, slots):
    prompts, want = baseline
    target = _cached(artifacts, slots)
    for lanes in (1, 3):
        got, stats = _run(target, backend, lanes, prompts[:lanes], mtp_dir, want)
        assert got == want[:lanes], (backend, slots, lanes)
        if backend != "none":
            assert stats["drafted"] > 0, (backend, slots, lanes)
        if backend == "oracle":
            assert 0 < stats["accepted"] < stats["drafted"], (slots, lanes, stats)
    c = target.expert_stats()
    assert c.misses > 0 and c.bytes_copied == c.misses * ONE_EXPERT and c.slots == slots
    if slots < 3:
        assert c.hits == 0  # each layer's experts evict the last layer's before a pass comes back to them


def test_a_cache_of_every_expert_copies_each_once(artifacts, baseline, mtp_dir):
    prompts, want = baseline
    target = _cached(artifacts, 28)
    got, _ = _run(target, "ngram", 3, prompts, mtp_dir)
    assert got == want
    c = target.expert_stats()
    assert c.misses <= 28 and c.hits > 10 * c.misses and c.bytes_copied == c.misses * ONE_EXPERT


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the slots on the GPU)")
@pytest.mark.parametrize("backend", ["none", "ngram", "oracle"])
def test_on_a_gpu_greedy_tokens_equal_all_experts_resident(artifacts, mtp_dir, backend):
    # the slow tier in pinned host memory, the slots on the GPU, the copies on a stream of their own, prefetching
    path = artifacts["qwen3_next"][0]
    prompts = mixed_prompts(3)
    resident = engine(Target.load(path, dtype=torch.float32, device="cuda"), max_lanes=3)
    want = [r.tokens for r in resident.generate(requests(prompts, MAX_TOKENS))]
    for slots in BUDGETS:
        target = Target.load(path, dtype=torch.float32, device="cuda", expert_cache_bytes=slots * ONE_EXPERT)
        target.experts.reset(prefetch=2)
        for lanes in (1, 3):
            got, _ = _run(target, backend, lanes, prompts[:lanes], mtp_dir, want)
            assert got == want[:lanes], (backend, slots, lanes)
        c = target.expert_stats()
        assert c.misses > 0 and c.bytes_copied == (c.misses + target.experts.table.prefetched) * ONE_EXPERT
