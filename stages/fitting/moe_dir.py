"""Writing a MoEfied model as a Hugging Face style `qwen2_moe` directory that `--model` loads like any download.

Owns: `write_moe_dir` (the tensors as `model.safetensors`, a `config.json` of the `qwen2_moe` family, the base
model's tokenizer files, and `moe.json`, the fit's record) and `moe_dir_config` (that config from the dense base's
`config.json` and the fit's shape). Why `qwen2_moe`: it is the Hugging Face family whose layers are exactly a MoEfied
llama's (plain RMSNorm, full rotary attention without q/k norms, with `qkv_bias` false no biases, a softmax top-k
router and a sigmoid-gated shared expert, `norm_topk_prob` true), so transformers reads the directory too.
Not here: the fit (`moefy.py`), reading the directory (stages/models/config.py, families.py, weights.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from speclane.stages.contract.errors import ArtifactError

# the base's files a tokenizer or chat template is read from, copied when present
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)
# keys of the dense llama config carried over unchanged
CARRIED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def moe_dir_config(base: Path, record: dict) -> dict:
    """The `qwen2_moe` config.json of the MoEfied `base` (a dense llama directory) with the fit's shape `record`
    (num_experts, experts_per_token, moe_intermediate_size, shared_expert_intermediate_size): every layer MoE."""
    raw = json.loads((base / "config.json").read_text())
    if raw.get("model_type") != "llama":
        raise ArtifactError(
            f"{base / 'config.json'}: a MoEfied model's base must be llama, got {raw.get('model_type')}"
        )
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = rope.get("rope_theta", raw.get("rope_theta"))
    if theta is None or rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ArtifactError(f"{base / 'config.json'}: a MoEfied model needs default RoPE with a rope_theta")
    out = {k: raw[k] for k in CARRIED if raw.get(k) is not None}
    out.update(
        architectures=["Qwen2MoeForCausalLM"],
        model_type="qwen2_moe",
        hidden_act="silu",
        rope_theta=float(theta),
        rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
        qkv_bias=False,
        use_sliding_window=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_experts=record["num_experts"],
        num_experts_per_tok=record["experts_per_token"],
        moe_intermediate_size=record["moe_intermediate_size"],
        shared_expert_intermediate_size=record["shared_expert_intermediate_size"],
        norm_topk_prob=True,
    )
    return out


def write_moe_dir(base: Path, out: Path, tensors: dict[str, torch.Tensor], record: dict) -> None:
    """`out` as a loadable qwen2_moe directory: the tensors (HF names), its config, the base's tokenizer files and
    the fit's record. Written into a sibling temporary directory and renamed into place, so a crash leaves no
    half-written model; an existing `out` is replaced."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(moe_dir_config(base, record), indent=1))
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, tmp / name)
    (tmp / "moe.json").write_text(json.dumps(record, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
