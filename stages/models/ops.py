"""Row-wise building blocks shared by the target's layers: the linear dispatch, RMSNorm, RoPE, the dense MLP.

Owns: arithmetic that treats every row on its own (so a row's result never depends on its neighbours) and the
choice between the decode route and a plain GEMM for long prefill chunks. Not here: anything that mixes rows
(attention.py, gated_deltanet.py) or reads the artifact (weights.py).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import use_triton
from speclane.kernels.decode_linear import cpu_kernel_serves, decode_linear, decode_linear_cpu
from speclane.kernels.packed import PackedWeight, packed_linear
from speclane.kernels.quant import Int8Weight
from speclane.kernels.rowwise import silu_mul
from speclane.kernels.wide_linear import wide_linear
from speclane.stages.models.weights import MlpWeights

Tensor = torch.Tensor

# Up to this many rows every linear runs through `decode_linear` (each row bit-identical to a one-row decode
# whatever its neighbours: the C kernel by construction, its torch twin by padded 8-row buckets). A longer pass is
# a prefill chunk: one plain GEMM (wide_linear) reads each weight once, and exactness against decode is not
# required there.
DECODE_ROUTE_MAX_ROWS = 64


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """x [rows, in] @ weight[out, in].T (+ bias) -> [rows, out] in x's dtype, or in `out_dtype` (see
    decode_linear: float32 output keeps the decode route's sums unrounded)."""
    if isinstance(weight, PackedWeight):  # one kernel for every row count (kernels/packed.py)
        return packed_linear(x, weight, bias, out_dtype)
    if x.shape[0] <= DECODE_ROUTE_MAX_ROWS:
        return decode_linear(x, weight, bias, out_dtype)
    y = wide_linear(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)


def draft_linear(x: Tensor, weight: Tensor | Int8Weight, logits: bool = False) -> Tensor:
    """x @ weight.T for rows no one compares bit for bit (a drafter's proposals): the C kernel on a CPU that has
    it (bf16 weights streamed once with float32 sums; torch's bf16 GEMV on AVX2 runs at half float32's speed), a
    GEMM for many rows, torch's own linear under autograd (fitting). `logits`: a vocabulary head's output, float32
    (the C kernel's sums unrounded, which its argmax reads)."""
    if isinstance(weight, PackedWeight):  # packed for drafting (stages/models/draft_layer.py), any row count
        return packed_linear(x, weight, out_dtype=torch.float32 if logits else None)
    if torch.is_grad_enabled():
        return torch.nn.functional.linear(x, weight)
    if x.shape[0] <= DECODE_ROUTE_MAX_ROWS and cpu_kernel_serves(x):
        return decode_linear_cpu(x.contiguous(), weight, out_dtype=torch.float32 if logits else None)
    y = wide_linear(x, weight)  # many rows (a drafter's window catching up): one GEMM, widened where that pays
    return y.float() if logits else y


# torch's float32 `silu`, `sigmoid` and `softplus` take a vectorised path for whole SIMD blocks and a scalar path
# for the tail, and the two round differently (measured on this CPU, torch 2.13.0: e.g. F.silu on 1 element vs the
# same element inside 4000 differ in the last bit). Which path a row's element takes depends on how many rows share
# the tensor, so these are written with `exp`, `log1p` and IEEE arithmetic, which agree on both paths.


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x) in float32, returned in x's dtype; row-stable (see above)."""
    xf = x.float()
    return (xf / (1.0 + torch.exp(-xf))).to(x.dtype)


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + exp(-x)) in float32, returned in x's dtype; row-stable."""
    return (1.0 / (1.0 + torch.exp(-x.float()))).to(x.dtype)


def softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)) with torch's threshold of 20, float32; row-stable."""
    xf = x.float()
    return torch.where(xf > 20.0, xf, torch.log1p(torch.exp(xf.clamp(max=20.0))))


def rms_norm(x: Tensor, scale: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim in float32; `scale` is fp32 and already (1 + w) for zero-centred norms."""
    xf = x.float().contiguous()  # a strided view would reduce in another order than the same row alone
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * scale).to(x.dtype)


def rope_tables(positions: Tensor, rotary_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin [rows, rotary_dim] float32 for the rotate-half RoPE convention."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=positions.device).float() / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [rows, heads, head_dim]: rotate the leading rotary_dim dims of each head (partial rotary), in fp32."""
    rot = cos.shape[-1]
    xr = x[..., :rot].float()
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    turned = xr * cos[:, None] + torch.cat([-x2, x1], dim=-1) * sin[:, None]
    return torch.cat([turned.to(x.dtype), x[..., rot:]], dim=-1)


def mlp(x: Tensor, w: MlpWeights) -> Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one matrix."""
    gate_up = linear(x, w.gate_up, w.gate_up_bias)
    if cpu_kernel_serves(x) or use_triton(x):  # one C call, or one triton launch (silu_mul dispatches)
        return linear(silu_mul(gate_up), w.down, w.down_bias)
    gate, up = gate_up.chunk(2, dim=-1)
    return linear(silu(gate) * up, w.down, w.down_bias)
