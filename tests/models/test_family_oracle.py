"""qwen3, qwen2, mistral, qwen3_moe and mixtral from Hugging Face directories: our target's logits and greedy tokens
equal transformers' on tiny random artifacts it saved (float32), on the prefill route and the decode route."""

from __future__ import annotations

import pytest
import torch
from family_artifacts import FAMILY_NAMES, WINDOW, family_artifacts, hf_greedy, prompt  # noqa: F401  (fixtures)
from oracle_checks import assert_decode_route_matches, assert_one_pass_matches, greedy_tokens

from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.target import Target

# As in test_target_oracle.py: float32 with other summation orders than transformers (fused q|k|v and gate|up
# matrices, padded 8-row GEMMs, experts added in index order): a few ulp per op over 2-3 layers. A real defect (a
# missing bias or q/k norm, an unnormalised top-k, a swapped w1/w3) moves logits by O(0.1) or more.
TOL = 2e-4


@pytest.fixture(params=FAMILY_NAMES)
def fam(request, family_artifacts):
    return request.param, *family_artifacts[request.param]


def test_each_family_reads_its_quirks_into_the_config(family_artifacts):
    cfg = {name: ModelConfig.load(family_artifacts[name][0]) for name in FAMILY_NAMES}
    assert [cfg[n].qk_norm for n in FAMILY_NAMES] == [True, False, False, True, False]
    assert (cfg["qwen2"].attention_bias, cfg["qwen2"].attention_o_bias) == (True, False)
    assert [cfg[n].sliding_window for n in FAMILY_NAMES] == [0, 0, WINDOW, 0, 0]
    assert cfg["qwen3_moe"].moe_layers == (True, False, True) and not cfg["qwen3_moe"].norm_topk_prob
    assert cfg["mixtral"].moe_layers == (True, True) and cfg["mixtral"].norm_topk_prob
    assert (cfg["mixtral"].num_experts, cfg["mixtral"].experts_per_token, cfg["mixtral"].moe_intermediate_size) == (
        5,
        2,
        40,
    )
    for c in cfg.values():
        assert not c.norm_zero_centred and not c.attn_output_gate and c.rotary_dim == c.head_dim


def test_logits_equal_transformers_in_one_prefill_pass(fam):
    name, path, ref = fam
    assert_one_pass_matches(path, ref, prompt(WINDOW - 1, seed=1), max_len=WINDOW, tol=TOL)


def test_logits_equal_transformers_on_the_decode_route(fam):
    name, path, ref = fam
    assert_decode_route_matches(path, ref, prompt(13, seed=2), tol=TOL)


def test_greedy_generation_equals_transformers_generate(fam):
    name, path, ref = fam
    tokens, new = prompt(11, seed=3), 24
    assert greedy_tokens(path, tokens, new, max_len=WINDOW) == hf_greedy(ref, tokens, new)


def test_a_context_past_the_sliding_window_is_refused(family_artifacts):
    target = Target.load(family_artifacts["mistral"][0], dtype=torch.float32)
    target.new_state(slots=1, max_len=WINDOW)
    with pytest.raises(ConfigError, match=rf"--max-len {WINDOW + 1}: this mistral model attends over a sliding "):
        target.new_state(slots=1, max_len=WINDOW + 1)
