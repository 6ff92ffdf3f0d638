"""Which target layers run as one C call (kernels/dense_layer.py), and their weights in the form it reads.

Owns: the rule (a full-attention layer without an output gate and with a dense MLP, on a CPU where the C kernels
are built, in float32 or bfloat16) and building `DenseLayer` records from the model's weights once, at load.
Not here: the layer's arithmetic (kernels/), the op-by-op route the other layers take (target.py).
"""
from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels.dense_layer import DenseLayer
from speclane.stages.models.config import FULL, ModelConfig
from speclane.stages.models.weights import AttentionWeights, MlpWeights, ModelWeights


def dense_layers(cfg: ModelConfig, weights: ModelWeights, dtype: torch.dtype,
                 device: torch.device) -> tuple[DenseLayer | None, ...]:
    """Per layer: its `DenseLayer`, or None where the layer runs op by op."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or cpu_build.library() is None:
        return (None,) * cfg.num_layers
    out = []
    for i, lw in enumerate(weights.layers):
        a, m = lw.mixer, lw.mlp
        if (cfg.layer_types[i] != FULL or cfg.moe_layers[i] or cfg.attn_output_gate or cfg.head_dim % 8
                or not isinstance(a, AttentionWeights) or not isinstance(m, MlpWeights)):
            out.append(None)
            continue
        out.append(DenseLayer(in_norm=lw.input_norm, post_norm=lw.post_norm, qkv=a.qkv, qkv_bias=a.qkv_bias, o=a.o,
                              o_bias=a.o_bias, gate_up=m.gate_up, gate_up_bias=m.gate_up_bias, down=m.down,
                              down_bias=m.down_bias, q_norm=a.q_norm, k_norm=a.k_norm,
                              heads=(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim), rot=cfg.rotary_dim,
                              eps=cfg.rms_norm_eps))
    return tuple(out)
