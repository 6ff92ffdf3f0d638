"""Gemma 3 (`gemma3_text`, and the `gemma3` wrapper's language model) against transformers on tiny random artifacts
(float32), and the engine's greedy output with n-gram speculation equal to plain decoding."""

from __future__ import annotations

import json

import pytest
import torch
from gemma_artifacts import WINDOW, gemma_artifacts, gemma_config, prompt  # noqa: F401  (fixtures)
from oracle_checks import assert_one_pass_matches, hf_generate, reference_logits

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.gemma import GemmaTarget
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

# float32 with other summation orders than transformers (fused q|k|v and gate|up matrices, the C kernels' fixed
# orders, a windowed key gather): a few ulp per op over 5 layers, an order of magnitude under this bound, which stays
# far below what a real defect gives (a missing (1 + w), a norm in the wrong place, the wrong RoPE base or window
# moves logits by O(0.1) or more).
TOL = 2e-4


@pytest.fixture(params=["plain", "capped"])
def gemma(request, gemma_artifacts):
    return gemma_artifacts[request.param]


def test_config_reads_local_layers_scale_and_rope(gemma_artifacts):
    cfg = ModelConfig.load(gemma_artifacts["capped"][0])
    assert cfg.model_type == "gemma3_text" and cfg.norm_zero_centred and cfg.qk_norm and cfg.tie_word_embeddings
    assert cfg.local_layers == (True, True, False, True, False) and cfg.local_window == WINDOW
    assert (cfg.rope_theta, cfg.rope_factor, cfg.rope_local_theta) == (50000.0, 2.0, 1000.0)
    assert cfg.attn_scale == pytest.approx(24**-0.5) and cfg.final_softcap == 20.0


def test_logits_equal_transformers_in_one_wide_pass(gemma):
    path, ref = gemma
    tokens = prompt(70, seed=1)  # past the 64-row decode route: one SDPA a lane, windowed on the local layers
    assert isinstance(assert_one_pass_matches(path, ref, tokens, max_len=96, tol=TOL), GemmaTarget)


@pytest.mark.parametrize("kernels", ["c", "twin"])
def test_logits_equal_transformers_on_the_decode_route(gemma, kernels, request):
    if kernels == "twin":
        request.getfixturevalue("no_cpu_kernels")  # the padded-grid route of a machine without the C kernels
    path, ref = gemma
    tokens = prompt(19, seed=2)  # every local layer's window slides past the first positions
    want = reference_logits(ref, tokens)
    target = Target.load(path, dtype=torch.float32)
    state = target.new_state(slots=2, max_len=32)
    got = []
    for i in range(0, len(tokens), 3):  # three rows a pass, as a verify round runs them
        chunk = tokens[i : i + 3]
        got.append(target.forward(RowBatch.build([(1, i, chunk)]), state).logits)
    torch.testing.assert_close(torch.cat(got), want, atol=TOL, rtol=0)


def test_greedy_generation_equals_transformers_generate(gemma_artifacts):
    from speclane.stages.models.decode import greedy_decode

    path, ref = gemma_artifacts["plain"]
    tokens, new = prompt(11, seed=3), 20
    got = greedy_decode(Target.load(path, dtype=torch.float32), [tokens], new)
    assert list(got[0]) == hf_generate(ref, tokens, new)


def test_wrapper_artifact_loads_its_language_model(gemma_artifacts, tmp_path):
    """A `gemma3` (image + text) artifact: the text model is its text_config, its tensors under language_model."""
    transformers = pytest.importorskip("transformers")
    path, text_model = gemma_artifacts["plain"]
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    cfg = transformers.Gemma3Config(text_config=text_model.config.to_dict(), vision_config=vision.to_dict())
    wrapper = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    wrapper.model.language_model.load_state_dict(text_model.model.state_dict())
    wrapper.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma3"
    tokens = prompt(12, seed=4)
    want = reference_logits(text_model, tokens)
    target = Target.load(tmp_path, dtype=torch.float32)
    out = target.forward(RowBatch.build([(0, 0, tokens)]), target.new_state(slots=1, max_len=16))
    torch.testing.assert_close(out.logits, want, atol=TOL, rtol=0)


@pytest.mark.parametrize(
    ("kernels", "dtype", "quant"),
    [
        ("c", torch.float32, "none"),
        ("twin", torch.float32, "none"),
        ("c", torch.bfloat16, "none"),
        ("c", torch.bfloat16, "int8"),
    ],
    ids=["c-float32", "twin-float32", "c-bfloat16", "c-bfloat16-int8"],
)
def test_engine_ngram_equals_plain_decoding(gemma_artifacts, kernels, dtype, quant, request):
    """Invariant 1 on every route Gemma takes: the C kernels (bf16: packed linears), their torch twins, int8."""
    from tests.round.conftest import engine, mixed_prompts, requests

    if kernels == "twin":
        request.getfixturevalue("no_cpu_kernels")
    target = Target.load(gemma_artifacts["plain"][0], dtype=dtype, quant=quant)
    prompts = mixed_prompts(4)
    alone = [engine(target, max_len=96).generate(requests([p], 20))[0].tokens for p in prompts]
    for k in (2, 5):
        eng = engine(target, "ngram", k=k, max_lanes=4, max_len=96)
        got = eng.generate(requests(prompts, 20))
        assert [r.tokens for r in got] == alone, k
        assert eng.stats(list(eng.retired))["drafted"] > 0


def _config(tmp_path, **changes):
    raw = {**gemma_config().to_dict(), **changes}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_activation": "silu"}, "hidden_activation 'silu' is not supported"),
        ({"layer_types": ["sliding_attention", "chunked_attention"]}, "key 'layer_types' must list 5"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}},
            "the global layers' rope_type 'yarn' is not supported",
        ),
        ({"sliding_window": 0}, "key 'sliding_window' must be at least 1"),
        ({"num_key_value_heads": 3}, "num_attention_heads must be a multiple of num_key_value_heads"),
    ],
)
def test_bad_configs_are_refused_naming_the_key(tmp_path, changes, message):
    with pytest.raises(ArtifactError, match=message):
        ModelConfig.load(_config(tmp_path, **changes))


def test_older_config_layout_reads_the_same(tmp_path, gemma_artifacts):
    """The hub's older keys: rope_theta + rope_local_base_freq + rope_scaling, sliding_window_pattern."""
    new = ModelConfig.load(gemma_artifacts["plain"][0])
    raw = {k: v for k, v in gemma_config().to_dict().items() if k not in ("rope_parameters", "layer_types")}
    raw |= {
        "rope_theta": 50000.0,
        "rope_local_base_freq": 1000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "sliding_window_pattern": 3,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    old = ModelConfig.load(tmp_path)
    assert old.local_layers == (True, True, False, True, True)  # every third layer global
    assert (old.rope_theta, old.rope_factor, old.rope_local_theta) == (new.rope_theta, 2.0, new.rope_local_theta)
