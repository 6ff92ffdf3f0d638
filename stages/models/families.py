"""The plain-attention families beside llama: `qwen3`, `qwen2`, `mistral` (dense) and `qwen3_moe`, `mixtral`,
`qwen2_moe` (MoE).

Owns: each family's quirks read from its `config.json` into `ModelConfig` fields (`family_fields`), resolved once:
Qwen3's per-head q/k RMSNorm, Qwen2's q/k/v bias without an o_proj bias, the sliding window (Mistral's
`sliding_window`, Qwen's only under `use_sliding_window`), which layers are MoE and how their top-k weights are
normalised (qwen3_moe's `norm_topk_prob`; Mixtral always renormalises its top-2 over the softmax), and Mixtral's
tensor names mapped onto the names the loaders read (`canonical_names`). None of these families has an output gate,
zero-centred norms or partial rotary; qwen2_moe alone has a shared expert (sigmoid-gated, as Qwen3-Next's) and reads
its q/k/v bias from `qkv_bias` (default true, as Qwen1.5-MoE downloads have it).
Not here: parsing the keys every family shares (config.py), reading tensors (weights.py), GGUF (gguf_families.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

FAMILIES = ("qwen3", "qwen2", "mistral", "qwen3_moe", "mixtral", "qwen2_moe")
MOE_FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe")
# GGUF `general.architecture`s converted into these families (gguf_families.py), beside `llama` files with experts
# (Mixtral) or a sliding window (Mistral)
GGUF_ARCHITECTURES = ("qwen2", "qwen3", "qwen3moe")

# Mixtral's `block_sparse_moe.experts.{j}.w1|w3|w2` are the gate, up and down projections that Qwen's MoE calls
# `mlp.experts.{j}.gate_proj|up_proj|down_proj`; the router is `gate` in both.
_MIXTRAL = re.compile(r"\.block_sparse_moe\.(?:(gate)\.|experts\.(\d+)\.(w1|w2|w3)\.)")
_MIXTRAL_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def family_fields(model_type: str, raw: dict[str, Any], get: Callable[..., Any], layers: int) -> dict[str, Any]:
    """The `ModelConfig` fields of a family in FAMILIES that differ from the llama reading of its config.
    `get(key, kind, default)` reads a typed key (a missing required one is the caller's ArtifactError)."""
    qwen = model_type.startswith("qwen")
    window = get("sliding_window", int, None) if (not qwen or raw.get("use_sliding_window")) else None
    # Qwen2 hard-codes a bias on q/k/v (and none on o) whatever `attention_bias` says; Qwen2-MoE reads `qkv_bias`.
    bias = {"qwen2": True, "qwen2_moe": raw.get("qkv_bias", True)}.get(model_type, raw.get("attention_bias", False))
    fields: dict[str, Any] = dict(
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        attention_bias=bool(bias),
        attention_o_bias=model_type not in ("qwen2", "qwen2_moe"),
        sliding_window=window or 0,
    )
    # Qwen3-MoE downloads write `num_experts`; transformers 5 saves the same count as `num_local_experts`.
    experts = get("num_experts", int, None) or get("num_local_experts", int, 0)
    if model_type in ("qwen3_moe", "qwen2_moe") and experts > 0:
        only, step = set(raw.get("mlp_only_layers") or ()), get("decoder_sparse_step", int, 1)
        fields.update(
            moe_layers=tuple(i not in only and (i + 1) % step == 0 for i in range(layers)),
            num_experts=experts,
            experts_per_token=get("num_experts_per_tok"),
            moe_intermediate_size=get("moe_intermediate_size"),
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        )
        if model_type == "qwen2_moe":
            fields["shared_expert_intermediate_size"] = get("shared_expert_intermediate_size")
    elif model_type == "mixtral":
        fields.update(
            moe_layers=(True,) * layers,
            num_experts=get("num_local_experts"),
            experts_per_token=get("num_experts_per_tok", int, 2),
            moe_intermediate_size=get("intermediate_size"),
            norm_topk_prob=True,
        )
    return fields


def canonical_names(model_type: str) -> Callable[[str], str] | None:
    """The map from a family's tensor names on disk to the names the loaders read, or None where they agree."""
    if model_type != "mixtral":
        return None

    def rename(name: str) -> str:
        def sub(m: re.Match) -> str:
            return ".mlp.gate." if m[1] else f".mlp.experts.{m[2]}.{_MIXTRAL_PROJ[m[3]]}."

        return _MIXTRAL.sub(sub, name)

    return rename
