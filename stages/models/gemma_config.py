"""Gemma 3's `config.json` (`gemma3_text`, or the `gemma3` wrapper whose `text_config` is the language model) read
into a `ModelConfig`.

Owns: Gemma's format quirks, resolved once into typed fields: keys the family leaves out take the family's own
defaults (transformers' `Gemma3TextConfig`, which the hub's sparse wrapper configs rely on); the two RoPE bases
(`rope_parameters` per layer type, or the older `rope_theta` + `rope_local_base_freq`, with the older
`rope_scaling` applying to the global layers); `layer_types` or the older `sliding_window_pattern`; the query scale
`query_pre_attn_scalar ** -0.5`; the final logit soft-cap (`attn_logit_softcapping` is not applied: transformers'
Gemma 3 reads it and never uses it, see gemma_attention.py). Every layer is a full attention layer to the rest of the
engine (a KV cache a slot); which of them attend over a sliding window is `local_layers` (`local_window`).
Not here: the tensors (gemma.py), the GGUF metadata (gguf_gemma.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.config import FULL, ModelConfig, _get

SLIDING = "sliding_attention"
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")

# transformers' Gemma3TextConfig defaults: what a key the artifact leaves out means.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "eos_token_id": 1,
}


def _rope(rope: dict[str, Any] | None, theta: float, file: Path, which: str) -> tuple[float, float]:
    """(base, linear factor) of one layer type's RoPE; anything but default or linear scaling is refused."""
    rope = rope or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "linear"):
        raise ArtifactError(
            f"{file}: the {which} layers' rope_type '{kind}' is not supported (only 'default' and 'linear')"
        )
    factor = float(rope.get("factor", 1.0)) if kind == "linear" else 1.0
    if factor <= 0:
        raise ArtifactError(f"{file}: the {which} layers' RoPE factor must be positive, got {factor}")
    return float(rope.get("rope_theta", theta)), factor


def parse_gemma(raw: dict[str, Any], file: Path) -> ModelConfig:
    """The `ModelConfig` of a `gemma3_text` config, or of a `gemma3` wrapper's `text_config`."""
    top, prefix = raw, "model."
    if raw.get("model_type") == "gemma3":  # the multimodal wrapper: the language model is its text_config
        raw, prefix = _get(raw, "text_config", file, dict), "language_model.model."
    eos = raw.get("eos_token_id", top.get("eos_token_id", DEFAULTS["eos_token_id"]))
    raw = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}

    def get(key, kind=int):
        return _get(raw, key, file, kind)

    act = raw.get("hidden_activation") or raw.get("hidden_act")
    if act not in GELU_TANH:
        raise ArtifactError(f"{file}: hidden_activation '{act}' is not supported (Gemma 3 uses 'gelu_pytorch_tanh')")
    if raw.get("use_bidirectional_attention"):
        raise ArtifactError(f"{file}: use_bidirectional_attention is set: an encoder, not a causal language model")
    layers, heads, head_dim = get("num_hidden_layers"), get("num_attention_heads"), get("head_dim")
    kinds = raw.get("layer_types") or [
        FULL if (i + 1) % get("sliding_window_pattern") == 0 else SLIDING for i in range(layers)
    ]
    bad = sorted({k for k in kinds if k not in (FULL, SLIDING)})
    if bad or len(kinds) != layers:
        raise ArtifactError(
            f"{file}: key 'layer_types' must list {layers} of '{FULL}'/'{SLIDING}', got {bad or len(kinds)}"
        )
    params = raw.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:
        glob, local = params.get(FULL), params.get(SLIDING)
    else:  # the older layout: one rope_scaling for the global layers, the local base on its own
        glob, local = raw.get("rope_scaling") or params, {"rope_theta": get("rope_local_base_freq", float)}
    theta, factor = _rope(glob, get("rope_theta", float), file, "global")
    local_theta, local_factor = _rope(local, get("rope_local_base_freq", float), file, "sliding")
    if local_factor != 1.0:
        raise ArtifactError(f"{file}: RoPE scaling of the sliding layers is not supported")
    window = get("sliding_window")
    if window < 1:
        raise ArtifactError(f"{file}: key 'sliding_window' must be at least 1, got {window}")
    kv_heads = get("num_key_value_heads")
    if heads % kv_heads:
        raise ArtifactError(f"{file}: num_attention_heads must be a multiple of num_key_value_heads")
    return ModelConfig(
        model_type="gemma3_text",
        vocab_size=get("vocab_size"),
        hidden_size=get("hidden_size"),
        layer_types=(FULL,) * layers,
        rms_norm_eps=get("rms_norm_eps", float),
        norm_zero_centred=True,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", top.get("tie_word_embeddings", True))),
        tensor_prefix=prefix,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=theta,
        rotary_dim=head_dim,
        attention_bias=bool(raw.get("attention_bias", False)),
        attn_output_gate=False,
        qk_norm=True,
        intermediate_size=get("intermediate_size"),
        mlp_bias=False,
        moe_layers=(False,) * layers,
        eos_token_ids=() if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),),
        local_layers=tuple(k == SLIDING for k in kinds),
        local_window=window,
        rope_local_theta=local_theta,
        rope_factor=factor,
        attn_scale=float(get("query_pre_attn_scalar", float)) ** -0.5,
        final_softcap=float(raw.get("final_logit_softcapping") or 0.0),
    )
