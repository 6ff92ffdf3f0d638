"""Convert a GGUF of the plain-attention families into their Hugging Face directory: `qwen2`, `qwen3`, `qwen3moe`,
and `llama` files with routed experts (Mixtral) or a sliding window (Mistral).

The shape comes from the GGUF metadata (`<arch>.*` keys) and from which tensors the file holds (a bias, q/k norms,
which layers route to experts), never from the file name. Weights are dequantized to float32 as in `gguf.py` (every
GGUF type's values are exact there), renamed to transformers' names of the family, the stacked expert tensors
(`ffn_*_exps`, [experts, out, in]) split into one tensor per expert, and q/k un-permuted from llama.cpp's rotary
layout for `llama` files only (Qwen files keep Hugging Face's rotate-half layout). The written directory is one a
`save_pretrained` of that family would give, so transformers reads it too.
Not here: the llama converter and the shared helpers (`gguf.py`), the vocabulary (`gguf_vocab.py`), caching
(`artifact.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.families import GGUF_ARCHITECTURES as ARCHITECTURES
from speclane.stages.models.gguf import _f32, dequantized, unpermute_rotary, write_artifact
from speclane.stages.models.gguf_vocab import build_tokenizer

_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_ATTN = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj"}
_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_DENSE = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
# stacked experts -> (Qwen3-MoE's projection name, Mixtral's)
_EXPERTS = {
    "ffn_gate_exps": ("gate_proj", "w1"),
    "ffn_up_exps": ("up_proj", "w3"),
    "ffn_down_exps": ("down_proj", "w2"),
}


def handles(meta: dict[str, Any]) -> bool:
    """Whether this module converts the file (else `gguf.py`'s llama converter does, or refuses it)."""
    arch = meta.get("general.architecture")
    return arch in ARCHITECTURES or (
        arch == "llama" and (bool(meta.get("llama.expert_count")) or bool(meta.get("llama.attention.sliding_window")))
    )


def build_config(meta: dict[str, Any], names: set[str], where: str) -> dict[str, Any]:
    """The family's transformers config fields from `<arch>.*` metadata and the tensor names."""
    arch = meta["general.architecture"]
    required = ("block_count", "embedding_length", "attention.head_count", "attention.layer_norm_rms_epsilon")
    missing = [f"{arch}.{k}" for k in required if f"{arch}.{k}" not in meta]
    if missing:
        raise ArtifactError(f"{where}: metadata keys missing: {', '.join(missing)}; the file cannot be converted.")
    key = lambda name, default=None: meta.get(f"{arch}.{name}", default)  # noqa: E731
    hidden, heads, layers = int(key("embedding_length")), int(key("attention.head_count")), int(key("block_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise ArtifactError(f"{where}: {arch}.rope.dimension_count differs from the head size {head_dim}.")
    if key("rope.scaling.type") not in (None, "none") or "rope_freqs.weight" in names:
        raise ArtifactError(
            f"{where}: the file uses RoPE scaling ({key('rope.scaling.type')!r} or rope_freqs), which the converter "
            "does not carry over; pass a Hugging Face directory instead."
        )
    experts = int(key("expert_count", 0) or 0)
    moe = [f"blk.{i}.ffn_gate_inp.weight" in names for i in range(layers)]
    if any(moe) and not experts:
        raise ArtifactError(f"{where}: the file routes to experts but {arch}.expert_count is missing.")
    family = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}.get(arch)
    family = family or ("mixtral" if experts else "mistral")
    vocab = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else key("vocab_size")
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")}
    config: dict[str, Any] = {
        "architectures": [_ARCH_CLASS[family]],
        "model_type": family,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length", 0) or key("expert_feed_forward_length", 0)),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 32768)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": None if ids["bos"] is None else int(ids["bos"]),
        "eos_token_id": None if ids["eos"] is None else int(ids["eos"]),
        "torch_dtype": "float32",
    }
    if family in ("qwen3", "qwen3_moe"):
        config["attention_bias"] = "blk.0.attn_q.bias" in names
    if family in ("mistral", "mixtral"):
        config["sliding_window"] = int(key("attention.sliding_window", 0) or 0) or None
    if family == "qwen3_moe":
        config |= {
            "num_experts": experts,
            "num_experts_per_tok": int(key("expert_used_count")),
            "moe_intermediate_size": int(key("expert_feed_forward_length")),
            "mlp_only_layers": [i for i in range(layers) if not moe[i]],
            "decoder_sparse_step": 1,
            # llama.cpp renormalises qwen3moe's top-k weights unless the file says otherwise
            "norm_topk_prob": bool(key("expert_weights_norm", True)),
        }
    if family == "mixtral":
        config |= {"num_local_experts": experts, "num_experts_per_tok": int(key("expert_used_count", 2))}
        if not all(moe):
            raise ArtifactError(f"{where}: a llama file with experts must route in every layer (Mixtral).")
    return config


_ARCH_CLASS = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


def hf_tensors(name: str, w: torch.Tensor, config: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    """transformers' name(s) and tensor(s) of one GGUF tensor (a stacked expert tensor gives one per expert); an
    unknown tensor is an error, never silently dropped."""
    if name in _GLOBAL:
        return {_GLOBAL[name]: w}
    if name == "output.weight":
        return {"lm_head.weight": w}
    m = _BLOCK.fullmatch(name)
    part = m[2] if m else None
    family, lp = config["model_type"], f"model.layers.{m[1]}." if m else ""
    moe = "block_sparse_moe" if family == "mixtral" else "mlp"
    if part in _ATTN:
        if family in ("mistral", "mixtral") and part in ("attn_q", "attn_k"):
            heads = config["num_attention_heads" if part == "attn_q" else "num_key_value_heads"]
            w = unpermute_rotary(w, heads)
        return {f"{lp}self_attn.{_ATTN[part]}.{m[3]}": w}
    if m and m[3] == "weight":
        if part in _LAYER or part in _NORMS or part in _DENSE:
            return {f"{lp}{({**_LAYER, **_NORMS, **_DENSE})[part]}.weight": w}
        if part == "ffn_gate_inp":
            return {f"{lp}{moe}.gate.weight": w}
        if part in _EXPERTS:
            proj = _EXPERTS[part][family == "mixtral"]
            return {f"{lp}{moe}.experts.{j}.{proj}.weight": w[j].contiguous() for j in range(w.shape[0])}
    raise ArtifactError(f"{where}: tensor {name!r} has no {family} equivalent; the file is not a plain {family} model.")


def convert(reader: Any, meta: dict[str, Any], out_dir: Path, progress: Callable | None, where: str) -> dict[str, Any]:
    """Write config.json, model.safetensors and the tokenizer files of the file `reader` reads into `out_dir`;
    returns the config. The caller (gguf.convert) opened the file and read `meta`."""
    tensors = {t.name: t for t in reader.tensors}
    config = build_config(meta, set(tensors), where)
    tokenizer, tok_config = build_tokenizer(meta, where)
    tok_config["model_max_length"] = config["max_position_embeddings"]
    state: dict[str, torch.Tensor] = {}
    total = len(tensors) + 1
    for done, (name, t) in enumerate(tensors.items()):
        if progress is not None:
            progress(done, total)
        state.update(hf_tensors(name, dequantized(t, name, where), config, where))
    write_artifact(out_dir, state, config, tokenizer, tok_config)
    if progress is not None:
        progress(total, total)
    return config
