"""Which target layers run as one C call (kernels/dense_layer.py), and their weights in the form it reads.

Owns: the rule (a full-attention layer without an output gate and with a dense MLP, on a CPU where the C kernels
are built, in float32 or bfloat16), packing those layers' weights and the output head for VDPBF16PS where the
build has it (`pack_dense`: the packed form replaces the row-major one, so memory does not grow, but for the
head, whose row-major form the embedding and the drafters keep reading), and building `DenseLayer` records from
the model's weights once, at load.
Not here: the layer's arithmetic (kernels/), the op-by-op route the other layers take (target.py).
"""

from __future__ import annotations

import attrs
import torch

from speclane.kernels import cpu_build
from speclane.kernels.dense_layer import DenseLayer
from speclane.kernels.packed import PackedWeight, pack, packs
from speclane.stages.models.config import FULL, ModelConfig
from speclane.stages.models.weights import AttentionWeights, LayerWeights, MlpWeights, ModelWeights


def _fused(cfg: ModelConfig, weights: ModelWeights, i: int) -> bool:
    lw = weights.layers[i]
    return not (
        cfg.layer_types[i] != FULL
        or cfg.moe_layers[i]
        or cfg.attn_output_gate
        or cfg.head_dim % 8
        or not isinstance(lw.mixer, AttentionWeights)
        or not isinstance(lw.mlp, MlpWeights)
    )


def pack_dense(cfg: ModelConfig, weights: ModelWeights, dtype: torch.dtype, device: torch.device) -> ModelWeights:
    """`weights` with the one-call layers' four linears and the output head (bf16 or int8) packed
    (kernels/packed.py) where this process's C kernels read that form; unchanged elsewhere (another build, compute
    dtype or device)."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return weights
    layers = list(weights.layers)
    for i, lw in enumerate(layers):
        a, m = lw.mixer, lw.mlp
        if _fused(cfg, weights, i) and all(packs(t) for t in (a.qkv, a.o, m.gate_up, m.down)):
            layers[i] = attrs.evolve(
                lw,
                mixer=attrs.evolve(a, qkv=pack(a.qkv), o=pack(a.o)),
                mlp=attrs.evolve(m, gate_up=pack(m.gate_up), down=pack(m.down)),
            )
    head = weights.lm_head if weights.head is None else weights.head
    head = pack(head) if packs(head) else weights.head
    return attrs.evolve(weights, layers=tuple(layers), head=head)


def unpacked(lw: LayerWeights) -> LayerWeights:
    """A layer's weights with any packed linear back in its row-major [out, in] form (a copy)."""

    def row_major(t):
        return t.row_major() if isinstance(t, PackedWeight) else t

    a, m = lw.mixer, lw.mlp
    if isinstance(a, AttentionWeights):
        a = attrs.evolve(a, qkv=row_major(a.qkv), o=row_major(a.o))
    if isinstance(m, MlpWeights):
        m = attrs.evolve(m, gate_up=row_major(m.gate_up), down=row_major(m.down))
    return attrs.evolve(lw, mixer=a, mlp=m)


def dense_layers(
    cfg: ModelConfig, weights: ModelWeights, dtype: torch.dtype, device: torch.device
) -> tuple[DenseLayer | None, ...]:
    """Per layer: its `DenseLayer`, or None where the layer runs op by op."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or cpu_build.library() is None:
        return (None,) * cfg.num_layers
    out = []
    for i, lw in enumerate(weights.layers):
        a, m = lw.mixer, lw.mlp
        if not _fused(cfg, weights, i):
            out.append(None)
            continue
        out.append(
            DenseLayer(
                in_norm=lw.input_norm,
                post_norm=lw.post_norm,
                qkv=a.qkv,
                qkv_bias=a.qkv_bias,
                o=a.o,
                o_bias=a.o_bias,
                gate_up=m.gate_up,
                gate_up_bias=m.gate_up_bias,
                down=m.down,
                down_bias=m.down_bias,
                q_norm=a.q_norm,
                k_norm=a.k_norm,
                heads=(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
                rot=cfg.rotary_dim,
                eps=cfg.rms_norm_eps,
            )
        )
    return tuple(out)
