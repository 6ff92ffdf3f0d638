"""Weight-only quantization of a loaded target: which tensors become int8, done once at load.

Owns: `quantize_weights(weights, mode)`. "int8" turns every dense linear weight (attention q|k|v and output,
Gated DeltaNet in/out projections, dense MLPs) and the output head into `Int8Weight` (per-output-row scales).
Kept in the compute dtype: the embedding (a lookup, not a stream), norms, biases, the conv and gate vectors, and
MoE experts (their kernels read stacked expert tensors). The drafters keep reading the unquantized `lm_head`.
Not here: the quantization arithmetic (kernels/quant.py) or the matmuls that read it.
"""

from __future__ import annotations

import attrs

from speclane.kernels.quant import quantize_int8
from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.weights import AttentionWeights, GdnWeights, MlpWeights, ModelWeights

MODES = ("none", "int8")


def quantize_weights(weights: ModelWeights, mode: str) -> ModelWeights:
    if mode not in MODES:
        raise ConfigError(f"weights: unknown quantization '{mode}'; use one of {', '.join(MODES)}")
    if mode == "none":
        return weights
    layers = []
    for lw in weights.layers:
        m = lw.mixer
        if isinstance(m, AttentionWeights):
            m = attrs.evolve(m, qkv=quantize_int8(m.qkv), o=quantize_int8(m.o))
        elif isinstance(m, GdnWeights):
            m = attrs.evolve(m, in_proj=quantize_int8(m.in_proj), out=quantize_int8(m.out))
        mlp = lw.mlp
        if isinstance(mlp, MlpWeights):
            mlp = attrs.evolve(mlp, gate_up=quantize_int8(mlp.gate_up), down=quantize_int8(mlp.down))
        layers.append(attrs.evolve(lw, mixer=m, mlp=mlp))
    return attrs.evolve(weights, layers=tuple(layers), head=quantize_int8(weights.lm_head))
