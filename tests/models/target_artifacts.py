"""Fixtures for the target-model tests: tiny random Hugging Face artifacts of the three target families, written once
per session with transformers.

The configs are deliberately awkward: grouped-query heads, partial rotary, Gated DeltaNet layers mixed with
attention layers in an irregular order, value heads a multiple of key heads, a dense layer among MoE layers and
top-3 routing. Weights are re-drawn at about unit activation scale (transformers' 0.02 init makes every logit ~0,
which would let a wrong model pass an absolute tolerance).
"""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 101


def _rescale(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                continue
            if p.dim() >= 2:
                std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(p.shape[-1])
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif "linear_attn.norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:  # RMSNorm weights: plain (llama) or zero-centred (Qwen); small noise either way
                base = 1.0 if ("llama" in type(model).__name__.lower()) else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))


def _configs():
    t = transformers
    gdn = dict(
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
    )
    qwen = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=72,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
        num_hidden_layers=5,
        **gdn,
    )
    return {
        "llama": (
            t.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=42,
                intermediate_size=72,
                num_hidden_layers=3,
                num_attention_heads=6,
                num_key_value_heads=2,
                head_dim=8,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1e5},
            ),
            t.LlamaForCausalLM,
        ),
        "qwen3_5_text": (t.Qwen3_5TextConfig(**qwen), t.Qwen3_5ForCausalLM),
        "qwen3_next": (
            t.Qwen3NextConfig(
                **qwen,
                num_experts=7,
                num_experts_per_tok=3,
                moe_intermediate_size=24,
                shared_expert_intermediate_size=20,
                decoder_sparse_step=1,
                mlp_only_layers=[2],
                norm_topk_prob=True,
            ),
            t.Qwen3NextForCausalLM,
        ),
    }


FAMILIES = ("llama", "qwen3_5_text", "qwen3_next")


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory):
    """family -> (artifact dir, transformers model in float32, eval mode)."""
    out = {}
    for i, (name, (cfg, cls)) in enumerate(_configs().items()):
        torch.manual_seed(i)
        model = cls(cfg).eval()
        _rescale(model, seed=100 + i)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        out[name] = (path, model)
    return out


@pytest.fixture(params=FAMILIES)
def family(request, artifacts):
    return request.param, *artifacts[request.param]


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# Helpers shared by the target tests: plain decoding through Target, one row per pass.


def prefill(target, state, slot: int, tokens: list[int], chunks: list[int] | None = None):
    """Run `tokens` into `slot` from position 0 in chunks (record="last"), committing each; returns the last logits."""
    from speclane.stages.models.state import RowBatch

    chunks = chunks or [len(tokens)]
    assert sum(chunks) == len(tokens)
    start, logits = 0, None
    for n in chunks:
        batch = RowBatch.build([(slot, start, tokens[start : start + n])])
        out = target.forward(batch, state, record="last")
        target.commit(state, batch, torch.tensor([n]), out)
        start, logits = start + n, out.logits
    return logits


def decode_one(target, state, lanes: list[tuple[int, int, int]]):
    """One plain decode round: each lane (slot, position, token) runs one row and commits it; returns logits."""
    from speclane.stages.models.state import RowBatch

    batch = RowBatch.build([(slot, pos, [tok]) for slot, pos, tok in lanes])
    out = target.forward(batch, state, record="rows")
    target.commit(state, batch, torch.ones(len(lanes), dtype=torch.int64), out)
    return out.logits


def slot_state(state, slot: int, n: int) -> list[torch.Tensor]:
    """Everything a slot carries, cut to its committed KV length `n` (the caller's: the state keeps no length):
    to compare two states exactly."""
    from speclane.stages.models.state import AttnCache

    parts = []
    for c in state.layers:
        if isinstance(c, AttnCache):
            parts += [c.k[slot, :, :n], c.v[slot, :, :n]]
        else:
            parts += [c.conv[slot], c.recurrent[slot]]
    return parts


def with_words(src, dst):
    """A copy of the artifact `src` at `dst` with a word-level tokenizer ('t0' ... 't100'; 't3' ends a
    generation), so the command line can run it."""
    import json
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(src, dst)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t3"}))
    return dst
