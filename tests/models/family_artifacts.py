"""Fixtures for the plain-attention families (qwen3, qwen2, mistral, qwen3_moe, mixtral): tiny random Hugging Face
artifacts written once per session with transformers' own `save_pretrained`, and the transformers models (float32,
the oracle).

The configs are awkward on purpose: grouped-query heads, Qwen2's q/k/v biases, a Mistral sliding window, a dense
layer among Qwen3-MoE layers with `norm_topk_prob` off, Mixtral's top-2 over an odd number of experts. Weights are
re-drawn at about unit activation scale (transformers' 0.02 init makes every logit ~0, which would let a wrong model
pass an absolute tolerance).
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 101
WINDOW = 48  # the Mistral artifact's sliding window: the tests stay within it


def _rescale(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(p.shape[-1])
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif "norm" in name:  # plain RMSNorm scales in every one of these families
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:  # biases
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def family_configs():
    t = transformers
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    return {
        "qwen3": (t.Qwen3Config(**base, num_hidden_layers=3, tie_word_embeddings=False), t.Qwen3ForCausalLM),
        "qwen2": (
            t.Qwen2Config(
                **{k: v for k, v in base.items() if k != "head_dim"}, tie_word_embeddings=True, num_hidden_layers=3
            ),
            t.Qwen2ForCausalLM,
        ),
        "mistral": (t.MistralConfig(**base, num_hidden_layers=2, sliding_window=WINDOW), t.MistralForCausalLM),
        "qwen3_moe": (
            t.Qwen3MoeConfig(
                **base,
                num_hidden_layers=3,
                num_experts=6,
                num_experts_per_tok=3,
                moe_intermediate_size=32,
                mlp_only_layers=[1],
                norm_topk_prob=False,
            ),
            t.Qwen3MoeForCausalLM,
        ),
        "mixtral": (
            t.MixtralConfig(**{**base, "intermediate_size": 40}, num_hidden_layers=2, num_local_experts=5),
            t.MixtralForCausalLM,
        ),
    }


FAMILY_NAMES = ("qwen3", "qwen2", "mistral", "qwen3_moe", "mixtral")
MOE_NAMES = ("qwen3_moe", "mixtral")


@pytest.fixture(scope="session")
def family_artifacts(tmp_path_factory):
    """family -> (artifact dir, transformers model in float32, eval mode)."""
    out = {}
    for i, (name, (cfg, cls)) in enumerate(family_configs().items()):
        torch.manual_seed(i)
        model = cls(cfg).eval()
        _rescale(model, seed=200 + i)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = (path, model)
    return out


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_greedy(model, tokens: list[int], new: int) -> list[int]:
    """transformers' greedy continuation of `tokens`, exactly `new` tokens: the argmax of its full forward, token
    by token (not `generate`, whose min_new_tokens suppresses the config's EOS id, which Mistral's sets)."""
    seq = list(tokens)
    with torch.no_grad():
        for _ in range(new):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(tokens) :]
