"""Fixtures for the Gemma 3 tests: tiny random `gemma3_text` artifacts written once per session with transformers'
own `save_pretrained`, and the transformers models (float32, the oracle).

Awkward on purpose: grouped-query heads, local and global layers in an irregular order, a sliding window (5) far
shorter than the prompts, a query scale (`query_pre_attn_scalar` 24) that is not the head size, linear RoPE scaling
on the global layers only. The `capped` artifact sets both soft-caps: transformers' Gemma 3 applies the final logit
cap and ignores the attention one, and so must speclane. Weights are re-drawn at about unit activation scale.
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 101
WINDOW = 5
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def _rescale(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(p.shape[-1])
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:  # Gemma's RMSNorm weights are zero-centred: the scale is 1 + w
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def gemma_config(**extra):
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        layer_types=LAYER_TYPES,
        sliding_window=WINDOW,
        query_pre_attn_scalar=24,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
        },
        **extra,
    )


@pytest.fixture(scope="session")
def gemma_artifacts(tmp_path_factory):
    """name -> (artifact dir, transformers model in float32, eval mode): `plain` and `capped`."""
    out = {}
    # `capped`: a final soft-cap that binds on the largest logits, and an attention cap transformers ignores
    variants = {"plain": {}, "capped": {"attn_logit_softcapping": 4.0, "final_logit_softcapping": 20.0}}
    for i, (name, extra) in enumerate(variants.items()):
        torch.manual_seed(40 + i)
        cfg = gemma_config(**extra)
        model = transformers.Gemma3ForCausalLM(cfg).eval()
        _rescale(model, seed=140 + i)
        path = tmp_path_factory.mktemp(f"gemma-{name}")
        model.save_pretrained(path)
        out[name] = (path, model)
    return out


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
