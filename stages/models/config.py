"""ModelConfig: a target model's shape, read once from an artifact's `config.json`.

Owns: parsing `config.json` of the supported families (`llama`, `qwen3_5_text`, `qwen3_5` (its `text_config`),
`qwen3_next`, the plain-attention families whose quirks `families.py` reads, and Gemma 3's, read by
`gemma_config.py`) into one frozen, typed record, resolving every format quirk here (where rope_theta lives, a missing
head_dim, layer_types written as an interval, zero-centred norms, the q/gate and qkvz layouts) so model code never
looks at raw keys.
Not here: tensors (`weights.py`), guessing anything from paths or names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from speclane.stages.contract.errors import ArtifactError, did_you_mean
from speclane.stages.models.families import FAMILIES, family_fields

GEMMA = ("gemma3_text", "gemma3")  # read by gemma_config.py
SUPPORTED = ("llama", "qwen3_5_text", "qwen3_5", "qwen3_next", *FAMILIES, *GEMMA)
FULL, LINEAR = "full_attention", "linear_attention"


@attrs.frozen
class ModelConfig:
    model_type: str  # the family: llama | qwen3_5_text | qwen3_next ("qwen3_5" maps to qwen3_5_text)
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]  # per decoder layer: "full_attention" or "linear_attention"
    rms_norm_eps: float
    norm_zero_centred: bool  # Qwen norms scale by (1 + w), llama's by w
    tie_word_embeddings: bool
    tensor_prefix: str  # "model." or "model.language_model." (Qwen3.5 multimodal artifacts)
    # full attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rotary_dim: int  # leading dims of each head that RoPE rotates (partial rotary)
    attention_bias: bool  # q/k/v (and o, unless attention_o_bias is False) carry a bias
    attn_output_gate: bool  # q_proj also yields a per-head sigmoid gate on the attention output
    qk_norm: bool
    # dense MLP
    intermediate_size: int
    mlp_bias: bool
    # Gated DeltaNet ("linear_attention" layers)
    gdn_key_heads: int = 0
    gdn_value_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_dim: int = 0
    gdn_conv_kernel: int = 0
    gdn_fused_qkvz: bool = False  # Qwen3-Next stores in_proj_qkvz/in_proj_ba interleaved per key head
    # MoE
    moe_layers: tuple[bool, ...] = ()
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    eos_token_ids: tuple[int, ...] = ()
    attention_o_bias: bool = True  # with attention_bias: o_proj has one too (Qwen2 biases q/k/v only)
    sliding_window: int = 0  # attention sees only this many positions (0: all); longer contexts are refused
    # Gemma 3 (gemma.py): the local layers attend over the last `local_window` positions, with their own RoPE base
    local_layers: tuple[bool, ...] = ()
    local_window: int = 0
    rope_local_theta: float = 0.0
    rope_factor: float = 1.0  # linear RoPE scaling of the global layers: positions / factor
    attn_scale: float = 0.0  # the query scale; 0: head_dim ** -0.5
    final_softcap: float = 0.0  # tanh soft-cap of the output logits (0: none)

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def gdn_conv_dim(self) -> int:
        return 2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Parse `<path>/config.json`; any problem is an ArtifactError naming the file and key."""
        file = Path(path) / "config.json"
        if not file.is_file():
            raise ArtifactError(f"{file}: no config.json in the artifact directory")
        try:
            raw = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ArtifactError(f"{file}: not valid JSON ({e})") from e
        return parse(raw, file)


