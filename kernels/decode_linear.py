"""The decode route: a linear layer whose every row is bit-identical to single-token decode.

Owns: `decode_linear(x, weight, bias=None, out_dtype=None)` (dispatcher), the C kernel's wrapper
`decode_linear_cpu` (kernels/cpu/rows.c), `decode_linear_ref` (torch twin), the triton kernel and its launcher
`decode_linear_triton`. Not here: which layers use it or when a pass leaves the decode route (that is the
model's and the row budget's business).

Three implementations, one property. The C kernel (CPU, where kernels/cpu_build.py could build it) and the
triton kernel (CUDA) reduce each row alone in an order fixed by the shapes, so rows are independent by
construction; docs/decode-route.md says how and what it costs. The torch twin, which runs where neither can,
gets the property from torch's CPU kernels by padding:

On an Intel Xeon with AMX (torch 2.13.0; docs/decode-route.md) `F.linear`
in float32 takes a gemv for 1 row and MKL gemm kernels for more, which round differently ({1}, {2..15},
{16..} are three bit-classes); in bfloat16 a 1-row call and a 2-row call sum in different orders too. Padding
every call to a bucket of `BUCKET` = 8 rows, the single-token decode included, puts every row through the same
gemm shape, so a row's output is independent of how many rows share the pass and where it sits. More than 8
rows run as several padded 8-row calls: still exact, at one 8-row call's cost per chunk. Where this machine's
plain float32 `F.linear` is already row-count independent, the route takes plain calls in chunks of up to 32
rows: `_plain_exact_rows` checks it once per weight shape and thread count, on the real weight, by comparing
every row of calls of 2..32 rows with one-row calls. Kernel choice depends on shapes, strides, dtype and
threads, not on values, so one probe speaks for every call of that shape. The probe is not trusted for bfloat16
or float16: there an output rounds a float32 sum to 8 (or 11) bits, so two summation orders show only on a sum
that lies within a float32 ulp of a rounding boundary. A probe of 35 random rows passed on a 136 x 48 weight
whose 1-row and 3-row calls part on such a sum of a real activation; those dtypes always take the padded route.

The triton kernel: one program per tile of `ROWS` = 16 rows and a column block, one float32 matrix product a
BLOCK_K step (tensor cores on a GPU), its weight tile read once for all its rows. A row never sees another row, and
the tile is 16 rows whatever the call's row count (the rows past it are masked zeros), so every call runs the same
compiled kernel and a row's products are summed in the same order wherever it sits: tested row by row against
one-row calls, under the interpreter and on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclane.kernels import cpu_build
from speclane.kernels._triton import HAVE_TRITON, check, interpreting, tl, triton, use_triton
from speclane.kernels.quant import Int8Weight

BUCKET = 8
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    # one cheap test on the hot path (building an f-string message costs more than the test); messages on failure
    if (
        x.dtype in _DTYPES
        and weight.dim() == 2
        and weight.dtype == x.dtype
        and x.shape[-1] == weight.shape[1]
        and weight.is_contiguous()
        and x.device == weight.device
        and (bias is None or (bias.shape == weight.shape[:1] and bias.dtype == x.dtype and bias.is_contiguous()))
    ):
        return
    check(x.dtype in _DTYPES, f"decode_linear: x dtype {x.dtype} unsupported")
    check(weight.dim() == 2, f"decode_linear: weight must be [out, in], got {tuple(weight.shape)}")
    check(weight.dtype == x.dtype, f"decode_linear: weight dtype {weight.dtype} != x dtype {x.dtype}")
    check(
        x.shape[-1] == weight.shape[1], f"decode_linear: x has {x.shape[-1]} features, weight expects {weight.shape[1]}"
    )
    check(weight.is_contiguous(), "decode_linear: weight must be contiguous")
    check(x.device == weight.device, f"decode_linear: x on {x.device}, weight on {weight.device}")
    check(bias.shape == weight.shape[:1], f"decode_linear: bias shape {tuple(bias.shape)} != ({weight.shape[0]},)")
    check(False, "decode_linear: bias must be contiguous, dtype of x")


# Machine facts, not state: (dtype, shape, device type, bias, threads) -> rows plain F.linear keeps exact.
_PLAIN_EXACT: dict[tuple, int] = {}
_PROBE_ROWS = (2, 3, 5, 7, 8, 9, 13, 16, 17, 24, 31, 32)  # call sizes compared with one-row calls
_PLAIN_BUCKETS = (32, 16, 8)


def _plain_exact_rows(weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The largest B in (32, 16, 8) such that plain float32 `F.linear` gives each row of any call of up to B rows
    the bits of that row alone, on this machine; 0 when not even 8 or not float32 (then the route pads). The probe
    reads values on the host once per shape (a CUDA graph's warm-up takes it before capture); the meta device has
    none to read and takes the padded route, exact everywhere."""
    if weight.device.type == "meta" or weight.dtype != torch.float32:  # half-width outputs hide the sums' order
        return 0
    key = (weight.dtype, tuple(weight.shape), weight.device.type, bias is not None, torch.get_num_threads())
    known = _PLAIN_EXACT.get(key)
    if known is None:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(_PLAIN_BUCKETS[0] + 3, weight.shape[1], generator=gen).to(weight.device, weight.dtype)
        alone = torch.cat([F.linear(x[i : i + 1], weight, bias) for i in range(x.shape[0])])
        exact_to = 1
        for m in _PROBE_ROWS:
            if not all(torch.equal(F.linear(x[s : s + m], weight, bias), alone[s : s + m]) for s in (0, 3)):
                break
            exact_to = m
        known = next((b for b in _PLAIN_BUCKETS if exact_to >= b), 0)
        _PLAIN_EXACT[key] = known
    return known


