"""Convert a GGUF file into a Hugging Face style llama directory: config.json, model.safetensors, tokenizer files.

The model shape comes from the GGUF metadata (`llama.*` keys), never from the file name. Weights are dequantized
with `gguf.quants.dequantize`, renamed to transformers' llama names, and q_proj/k_proj are un-permuted from
llama.cpp's rotary layout back to Hugging Face's. Tensors are stored as float32: the dequantized values of every
GGUF type speclane meets (Q4_x, Q8_0, F16) are exact in float32 but not in bfloat16 (an fp16 scale times a 4-bit
level has more than bf16's 8 significant bits), so float32 keeps the conversion lossless and lets float32 tests
compare against the GGUF itself; a loader that runs in bf16 rounds once, at load.

Caching, fingerprints and atomic writes belong in `artifact.py`; the vocabulary rebuild in `gguf_vocab.py`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models import gguf_gemma
from speclane.stages.models.families import GGUF_ARCHITECTURES
from speclane.stages.models.gguf_vocab import build_tokenizer

# Per-layer GGUF tensor name -> transformers llama name (convert_hf_to_gguf's tensor map, read backwards).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
SUPPORTED_ARCHITECTURES = ("llama",)


def read_metadata(reader: Any) -> dict[str, Any]:
    """Every metadata key as a Python value (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _f32(value: float) -> float:
    # GGUF stores floats as float32; the shortest decimal that round-trips (1e-05, not 9.9999997e-06) is the
    # number the original config held.
    return float(str(np.float32(value)))


def build_config(meta: dict[str, Any], tensor_names: set[str], where: str) -> dict[str, Any]:
    """transformers' LlamaConfig fields from `llama.*` metadata; every missing required key is listed at once."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ArtifactError(
            f"{where}: general.architecture = {arch!r}; speclane converts only "
            f"{SUPPORTED_ARCHITECTURES + GGUF_ARCHITECTURES + (gguf_gemma.ARCH,)} GGUF files. "
            "Pass a Hugging Face directory (config.json + *.safetensors) for other models."
        )
    required = (
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.layer_norm_rms_epsilon",
    )
    missing = [f"{arch}.{k}" for k in required if f"{arch}.{k}" not in meta]
    if missing:
        raise ArtifactError(f"{where}: metadata keys missing: {', '.join(missing)}; the file cannot be converted.")
    key = lambda name, default=None: meta.get(f"{arch}.{name}", default)  # noqa: E731
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise ArtifactError(
            f"{where}: {arch}.rope.dimension_count differs from the head size {head_dim}; partial "
            "rotary llama models are not supported."
        )
    if key("rope.scaling.type") not in (None, "none") or "rope_freqs.weight" in tensor_names:
        raise ArtifactError(
            f"{where}: the file uses RoPE scaling ({key('rope.scaling.type')!r} or rope_freqs), "
            "which the converter does not carry over; pass a Hugging Face directory instead."
        )
    vocab_size = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else key("vocab_size")
    ids = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos")}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab_size),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon")),
        # llama.cpp's default base when the key is absent, as for the original LLaMA.
        "rope_theta": _f32(key("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": int(key("context_length")),
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        # llama.cpp writes `output.weight` only when the head is not the embedding matrix.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": None if ids["bos"] is None else int(ids["bos"]),
        "eos_token_id": None if ids["eos"] is None else int(ids["eos"]),
        "pad_token_id": None
        if meta.get("tokenizer.ggml.padding_token_id") is None
        else int(meta["tokenizer.ggml.padding_token_id"]),
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def hf_name(gguf_name: str, where: str) -> str:
    """transformers' name for a GGUF tensor; an unknown tensor is an error, never silently dropped."""
    if m := _BLOCK.fullmatch(gguf_name):
        layer, part, kind = m.groups()
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    else:
        stem, _, kind = gguf_name.rpartition(".")
        if stem in _GLOBAL_NAMES and kind == "weight":
            return f"{_GLOBAL_NAMES[stem]}.weight"
    raise ArtifactError(f"{where}: tensor {gguf_name!r} has no llama equivalent; the file is not a plain llama model.")


def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's `permute` of q/k rows: llama.cpp pairs rotary halves as (0,1),(2,3)...
    per head, HF as (i, i + head_dim/2). Rows [heads * head_dim] regroup as [heads, 2, head_dim/2]."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The HF llama tensors a config implies, with their shapes: what a converted directory must hold."""
    h, f, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], h), "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], h)
    per_layer = {
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (f, h),
        "mlp.up_proj.weight": (f, h),
        "mlp.down_proj.weight": (h, f),
    }
    if config["attention_bias"]:
        per_layer |= {"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    for i in range(config["num_hidden_layers"]):
        shapes |= {f"model.layers.{i}.{name}": shape for name, shape in per_layer.items()}
    return shapes


def convert(gguf_path: Path, out_dir: Path, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json for `gguf_path` into
    `out_dir` (which must exist); returns the config. Not atomic: `artifact.py` writes into a temp dir.
    `progress(done, total)` is called after each tensor (and once more when the files are written)."""
    import gguf

    where = str(gguf_path)
    try:
        reader = gguf.GGUFReader(gguf_path)
    except Exception as exc:  # the reader raises ValueError, struct.error, OSError... on a bad file
        raise ArtifactError(f"{where}: not a readable GGUF file ({exc}); check the download or pass another file.")
    meta = read_metadata(reader)
    from speclane.stages.models import gguf_families  # imports this module's helpers

    if gguf_families.handles(meta):  # qwen2, qwen3, qwen3moe, llama with experts or a sliding window
        return gguf_families.convert(reader, meta, out_dir, progress, where)
    if gguf_gemma.handles(meta):  # gemma3: its own names, (1 + w) norms and sentencepiece vocabulary
        return gguf_gemma.convert(reader, meta, out_dir, progress, where)
    tensors_by_name = {t.name: t for t in reader.tensors}
    config = build_config(meta, set(tensors_by_name), where)
    tokenizer, tok_config = build_tokenizer(meta, where)
    tok_config["model_max_length"] = config["max_position_embeddings"]

    expected = expected_shapes(config)
    state: dict[str, torch.Tensor] = {}
    total = len(tensors_by_name) + 1
    for done, (name, t) in enumerate(tensors_by_name.items()):
        if progress is not None:
            progress(done, total)
        target = hf_name(name, where)
        w = dequantized(t, name, where)
        if tuple(w.shape) != expected.get(target, tuple(w.shape)):
            raise ArtifactError(
                f"{where}: tensor {name!r} has shape {tuple(w.shape)}, the metadata implies "
                f"{expected[target]} for {target}; the file is inconsistent."
            )
        if ".attn_q." in name:
            w = unpermute_rotary(w, config["num_attention_heads"])
        elif ".attn_k." in name:
            w = unpermute_rotary(w, config["num_key_value_heads"])
        state[target] = w.contiguous()
    write_complete(out_dir, state, expected, "llama", config, tokenizer, tok_config, where)
    if progress is not None:
        progress(total, total)
    return config


def dequantized(t: Any, name: str, where: str) -> torch.Tensor:
    """GGUF tensor `t` (named `name` in the file at `where`) as float32 memory torch owns."""
    import gguf

    try:
        array = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError as exc:
        raise ArtifactError(
            f"{where}: tensor {name!r} is {t.tensor_type.name}, which gguf cannot dequantize "
            f"({exc}); upgrade the gguf package or use another quantization."
        )
    # F32 tensors come back as read-only views of the file's mmap; torch wants memory it may own.
    array = np.ascontiguousarray(array, dtype=np.float32)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def write_complete(
    out_dir: Path,
    state: dict[str, torch.Tensor],
    expected: dict[str, tuple[int, ...]],
    model: str,
    config: dict,
    tokenizer: Any,
    tok_config: dict,
    where: str,
) -> None:
    """`write_artifact`, once every tensor `expected` names is in `state`; else an error naming the first missing
    ones of a `model` (its name in the message) with the config's layer count."""
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ArtifactError(
            f"{where}: {len(missing)} tensor(s) missing for a {config['num_hidden_layers']}-layer "
            f"{model}, first {missing[:3]}; the file is incomplete."
        )
    write_artifact(out_dir, state, config, tokenizer, tok_config)


def write_artifact(
    out_dir: Path, state: dict[str, torch.Tensor], config: dict, tokenizer: Any, tok_config: dict
) -> None:
    """A Hugging Face style directory: model.safetensors, config.json, tokenizer.json, tokenizer_config.json."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"), {"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
