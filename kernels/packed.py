"""Linear weights packed for VDPBF16PS: the layout that lets a pass of 8 rows cost about what a pass of 1 costs.

Owns: `PackedWeight` (a bf16 or int8 [out, in] weight stored as column blocks of 32, the reduction in pairs; int8 with
its float32 scale per output row, applied after the row's sum as kernels/quant.py defines), `pack` (and `pack_bf16`,
`pack_int8`), `packs()` (whether this process's C kernels serve the layout), `packed_linear` and its torch twin
`packed_linear_ref`. The C kernel (`sl_linear_packed` in kernels/cpu/rows.c) broadcasts each row's pair of inputs across
16 columns, so no row needs a horizontal sum and a weight block is read once for 8 rows; every (row, column) still sums
its pairs in one fixed order, so rows stay bit-identical whatever the row count. The same kernel serves a prefill chunk
of any width. Not here: which weights are packed (stages/models/dense.py) or the row-major route (decode_linear.py),
which every other weight, dtype and build takes.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from speclane.kernels import cpu_build
from speclane.kernels._triton import check
from speclane.kernels.decode_linear import decode_linear_ref
from speclane.kernels.quant import Int8Weight

Tensor = torch.Tensor
COLS = 32  # columns a block: two 16-lane float32 accumulators a row
_CODES = {torch.float32: 0, torch.bfloat16: 1}


@attrs.frozen
class PackedWeight:
    data: Tensor  # [ceil(out / 32), in / 2, 32, 2] bfloat16 or int8, 64-byte aligned; columns past `out` zero
    out: int
    inner: int
    scale: Tensor | None = None  # [out] float32 for int8 data (kernels/quant.py), else None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out, self.inner))

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def unpack(self) -> Tensor:
        """The [out, in] data it was packed from (a copy, bf16 or int8)."""
        blocks = self.data.shape[0]
        return self.data.permute(0, 2, 1, 3).reshape(blocks * COLS, self.inner)[: self.out].contiguous()

    def row_major(self) -> Tensor | Int8Weight:
        """The weight it was packed from: a tensor, or the `Int8Weight` of int8 data."""
        return self.unpack() if self.scale is None else Int8Weight(q=self.unpack(), scale=self.scale)


def packs(weight: Tensor | Int8Weight) -> bool:
    """True when this process packs `weight`: a bf16 tensor or an `Int8Weight`, [out, in] on the CPU with `in`
    even, and C kernels built with AVX512-BF16 (the AVX2 build has no VDPBF16PS and keeps the row-major layout).
    The rows it multiplies must be bf16 (the caller's compute dtype)."""
    t = weight.q if isinstance(weight, Int8Weight) else weight
    return (
        (t.dtype == torch.bfloat16 or isinstance(weight, Int8Weight))
        and t.dim() == 2
        and t.device.type == "cpu"
        and t.shape[1] % 2 == 0
        and cpu_build.bf16_kernels()
    )


def _aligned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """A tensor whose data starts on a 64-byte line (the kernel's aligned block loads)."""
    count = 1
    for d in shape:
        count *= d
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.empty(count + 64 // size, dtype=dtype)
    skip = (-raw.data_ptr() % 64) // size
    return raw[skip : skip + count].view(shape)


def pack(weight: Tensor | Int8Weight) -> PackedWeight:
    """`weight` packed for `packed_linear` (see `packs`)."""
    return pack_int8(weight) if isinstance(weight, Int8Weight) else pack_bf16(weight)


def _packed_data(w: Tensor, fn: str) -> Tensor:
    n, k = w.shape
    blocks = -(-n // COLS)
    data = _aligned_empty((blocks, k // 2, COLS, 2), w.dtype)
    w = w.contiguous()
    lib = cpu_build.library()
    if lib is not None and w.device.type == "cpu":
        check(getattr(lib, fn)(w.data_ptr(), n, k, data.data_ptr()) == 0, f"{fn}: the kernel refused")
    else:
        data.copy_(F.pad(w, (0, 0, 0, blocks * COLS - n)).view(blocks, COLS, k // 2, 2).permute(0, 2, 1, 3))
    return data


def pack_bf16(weight: Tensor) -> PackedWeight:
    """`weight` [out, in] bf16 (in even) packed for `packed_linear`."""
    check(
        weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.shape[1] % 2 == 0,
        f"pack_bf16: needs a bf16 [out, in] weight with `in` even, got {weight.dtype} {tuple(weight.shape)}",
    )
    return PackedWeight(data=_packed_data(weight, "sl_pack_bf16"), out=weight.shape[0], inner=weight.shape[1])


def pack_int8(weight: Int8Weight) -> PackedWeight:
    """An `Int8Weight` [out, in] (in even) packed for `packed_linear`, its scales kept."""
    q = weight.q
    check(q.dim() == 2 and q.shape[1] % 2 == 0, f"pack_int8: needs `in` even, got {tuple(q.shape)}")
    return PackedWeight(
        data=_packed_data(q, "sl_pack_i8"), out=q.shape[0], inner=q.shape[1], scale=weight.scale.float().contiguous()
    )


def packed_linear_ref(
    x: Tensor, weight: PackedWeight, bias: Tensor | None = None, out_dtype: torch.dtype | None = None
) -> Tensor:
    """The torch twin: the row-major decode route's twin on the unpacked weight (rows exact by padding)."""
    w = weight.row_major()
    y = decode_linear_ref(x, w.dequantize(x.dtype) if isinstance(w, Int8Weight) else w.to(x.dtype), bias)
    return y if out_dtype is None else y.to(out_dtype)


def packed_linear(
    x: Tensor,
    weight: PackedWeight,
    bias: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    threads: int | None = None,
) -> Tensor:
    """y = x @ weight.T (+ bias) in `out_dtype` (x's by default), each row bit-identical to the same row alone;
    any row count. Where the C kernel cannot serve (no library, another build in use, not bf16 rows) the torch
    twin does."""
    lib = cpu_build.library()
    lead, k = x.shape[:-1], x.shape[-1]
    check(k == weight.inner, f"packed_linear: x has {k} features, weight expects {weight.inner}")
    out = out_dtype or x.dtype
    if (
        lib is None
        or x.dtype != torch.bfloat16
        or out not in _CODES
        or x.device.type != "cpu"
        or (bias is not None and (bias.dtype not in _CODES or not bias.is_contiguous()))
    ):
        return packed_linear_ref(x, weight, bias, out_dtype)
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], weight.out, dtype=out)
    if x2.shape[0]:
        q8 = weight.scale is not None
        rc = lib.sl_linear_packed(
            x2.data_ptr(),
            1,
            weight.data.data_ptr(),
            4 if q8 else 3,
            weight.scale.data_ptr() if q8 else None,
            None if bias is None else bias.data_ptr(),
            _CODES.get(getattr(bias, "dtype", None), 0),
            y.data_ptr(),
            _CODES[out],
            x2.shape[0],
            k,
            weight.out,
            threads or torch.get_num_threads(),
        )
        if rc != 0:  # the build in use has no VDPBF16PS (a benchmark swapped it in)
            return packed_linear_ref(x, weight, bias, out_dtype)
    return y.reshape(*lead, weight.out)
