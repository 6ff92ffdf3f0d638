"""Convert a Gemma 3 GGUF (`general.architecture = "gemma3"`) into a Hugging Face `gemma3_text` directory.

The shape comes from the `gemma3.*` metadata and from which tensors the file holds, never from the file name; what
the metadata leaves out is what llama.cpp assumes for the architecture: the local layers' RoPE base 10000 and one
global layer in six (unless the file says `rope.freq_base_swa` or `attention.sliding_window_pattern`), and the
query scale 1/sqrt(head size), or 1/sqrt(hidden / heads) for the 62-layer (27B) model. Weights are dequantized to
float32 (exact for every GGUF type, see gguf.py) and renamed to transformers' Gemma 3 names; llama.cpp stores every
RMSNorm weight as (1 + w), so 1 is taken off again, and q/k keep Hugging Face's rotate-half layout (llama.cpp runs
Gemma with NeoX RoPE: no permutation). The directory is one transformers reads too.
Not here: the vocabulary and chat template (gemma_vocab.py), the llama converter and caching (gguf.py, artifact.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.gemma_vocab import build_gemma_tokenizer

ARCH = "gemma3"
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_LAYER = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_REQUIRED = (
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
)


def handles(meta: dict[str, Any]) -> bool:
    """Whether this module converts the file."""
    return meta.get("general.architecture") == ARCH


def _f32(value: float) -> float:
    return float(str(np.float32(value)))  # GGUF floats are float32: the shortest decimal that round-trips


def build_config(meta: dict[str, Any], names: set[str], where: str) -> dict[str, Any]:
    """transformers' Gemma3TextConfig fields from `gemma3.*` metadata; every missing required key listed at once."""
    missing = [f"{ARCH}.{k}" for k in _REQUIRED if f"{ARCH}.{k}" not in meta]
    if missing:
        raise ArtifactError(f"{where}: metadata keys missing: {', '.join(missing)}; the file cannot be converted.")
    key = lambda name, default=None: meta.get(f"{ARCH}.{name}", default)  # noqa: E731
    hidden, heads, layers = int(key("embedding_length")), int(key("attention.head_count")), int(key("block_count"))
    head_dim = int(key("attention.key_length", 256))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise ArtifactError(f"{where}: {ARCH}.attention.value_length differs from key_length; not a Gemma 3 file.")
    scaling, factor = key("rope.scaling.type"), float(key("rope.scaling.factor", 1.0) or 1.0)
    if scaling not in (None, "none", "linear") or "rope_freqs.weight" in names:
        raise ArtifactError(
            f"{where}: the file uses RoPE scaling {scaling!r} (or rope_freqs), which Gemma 3 does not; "
            "pass a Hugging Face directory instead."
        )
    full = {"rope_type": "default", "rope_theta": _f32(key("rope.freq_base", 1_000_000.0))}
    if factor != 1.0:
        full |= {"rope_type": "linear", "factor": _f32(factor)}
    pattern = key("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # one flag a layer: True where the layer is local
        if len(pattern) != layers:
            raise ArtifactError(f"{where}: {ARCH}.attention.sliding_window_pattern lists {len(pattern)} layers.")
        local = [bool(p) for p in pattern]
    else:
        local = [bool((i + 1) % int(pattern)) for i in range(layers)]
    tokens = meta.get("tokenizer.ggml.tokens") or ()
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding")}
    # llama.cpp ends a generation at Gemma's end of turn as well as at <eos>
    eos = [int(ids["eos"])] if ids["eos"] is not None else []
    eos += [i for i, t in enumerate(tokens) if t == "<end_of_turn>"][:1]
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": len(tokens) or int(key("vocab_size", 0)),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon")),
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": _f32(key("rope.freq_base_swa", 10_000.0))},
        },
        "sliding_window": int(key("attention.sliding_window")),
        "layer_types": ["sliding_attention" if x else "full_attention" for x in local],
        "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
        "final_logit_softcapping": key("final_logit_softcapping"),
        "attn_logit_softcapping": None,
        "max_position_embeddings": int(key("context_length", 32768)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": None if ids["bos"] is None else int(ids["bos"]),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": None if ids["padding"] is None else int(ids["padding"]),
        "torch_dtype": "float32",
    }
    if not config["vocab_size"]:
        raise ArtifactError(f"{where}: neither tokenizer.ggml.tokens nor {ARCH}.vocab_size gives the vocabulary size.")
    return config


def hf_name(name: str, where: str) -> str:
    """transformers' Gemma 3 name of a GGUF tensor; an unknown tensor is an error, never silently dropped."""
    m = _BLOCK.fullmatch(name)
    if m and m[2] in _LAYER:
        return f"model.layers.{m[1]}.{_LAYER[m[2]]}.weight"
    stem, _, kind = name.rpartition(".")
    if not m and stem in _GLOBAL and kind == "weight":
        return f"{_GLOBAL[stem]}.weight"
    raise ArtifactError(f"{where}: tensor {name!r} has no Gemma 3 equivalent; the file is not a Gemma 3 text model.")


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The transformers tensors a config implies, with their shapes: what a converted directory must hold."""
    h, f, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], h), "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], h)
    per_layer = {name: (h,) for name in list(_LAYER.values())[:4]} | {
        "self_attn.q_norm": (d,),
        "self_attn.k_norm": (d,),
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "mlp.gate_proj": (f, h),
        "mlp.up_proj": (f, h),
        "mlp.down_proj": (h, f),
    }
    for i in range(config["num_hidden_layers"]):
        shapes |= {f"model.layers.{i}.{name}.weight": shape for name, shape in per_layer.items()}
    return shapes


def convert(reader: Any, meta: dict[str, Any], out_dir: Path, progress: Callable | None, where: str) -> dict[str, Any]:
    """Write config.json, model.safetensors and the tokenizer files of the file `reader` reads into `out_dir`;
    returns the config. The caller (gguf.convert) opened the file and read `meta`."""
    from speclane.stages.models.gguf import dequantized, write_complete  # gguf.py imports this module

    tensors = {t.name: t for t in reader.tensors}
    config = build_config(meta, set(tensors), where)
    tokenizer, tok_config = build_gemma_tokenizer(meta, where)
    tok_config["model_max_length"] = config["max_position_embeddings"]
    expected = expected_shapes(config)
    state: dict[str, torch.Tensor] = {}
    total = len(tensors) + 1
    for done, (name, t) in enumerate(tensors.items()):
        if progress is not None:
            progress(done, total)
        target = hf_name(name, where)
        w = dequantized(t, name, where)
        if tuple(w.shape) != expected.get(target):
            raise ArtifactError(
                f"{where}: tensor {name!r} has shape {tuple(w.shape)}, the metadata implies "
                f"{expected.get(target)} for {target}; the file is inconsistent."
            )
        state[target] = w - 1.0 if target.endswith("norm.weight") else w  # llama.cpp stored 1 + w
    write_complete(out_dir, state, expected, "Gemma 3", config, tokenizer, tok_config, where)
    if progress is not None:
        progress(total, total)
    return config