def decode_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` in plain chunks where this machine is row-count exact, else over rows padded to 8-row chunks:
    either way every row rounds exactly as a 1-row decode call does."""
    _check_args(x, weight, bias)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    rows = x2.shape[0]
    plain = _plain_exact_rows(weight, bias)
    if plain and rows <= plain:
        out = F.linear(x2, weight, bias)
    elif plain:
        out = torch.cat([F.linear(x2[i : i + plain], weight, bias) for i in range(0, rows, plain)])
    elif rows == BUCKET:
        out = F.linear(x2, weight, bias)
    elif rows < BUCKET:  # zero rows only fix the gemm shape; their outputs are dropped
        out = F.linear(F.pad(x2, (0, 0, 0, BUCKET - rows)), weight, bias)[:rows]
    else:
        out = torch.cat([decode_linear_ref(x2[i : i + BUCKET], weight, bias) for i in range(0, rows, BUCKET)])
    return out.reshape(*lead, weight.shape[0])


ROWS = 16  # the triton kernel's row tile: fixed, so every call runs one compiled kernel whatever its row count


if HAVE_TRITON:

    @triton.jit
    def _decode_linear_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        M,
        N,
        K,
        HAS_BIAS: tl.constexpr,
        IEEE: tl.constexpr,
        UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask, cmask = rows < M, cols < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < K
            xv = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
            wv = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=kmask[:, None] & cmask[None, :], other=0.0)
            if UPCAST:
                xv, wv = xv.to(tl.float32), wv.to(tl.float32)
            if IEEE:
                acc = tl.dot(xv, wv, acc, input_precision="ieee")
            else:
                acc = tl.dot(xv, wv, acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        tl.store(
            y_ptr + rows[:, None] * N + cols[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=rmask[:, None] & cmask[None, :],
        )


def decode_linear_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block_n: int = 64, block_k: int = 64
) -> torch.Tensor:
    """Launch the row-independent triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1): one program per
    `ROWS` rows and `block_n` columns, reading its weight tile once for all of its rows (the verify pass's rows
    cost one weight read, as on the C route), with one matrix product a `block_k` step in float32."""
    check(HAVE_TRITON, "decode_linear_triton: triton is not installed")
    _check_args(x, weight, bias)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    rows, n = x2.shape[0], weight.shape[0]
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows:
        # triton's interpreter computes tl.dot of bf16 operands wrongly (kernels/moe_triton.py); float32 copies
        # give the same products there, while a GPU keeps its bf16 tensor-core dot
        upcast = interpreting() and x.dtype != torch.float32
        grid = (triton.cdiv(rows, ROWS), triton.cdiv(n, block_n))
        _decode_linear_kernel[grid](
            x2,
            weight,
            bias if bias is not None else weight,
            y,
            rows,
            n,
            k,
            HAS_BIAS=bias is not None,
            IEEE=x.dtype == torch.float32 or upcast,  # float32 operands: no tf32 rounding
            UPCAST=upcast,
            BLOCK_M=ROWS,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
        )
    return y.reshape(*lead, n)


_CODES = {torch.float32: 0, torch.bfloat16: 1}


def decode_linear_cpu(
    x: torch.Tensor,
    weight: torch.Tensor | Int8Weight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """The C kernel (kernels/cpu/rows.c): float32 accumulation in one fixed order per row, each weight read once
    per 8 rows, no padding; an `Int8Weight` read as int8, its row scale applied after the row's sum. Needs
    `cpu_build.library()`; float32 or bfloat16 tensors on the CPU."""
    lib = cpu_build.library()
    quant = isinstance(weight, Int8Weight)
    w = weight.q if quant else weight
    code = _CODES.get(x.dtype)
    if not (
        lib is not None
        and code is not None
        and x.device.type == "cpu"
        and (quant or w.dtype == x.dtype)
        and w.dim() == 2
        and w.shape[1] == x.shape[-1]
        and w.is_contiguous()
        and (bias is None or (bias.dtype == x.dtype and bias.shape == w.shape[:1] and bias.is_contiguous()))
    ):
        # one cheap test on the hot path; the messages are built only on failure
        check(lib is not None, f"decode_linear_cpu: the CPU kernels are unavailable ({cpu_build.unavailable()})")
        check(
            code is not None and x.device.type == "cpu",
            f"decode_linear_cpu: needs float32 or bfloat16 CPU tensors, got {x.dtype}",
        )
        _check_args(x, w if not quant else w.to(x.dtype), bias)
        check(False, "decode_linear_cpu: weights must be contiguous [out, in], bias contiguous of x's dtype")
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    rows, n = x2.shape[0], w.shape[0]
    y = torch.empty(rows, n, dtype=out_dtype or x.dtype)
    if rows:
        lib.sl_linear_q(
            x2.data_ptr(),
            code,
            w.data_ptr(),
            2 if quant else code,
            weight.scale.data_ptr() if quant else None,
            None if bias is None else bias.data_ptr(),
            code,
            y.data_ptr(),
            _CODES[y.dtype],
            rows,
            k,
            n,
            threads or torch.get_num_threads(),
        )
    return y.reshape(*lead, n)


def dequantize_cpu(weight: Int8Weight, dtype: torch.dtype) -> torch.Tensor:
    """`weight.dequantize(dtype)`, bit for bit, through the C kernel where it is built: a wide prefill chunk reads
    it once per chunk, and torch's three elementwise passes over the weights are a large part of a prefill's time."""
    lib = cpu_build.library()
    if lib is None or dtype not in _CODES or weight.device.type != "cpu":
        return weight.dequantize(dtype)
    out = torch.empty(weight.shape, dtype=dtype)
    lib.sl_dequant_i8(
        weight.q.data_ptr(),
        weight.scale.data_ptr(),
        out.data_ptr(),
        _CODES[dtype],
        out.shape[0],
        out.shape[1],
        torch.get_num_threads(),
    )
    return out


def cpu_kernel_serves(x: torch.Tensor) -> bool:
    """True when `decode_linear` takes the C kernel for `x` (a float32/bfloat16 CPU tensor, library built)."""
    return x.dtype in _CODES and x.device.type == "cpu" and cpu_build.library() is not None


def decode_linear(
    x: torch.Tensor,
    weight: torch.Tensor | Int8Weight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y = x @ weight.T + bias, each row bit-identical to the same row decoded alone. `out_dtype=torch.float32`
    keeps the C kernel's float32 sums unrounded (the output head: bf16 logits tie at 2^-8 relative); the torch
    routes round to x's dtype first. An `Int8Weight` is read as int8 by the C kernel (its row scale applied
    after the row's sum); the torch routes multiply by its dequantized weight."""
    if cpu_kernel_serves(x):
        return decode_linear_cpu(x, weight, bias, out_dtype)
    if isinstance(weight, Int8Weight):
        weight = weight.dequantize(x.dtype)
    y = decode_linear_triton(x, weight, bias) if use_triton(x) else decode_linear_ref(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)
