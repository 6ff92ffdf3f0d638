"""Write a small GGUF from a Hugging Face artifact the way llama.cpp's convert_hf_to_gguf.py lays one out: the
family's `general.architecture` and `<arch>.*` metadata, tensor names, llama's q/k rotary permutation, the routed
experts stacked into `ffn_*_exps` [experts, out, in], and a byte-level BPE vocabulary (`tokenizer.ggml.model =
gpt2`). For the GGUF tests only; transformers is not involved.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
from safetensors.torch import load_file

# family -> GGUF architecture (Mistral and Mixtral are `llama` files, as llama.cpp writes them)
ARCH = {"qwen3": "qwen3", "qwen2": "qwen2", "mistral": "llama", "qwen3_moe": "qwen3moe", "mixtral": "llama"}
EOS = 100
_PER_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
}
_EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")
_EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """101 byte-level tokens (the artifacts' vocabulary size): the printable ASCII bytes, a few merges, two control
    tokens; token 100 is the EOS."""
    tokens = [chr(c) for c in range(33, 127)] + ["Ġ", "Ġa", "ab", "Ġab", "Ċ", "<|im_start|>", "<|im_end|>"]
    types = [1] * 99 + [3, 3]
    return tokens, types, ["Ġ a", "a b", "Ġa b"]


def _permute(w: np.ndarray, heads: int) -> np.ndarray:  # convert_hf_to_gguf.py's LlamaModel.permute
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def spm_vocabulary() -> tuple[list[str], list[int], list[float]]:
    """101 sentencepiece pieces (`tokenizer.ggml.model = llama`, as Mistral and Mixtral files have): <unk>, <s>,
    </s>, the printable ASCII characters, "▁", "▁a", "ab", "▁ab"; scores fall with the position."""
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(33, 127)] + ["▁", "▁a", "ab", "▁ab"]
    return tokens, [2, 3, 3] + [1] * 98, [-float(i) for i in range(len(tokens))]


def write_gguf(
    hf_dir: Path, family: str, out: Path, qtype=gguf.GGMLQuantizationType.F32, window: bool = True, spm: bool = False
) -> Path:
    """`out`, a GGUF of the artifact at `hf_dir` with its 2-D weights in `qtype` (norms stay F32, as llama.cpp
    keeps them). `window=False` leaves a Mistral's sliding window out of the metadata (an older converter's file);
    `spm=True` writes a sentencepiece vocabulary instead of the byte-level one."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    state = {k: v.float().numpy() for k, v in load_file(hf_dir / "model.safetensors").items()}
    arch = ARCH[family]
    w = gguf.GGUFWriter(out, arch)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if family in ("qwen3_moe", "mixtral"):
        w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if family == "qwen3_moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
    if family == "mistral" and window and cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if spm:
        tokens, types, scores = spm_vocabulary()
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    else:
        tokens, types, merges = vocabulary()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_eos_token_id(EOS)

    def put(name: str, array: np.ndarray) -> None:
        if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, array.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(array.astype(np.float32), qtype), raw_dtype=qtype)

    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, array in state.items():
        if m := _EXPERT.fullmatch(name):
            experts.setdefault((int(m[1]), _EXPERT_PART[m[3]]), {})[int(m[2])] = array
            continue
        if name == "model.embed_tokens.weight":
            put("token_embd.weight", array)
        elif name == "model.norm.weight":
            put("output_norm.weight", array)
        elif name == "lm_head.weight":
            put("output.weight", array)
        else:
            m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
            part = _PER_LAYER[m[2]]
            if arch == "llama" and part in ("attn_q", "attn_k"):
                array = _permute(array, heads if part == "attn_q" else kv_heads)
            put(f"blk.{m[1]}.{part}.{m[3]}", array)
    for (layer, part), by_expert in experts.items():
        put(f"blk.{layer}.ffn_{part}_exps.weight", np.stack([by_expert[j] for j in sorted(by_expert)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
