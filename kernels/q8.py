"""int8 rows times int8 weights, for a drafter's proposal head: the rows quantized on the fly, integer dot products.

Owns: `Q8Weight` (an `Int8Weight` [out, in] packed for VPDPBUSD: column blocks of 32, the reduction in quads, plus
each column's integer sum), `pack_q8`, `q8_serves()` (whether this process's C kernels run it), `q8_linear` (the C
call, `sl_linear_q8` in kernels/cpu/rows.c) and `q8_linear_ref`, its torch twin, equal to it bit for bit. Each row
of x is quantized per row (s = max|x| / 127, q = round-half-even(x / s)), so a (row, column) is an exact integer
sum times one float32 product: a row's logits never depend on the rows beside it. The row's quantization changes
its logits by about a part in a hundred: this serves proposals, which the target verifies, never the target's
own rows. Where a proposal head reads this instead of bf16 rows times int8 weights, each weight quad costs one
instruction instead of the conversions to bf16 (kernels/packed.py). Not here: which heads use it
(`stages/models/shortlist.py`, `stages/drafters/model_backend.py`).
"""

from __future__ import annotations

import attrs
import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import check
from speclane.kernels.packed import COLS, _aligned_empty
from speclane.kernels.quant import Int8Weight

Tensor = torch.Tensor


@attrs.frozen
class Q8Weight:
    data: Tensor  # [ceil(out / 32), in / 4, 32, 4] int8, 64-byte aligned; columns past `out` zero
    rowsum: Tensor  # [out] int32: each column's sum of its int8 weights
    scale: Tensor  # [out] float32
    out: int
    inner: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out, self.inner))

    def unpack(self) -> Tensor:
        """The [out, in] int8 weight it was packed from (a copy)."""
        blocks = self.data.shape[0]
        return self.data.permute(0, 2, 1, 3).reshape(blocks * COLS, self.inner)[: self.out].contiguous()


def q8_serves(weight: Int8Weight) -> bool:
    """True when this process runs `q8_linear` in C for `weight`: int8 [out, in] on the CPU with `in` a multiple
    of 4, and the AVX512-BF16 build (whose CPUs all have AVX512-VNNI)."""
    q = weight.q
    return q.dim() == 2 and q.device.type == "cpu" and q.shape[1] % 4 == 0 and cpu_build.bf16_kernels()


def pack_q8(weight: Int8Weight) -> Q8Weight:
    """`weight` [out, in] (in % 4 == 0) packed for `q8_linear`, its scales and column sums kept."""
    q = weight.q.contiguous()
    n, k = q.shape
    check(q.dtype == torch.int8 and k % 4 == 0, f"pack_q8: needs int8 [out, in] with in % 4 == 0, got {tuple(q.shape)}")
    blocks = -(-n // COLS)
    data = _aligned_empty((blocks, k // 4, COLS, 4), torch.int8)
    rowsum = torch.empty(n, dtype=torch.int32)
    lib = cpu_build.library()
    if lib is not None:
        check(lib.sl_pack_q8(q.data_ptr(), n, k, data.data_ptr(), rowsum.data_ptr()) == 0, "sl_pack_q8 refused")
    else:
        padded = torch.nn.functional.pad(q, (0, 0, 0, blocks * COLS - n))
        data.copy_(padded.view(blocks, COLS, k // 4, 4).permute(0, 2, 1, 3))
        rowsum.copy_(q.sum(dim=1, dtype=torch.int32))
    return Q8Weight(data=data, rowsum=rowsum, scale=weight.scale.float().contiguous(), out=n, inner=k)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [rows, in] -> (q [rows, in] int64 in [-127, 127], s [rows] float32) as the C kernel quantizes: per row
    s = max|x| / 127, q = round-half-even(x * (127 / max|x|)) in float32; an all-zero row gets q = 0, s = 0."""
    xf = x.float()
    amax = xf.abs().amax(dim=1)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return torch.round(xf * inv[:, None]).to(torch.int64), amax / 127.0


def q8_linear_ref(x: Tensor, weight: Q8Weight) -> Tensor:
    """The torch twin: the same quantization, the exact integer sums, the same float32 products."""
    q, s = quantize_rows(x.reshape(-1, weight.inner))
    acc = q @ weight.unpack().to(torch.int64).T  # exact: |sum| < 2^31 for in < 2^17
    y = acc.to(torch.float32) * (s[:, None] * weight.scale[None])
    return y.reshape(*x.shape[:-1], weight.out)


def q8_linear(x: Tensor, weight: Q8Weight, threads: int | None = None) -> Tensor:
    """float32 logits [..., out] of bf16 rows x [..., in] (see the module doc); the twin where the C kernel cannot
    serve (no library, another build, rows not bf16)."""
    lib = cpu_build.library()
    k = x.shape[-1]
    check(k == weight.inner, f"q8_linear: x has {k} features, weight expects {weight.inner}")
    if lib is None or x.dtype != torch.bfloat16 or x.device.type != "cpu":
        return q8_linear_ref(x, weight)
    x2 = x.reshape(-1, k).contiguous()
    y = torch.empty(x2.shape[0], weight.out, dtype=torch.float32)
    if x2.shape[0]:
        rc = lib.sl_linear_q8(
            x2.data_ptr(),
            weight.data.data_ptr(),
            weight.scale.data_ptr(),
            weight.rowsum.data_ptr(),
            y.data_ptr(),
            x2.shape[0],
            k,
            weight.out,
            threads or torch.get_num_threads(),
        )
        if rc != 0:  # a build without VPDPBUSD (a benchmark swapped it in)
            return q8_linear_ref(x, weight)
    return y.reshape(*x.shape[:-1], weight.out)
