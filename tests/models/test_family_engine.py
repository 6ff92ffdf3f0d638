"""The new families through the engine: greedy tokens with ngram speculation equal speculation off (and
transformers' greedy), and a MoE target whose routed experts run from a few cache slots gives the all-resident
tokens, Mixtral's experts read in place under their own tensor names."""

from __future__ import annotations

import pytest
import torch
from family_artifacts import FAMILY_NAMES, MOE_NAMES, WINDOW, family_artifacts, hf_greedy  # noqa: F401  (fixtures)

from speclane.kernels import cpu_build
from speclane.stages.models.target import Target
from tests.round.conftest import engine, mixed_prompts, requests

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def targets(family_artifacts):
    return {name: Target.load(path, dtype=torch.float32) for name, (path, _) in family_artifacts.items()}


def _tokens(target, backend: str, prompts, lanes: int):
    eng = engine(target, backend, k=3, max_lanes=lanes, max_len=WINDOW)
    got = eng.generate(requests(prompts, MAX_TOKENS))
    return [r.tokens for r in got], eng.stats(list(eng.retired))


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_ngram_speculation_gives_the_tokens_of_speculation_off(targets, family_artifacts, name):
    prompts = mixed_prompts(3)  # lanes 0 and 2 repeat a phrase: the n-gram drafter finds matches there
    want, _ = _tokens(targets[name], "none", prompts, 3)
    got, stats = _tokens(targets[name], "ngram", prompts, 3)
    assert got == want
    assert stats["drafted"] > 0 and stats["accepted"] > 0, stats
    assert list(want[0]) == hf_greedy(family_artifacts[name][1], prompts[0], MAX_TOKENS)


@pytest.mark.skipif(cpu_build.library() is None, reason="the C kernels are not built on this machine")
@pytest.mark.parametrize("name", ["qwen3", "qwen2", "mistral"])
def test_the_dense_families_run_their_layers_as_one_c_call(targets, name):
    target = Target.load(targets[name].artifact_dir, dtype=torch.bfloat16)
    assert all(layer is not None for layer in target._dense)


def _one_expert(target) -> int:
    cfg = target.cfg
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4  # float32


@pytest.mark.parametrize("name", MOE_NAMES)
def test_an_expert_cache_gives_the_all_resident_tokens(targets, family_artifacts, name):
    resident = targets[name]
    one = _one_expert(resident)
    prompts = mixed_prompts(2)
    # 1 slot: fewer than a row chooses in a layer (top-2 or top-3), so every layer streams its experts through it;
    # 4: some experts stay between passes
    for slots in (1, 4):
        cached = Target.load(family_artifacts[name][0], dtype=torch.float32, expert_cache_bytes=slots * one)
        assert cached.weights.layers[0].mlp.gate_up is None, "the routed experts stay in the files"
        for backend in ("none", "ngram"):
            want, _ = _tokens(resident, backend, prompts, 2)
            got, _ = _tokens(cached, backend, prompts, 2)
            assert got == want, (slots, backend)
        c = cached.expert_stats()
        assert c.slots == slots and c.misses > 0 and c.bytes_copied == c.misses * one
