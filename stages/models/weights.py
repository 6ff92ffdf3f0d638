"""Weights: a target's tensors, read from an artifact's `*.safetensors` into typed per-layer records.

Owns: finding each tensor by its Hugging Face name, checking its shape against the config, converting it to the
compute dtype once, and the layout changes the model code relies on (q/k/v fused into one matrix, Qwen's per-head
q|gate interleave and Qwen3-Next's per-key-head qkvz/ba interleave split into contiguous blocks, zero-centred norm
weights turned into plain fp32 scales). A missing tensor or a wrong shape is an ArtifactError naming the file, the
tensor and the expected shape. Not here: the math (attention.py, gated_deltanet.py, moe.py).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch
from safetensors import safe_open

from speclane.kernels.quant import Int8Weight
from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.config import LINEAR, ModelConfig
from speclane.stages.models.families import canonical_names

Tensor = torch.Tensor


# A linear layer's weight is a [out, in] tensor in the compute dtype, or an Int8Weight when quantized at load
# (stages/models/quantize.py); kernels/decode_linear.py and wide_linear.py take either.
Linear = Tensor | Int8Weight


@attrs.frozen
class AttentionWeights:
    qkv: Linear  # [nh*hd (+ nh*hd gate) + 2*kvh*hd, hidden]: rows q | gate | k | v
    qkv_bias: Tensor | None
    o: Linear  # [hidden, nh*hd]
    o_bias: Tensor | None
    q_norm: Tensor | None  # [hd] fp32 scale
    k_norm: Tensor | None


@attrs.frozen
class GdnWeights:
    in_proj: Linear  # [conv_dim + nv*dv + 2*nv, hidden]: rows q | k | v | z | b | a
    conv: Tensor  # [conv_dim, kernel] fp32
    neg_a: Tensor  # [nv] fp32, -exp(A_log)
    dt_bias: Tensor  # [nv] fp32
    norm: Tensor  # [dv] fp32 scale of the gated RMSNorm
    out: Linear  # [hidden, nv*dv]


@attrs.frozen
class MlpWeights:
    gate_up: Linear  # [2*inter, hidden]: rows gate | up
    down: Linear  # [hidden, inter]
    gate_up_bias: Tensor | None = None
    down_bias: Tensor | None = None


@attrs.frozen
class MoeWeights:
    router: Tensor  # [experts, hidden]
    gate_up: Tensor | None  # [experts, 2*inter, hidden]; None: read in place by an expert cache (expert_tiers.py)
    down: Tensor | None  # [experts, hidden, inter]; None likewise
    shared: MlpWeights | None  # None: no shared expert (qwen3_moe, mixtral)
    shared_gate: Tensor | None  # [1, hidden]


@attrs.frozen
class LayerWeights:
    input_norm: Tensor  # [hidden] fp32 scale
    post_norm: Tensor
    mixer: AttentionWeights | GdnWeights
    mlp: MlpWeights | MoeWeights


@attrs.frozen
class ModelWeights:
    embed: Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor  # [hidden] fp32 scale
    lm_head: Tensor  # [vocab, hidden] (the embedding itself when tied); what drafters read
    head: Tensor | Int8Weight | None = None  # the target's own output head when it differs (quantized)


class _Source:
    """Every tensor name of the artifact's safetensors files, read on demand with its shape checked. `rename` maps
    a family's names on disk to the names read here (families.canonical_names); a missing tensor is named by the
    name read here, a misshapen one by its name on disk."""

    def __init__(self, path: Path, dtype: torch.dtype, device: torch.device | str, rename=None):
        self.path, self.dtype, self.device = path, dtype, device
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ArtifactError(f"{path}: no *.safetensors files in the artifact directory")
        self.where: dict[str, Path] = {}
        self.disk: dict[str, str] = {}  # the name read here -> the name in the file
        for f in files:
            with safe_open(f, "pt") as h:
                for name in h.keys():
                    canonical = rename(name) if rename else name
                    if canonical not in self.where:
                        self.where[canonical], self.disk[canonical] = f, name

    def has(self, name: str) -> bool:
        return name in self.where

    def raw(self, name: str, shape: tuple[int, ...]) -> Tensor:
        file = self.where.get(name)
        if file is None:
            raise ArtifactError(f"{self.path}: tensor '{name}' is missing (expected shape {list(shape)})")
        name = self.disk[name]
        with safe_open(file, "pt") as h:
            got = tuple(h.get_slice(name).get_shape())
            if got != shape:
                raise ArtifactError(f"{file}: tensor '{name}' has shape {list(got)}, expected {list(shape)}")
            return h.get_tensor(name)

    def get(self, name: str, shape: tuple[int, ...]) -> Tensor:
        return self.raw(name, shape).to(device=self.device, dtype=self.dtype).contiguous()

    def scale(self, name: str, shape: tuple[int, ...], zero_centred: bool) -> Tensor:
        w = self.raw(name, shape).to(device=self.device, dtype=torch.float32)
        return (1.0 + w) if zero_centred else w.contiguous()


def load_weights(
    path: str | Path, cfg: ModelConfig, dtype: torch.dtype, device, routed_experts: bool = True
) -> ModelWeights:
    """Every tensor of the model; `routed_experts=False` leaves the MoE layers' routed experts unread (None), for an
    expert cache that reads them in place from the files."""
    src = _Source(Path(path), dtype, device, canonical_names(cfg.model_type))
    p, h = cfg.tensor_prefix, cfg.hidden_size
    embed = src.get(f"{p}embed_tokens.weight", (cfg.vocab_size, h))
    if cfg.tie_word_embeddings:
        lm_head = embed
    else:
        lm_head = src.get("lm_head.weight", (cfg.vocab_size, h))
    layers = []
    for i, kind in enumerate(cfg.layer_types):
        lp = f"{p}layers.{i}."
        mixer = _gdn(src, cfg, lp + "linear_attn.") if kind == LINEAR else _attention(src, cfg, lp + "self_attn.")
        mlp = (
            _moe(src, cfg, lp + "mlp.", routed_experts)
            if cfg.moe_layers[i]
            else _mlp(src, lp + "mlp.", h, cfg.intermediate_size, cfg.mlp_bias)
        )
        layers.append(
            LayerWeights(
                input_norm=src.scale(lp + "input_layernorm.weight", (h,), cfg.norm_zero_centred),
                post_norm=src.scale(lp + "post_attention_layernorm.weight", (h,), cfg.norm_zero_centred),
                mixer=mixer,
                mlp=mlp,
            )
        )
    final_norm = src.scale(f"{p}norm.weight", (h,), cfg.norm_zero_centred)
    return ModelWeights(embed=embed, layers=tuple(layers), final_norm=final_norm, lm_head=lm_head)


def _attention(src: _Source, cfg: ModelConfig, ap: str) -> AttentionWeights:
    nh, kvh, hd, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    qrows = nh * hd * (2 if cfg.attn_output_gate else 1)

    def q_layout(t: Tensor) -> Tensor:
        # Qwen's q_proj interleaves per head [q (hd) | gate (hd)]; regroup as all q rows, then all gate rows.
        if not cfg.attn_output_gate:
            return t
        t = t.reshape(nh, 2, hd, *t.shape[1:])
        return torch.cat([t[:, 0].reshape(nh * hd, *t.shape[3:]), t[:, 1].reshape(nh * hd, *t.shape[3:])])

    q = q_layout(src.get(ap + "q_proj.weight", (qrows, h)))
    k = src.get(ap + "k_proj.weight", (kvh * hd, h))
    v = src.get(ap + "v_proj.weight", (kvh * hd, h))
    qkv_bias = o_bias = None
    if cfg.attention_bias:
        qkv_bias = torch.cat(
            [
                q_layout(src.get(ap + "q_proj.bias", (qrows,))),
                src.get(ap + "k_proj.bias", (kvh * hd,)),
                src.get(ap + "v_proj.bias", (kvh * hd,)),
            ]
        )
        o_bias = src.get(ap + "o_proj.bias", (h,)) if cfg.attention_o_bias else None
    norms = (
        (
            src.scale(ap + "q_norm.weight", (hd,), cfg.norm_zero_centred),
            src.scale(ap + "k_norm.weight", (hd,), cfg.norm_zero_centred),
        )
        if cfg.qk_norm
        else (None, None)
    )
    return AttentionWeights(
        qkv=torch.cat([q, k, v]).contiguous(),
        qkv_bias=qkv_bias,
        o=src.get(ap + "o_proj.weight", (h, nh * hd)),
        o_bias=o_bias,
        q_norm=norms[0],
        k_norm=norms[1],
    )


def _gdn(src: _Source, cfg: ModelConfig, gp: str) -> GdnWeights:
    nk, nv, dk, dv, h = cfg.gdn_key_heads, cfg.gdn_value_heads, cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.hidden_size
    conv_dim, r = cfg.gdn_conv_dim, nv // nk
    if cfg.gdn_fused_qkvz:
        # Qwen3-Next: rows grouped per key head as [q (dk) | k (dk) | v (r*dv) | z (r*dv)], and ba as [b (r) | a (r)].
        qkvz = src.get(gp + "in_proj_qkvz.weight", (2 * nk * dk + 2 * nv * dv, h)).reshape(nk, 2 * dk + 2 * r * dv, h)
        q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=1)
        ba = src.get(gp + "in_proj_ba.weight", (2 * nv, h)).reshape(nk, 2 * r, h)
        b, a = ba.split([r, r], dim=1)
        blocks = [x.reshape(-1, h) for x in (q, k, v, z, b, a)]
    else:
        blocks = [
            src.get(gp + "in_proj_qkv.weight", (conv_dim, h)),
            src.get(gp + "in_proj_z.weight", (nv * dv, h)),
            src.get(gp + "in_proj_b.weight", (nv, h)),
            src.get(gp + "in_proj_a.weight", (nv, h)),
        ]
    f32 = dict(device=src.device, dtype=torch.float32)
    return GdnWeights(
        in_proj=torch.cat(blocks).contiguous(),
        conv=src.raw(gp + "conv1d.weight", (conv_dim, 1, cfg.gdn_conv_kernel)).to(**f32)[:, 0].contiguous(),
        neg_a=-src.raw(gp + "A_log", (nv,)).to(**f32).exp(),
        dt_bias=src.raw(gp + "dt_bias", (nv,)).to(**f32),
        norm=src.scale(gp + "norm.weight", (dv,), zero_centred=False),
        out=src.get(gp + "out_proj.weight", (h, nv * dv)),
    )


def _mlp(src: _Source, mp: str, h: int, inter: int, bias: bool) -> MlpWeights:
    gate_up = torch.cat([src.get(mp + "gate_proj.weight", (inter, h)), src.get(mp + "up_proj.weight", (inter, h))])
    biases = (None, None)
    if bias:
        biases = (
            torch.cat([src.get(mp + "gate_proj.bias", (inter,)), src.get(mp + "up_proj.bias", (inter,))]),
            src.get(mp + "down_proj.bias", (h,)),
        )
    return MlpWeights(
        gate_up=gate_up.contiguous(),
        down=src.get(mp + "down_proj.weight", (h, inter)),
        gate_up_bias=biases[0],
        down_bias=biases[1],
    )


def _moe(src: _Source, cfg: ModelConfig, mp: str, routed: bool) -> MoeWeights:
    h, e, inter = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    gate_up = down = None
    if routed:  # each expert read straight into its place: a load holds one expert's tensors past what it keeps
        gate_up = torch.empty(e, 2 * inter, h, dtype=src.dtype, device=src.device)
        down = torch.empty(e, h, inter, dtype=src.dtype, device=src.device)
        for j in range(e):
            ep = f"{mp}experts.{j}."
            gate_up[j, :inter].copy_(src.raw(ep + "gate_proj.weight", (inter, h)))
            gate_up[j, inter:].copy_(src.raw(ep + "up_proj.weight", (inter, h)))
            down[j].copy_(src.raw(ep + "down_proj.weight", (h, inter)))
    shared = cfg.shared_expert_intermediate_size > 0
    return MoeWeights(
        router=src.get(mp + "gate.weight", (e, h)),
        gate_up=gate_up,
        down=down,
        shared=_mlp(src, mp + "shared_expert.", h, cfg.shared_expert_intermediate_size, False) if shared else None,
        shared_gate=src.get(mp + "shared_expert_gate.weight", (1, h)) if shared else None,
    )
