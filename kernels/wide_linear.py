"""The wide linear of a prefill chunk: one plain GEMM, in the dtype this CPU multiplies fastest.

Owns: `wide_linear(x, weight, bias)` and the measurement that picks its compute dtype. On a CPU with bfloat16
hardware (AMX, AVX-512 BF16) a bf16 GEMM is the fast one; on an AVX2-only CPU torch's bf16 GEMM runs at a fraction
of float32's (`python -m speclane.bench.linear_rows --wide` measures both), so there the weight is widened per
call, which costs far less than the product. The choice is measured, not guessed from flags: a probe of both on
one prefill-sized product per (dtype, threads), once per machine and torch version, cached beside the C kernels'
builds, so back-to-back runs take the same route. Not here: the decode route (decode_linear.py), whose rows must
not depend on the row count; a wide chunk needs no such guarantee; packed weights (kernels/packed.py), which
their own kernel serves at any width.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import torch
import torch.nn.functional as F

from speclane.kernels import cpu_build
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
        known = _WIDEN[key] = _cached_choice(dtype)
    return known


def _cached_choice(dtype: torch.dtype) -> bool:
    """The measured choice, kept on disk per machine, torch version, dtype and thread count: a route picked by a
    timing is picked once, so back-to-back runs take (and report) the same one. An unreadable or unwritable cache
    only means measuring again."""
    name = (
        f"{cpu_build.cpu_name()}|{torch.backends.cpu.get_cpu_capability()}|{torch.__version__}|{dtype}|"
        f"{torch.get_num_threads()}"
    )
    path = cpu_build.cache_dir() / "wide_linear" / f"{hashlib.sha256(name.encode()).hexdigest()[:20]}.json"
    try:
        return bool(json.loads(path.read_text())["widen"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 576, generator=g).to(dtype), torch.randn(1536, 576, generator=g).to(dtype)
    native = _best_of(lambda: F.linear(x, w))
    widened = _best_of(lambda: F.linear(x.float(), w.float()).to(dtype))
    choice = widened < 0.8 * native
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"widen": choice, "native_s": native, "widened_s": widened, "machine": name}))
        tmp.replace(path)
    except OSError:
        pass
    return choice


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
