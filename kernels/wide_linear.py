"""The wide linear of a prefill chunk: one plain GEMM, in the dtype this CPU multiplies fastest.

Owns: `wide_linear(x, weight, bias)` and the one-time measurement that picks its compute dtype. On a CPU with
bfloat16 hardware (AMX, AVX-512 BF16) a bf16 GEMM is the fast one; on an AVX2-only CPU torch's bf16 GEMM runs at
a fraction of float32's (a 256 x 576 x 1536 product on an AMD EPYC, one thread, torch 2.13.0: 53.8 ms in bf16,
6.9 ms widened to float32 including the widening; `python -m speclane.bench.linear_rows --wide` repeats it), so there
the weight is widened per call, which costs far less than the product.
The choice is measured, not guessed from flags: a probe of both on one prefill-sized product per (dtype,
threads), at the first wide call of a process. Not here: the decode route (decode_linear.py), whose rows must not
depend on the row count; a wide chunk needs no such guarantee.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from speclane.kernels.decode_linear import dequantize_cpu
from speclane.kernels.quant import Int8Weight

Tensor = torch.Tensor

# Machine facts, not state: (dtype, threads) -> True when widening to float32 is faster than the native GEMM.
_WIDEN: dict[tuple[torch.dtype, int], bool] = {}


def _best_of(fn, reps: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def widens(dtype: torch.dtype) -> bool:
    """True when a wide `dtype` GEMM on this CPU is faster done in float32 (measured once per process)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return False
    key = (dtype, torch.get_num_threads())
    known = _WIDEN.get(key)
    if known is None:
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(256, 576, generator=g).to(dtype), torch.randn(1536, 576, generator=g).to(dtype)
        native = _best_of(lambda: F.linear(x, w))
        widened = _best_of(lambda: F.linear(x.float(), w.float()).to(dtype))
        known = _WIDEN[key] = widened < 0.8 * native
    return known


def wide_linear(x: Tensor, weight: Tensor | Int8Weight, bias: Tensor | None = None) -> Tensor:
    """x [rows, in] @ weight[out, in].T (+ bias) -> [rows, out] in x's dtype, for many rows. An `Int8Weight` is
    dequantized for the product (once per chunk: far less than the product itself)."""
    if isinstance(weight, Int8Weight):
        wide = x.device.type == "cpu" and widens(x.dtype)
        weight = dequantize_cpu(weight, torch.float32 if wide else x.dtype)
        if wide:
            return F.linear(x.float(), weight, None if bias is None else bias.float()).to(x.dtype)
        return F.linear(x, weight, bias)
    if x.device.type == "cpu" and widens(x.dtype):
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    return F.linear(x, weight, bias)