def parse(raw: dict[str, Any], file: Path) -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type is None:
        raise ArtifactError(f"{file}: missing key 'model_type'")
    if model_type not in SUPPORTED:
        raise ArtifactError(
            f"{file}: unknown model_type '{model_type}'{did_you_mean(str(model_type), SUPPORTED)}; "
            f"supported: {', '.join(SUPPORTED)}"
        )
    if model_type in GEMMA:
        from speclane.stages.models.gemma_config import parse_gemma

        return parse_gemma(raw, file)
    top, prefix = raw, "model."
    if model_type == "qwen3_5":  # the multimodal wrapper: the language model is its text_config
        raw = _get(raw, "text_config", file, dict)
        model_type, prefix = "qwen3_5_text", "model.language_model."

    def get(key, kind=int, default=...):
        return _get(raw, key, file, kind, default)

    hidden, heads = get("hidden_size"), get("num_attention_heads")
    head_dim = get("head_dim", int, None) or hidden // heads
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ArtifactError(f"{file}: rope_type '{rope_type}' is not supported (only 'default')")
    theta = rope.get("rope_theta", raw.get("rope_theta"))
    if theta is None:
        raise ArtifactError(f"{file}: missing key 'rope_theta' (neither rope_parameters.rope_theta nor rope_theta)")
    qwen = model_type not in ("llama", *FAMILIES)  # Qwen3.5 / Qwen3-Next: gated, zero-centred, partial rotary
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25 if qwen else 1.0))
    if get("hidden_act", str, "silu") != "silu":
        raise ArtifactError(f"{file}: hidden_act '{raw['hidden_act']}' is not supported (only 'silu')")
    layers = get("num_hidden_layers")
    if not qwen:
        layer_types = (FULL,) * layers
    else:
        layer_types = raw.get("layer_types") or [
            FULL if (i + 1) % raw.get("full_attention_interval", 4) == 0 else LINEAR for i in range(layers)
        ]
        layer_types = tuple(layer_types[:layers])
        bad = sorted({t for t in layer_types if t not in (FULL, LINEAR)})
        if bad or len(layer_types) != layers:
            raise ArtifactError(
                f"{file}: key 'layer_types' must list {layers} of '{FULL}'/'{LINEAR}', got {bad or len(layer_types)}"
            )
    eos = raw.get("eos_token_id", top.get("eos_token_id"))
    eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
    fields: dict[str, Any] = dict(
        model_type=model_type,
        vocab_size=get("vocab_size"),
        hidden_size=hidden,
        layer_types=layer_types,
        rms_norm_eps=get("rms_norm_eps", float, 1e-6),
        norm_zero_centred=qwen,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", top.get("tie_word_embeddings", False))),
        tensor_prefix=prefix,
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads", int, heads),
        head_dim=head_dim,
        rope_theta=float(theta),
        rotary_dim=int(head_dim * partial),
        attention_bias=bool(raw.get("attention_bias", False)),
        attn_output_gate=qwen,
        qk_norm=qwen,
        intermediate_size=get("intermediate_size"),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        eos_token_ids=eos,
    )
    if LINEAR in layer_types:
        fields.update(
            gdn_key_heads=get("linear_num_key_heads"),
            gdn_value_heads=get("linear_num_value_heads"),
            gdn_key_dim=get("linear_key_head_dim"),
            gdn_value_dim=get("linear_value_head_dim"),
            gdn_conv_kernel=get("linear_conv_kernel_dim"),
            gdn_fused_qkvz=model_type == "qwen3_next",
        )
        if fields["gdn_value_heads"] % fields["gdn_key_heads"]:
            raise ArtifactError(f"{file}: linear_num_value_heads must be a multiple of linear_num_key_heads")
    if heads % fields["num_kv_heads"]:
        raise ArtifactError(f"{file}: num_attention_heads must be a multiple of num_key_value_heads")
    if model_type == "qwen3_next" and get("num_experts", int, 0) > 0:
        only, step = set(raw.get("mlp_only_layers") or ()), get("decoder_sparse_step", int, 1)
        fields.update(
            moe_layers=tuple(i not in only and (i + 1) % step == 0 for i in range(layers)),
            num_experts=get("num_experts"),
            experts_per_token=get("num_experts_per_tok"),
            moe_intermediate_size=get("moe_intermediate_size"),
            shared_expert_intermediate_size=get("shared_expert_intermediate_size"),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        )
    else:
        fields["moe_layers"] = (False,) * layers
    if model_type in FAMILIES:
        fields.update(family_fields(model_type, raw, get, layers))
    return ModelConfig(**fields)


def _get(raw: dict, key: str, file: Path, kind: type, default: Any = ...) -> Any:
    value = raw.get(key)
    if value is None:
        if default is ...:
            raise ArtifactError(f"{file}: missing key '{key}'")
        return default
    if kind is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ArtifactError(f"{file}: key '{key}' must be {kind.__name__}, got {value!r}")
    return value
