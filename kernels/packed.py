"""Linear weights packed for VDPBF16PS: the layout that lets a pass of 8 rows cost about what a pass of 1 costs.

Owns: `PackedWeight` (a bf16 [out, in] weight stored as column blocks of 32, the reduction in pairs), `pack_bf16`,
`packs()` (whether this process's C kernels serve the layout), `packed_linear` and its torch twin
`packed_linear_ref`. The C kernel (`sl_linear_packed` in kernels/cpu/rows.c) broadcasts each row's pair of inputs
across 16 columns, so no row needs a horizontal sum and a weight block is read once for 8 rows; every
(row, column) still sums its pairs in one fixed order, so rows stay bit-identical whatever the row count. The same
kernel serves a prefill chunk of any width. Not here: which weights are packed (stages/models/dense.py) or the
row-major route (decode_linear.py), which every other weight, dtype and build takes.
"""
from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from speclane.kernels import cpu_build
from speclane.kernels._triton import check
from speclane.kernels.decode_linear import decode_linear_ref

Tensor = torch.Tensor
COLS = 32  # columns a block: two 16-lane float32 accumulators a row
_CODES = {torch.float32: 0, torch.bfloat16: 1}


@attrs.frozen
class PackedWeight:
    data: Tensor   # [ceil(out / 32), in / 2, 32, 2] bfloat16, 64-byte aligned; columns past `out` are zero
    out: int
    inner: int

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
        """The [out, in] weight it was packed from (a copy): what the torch twins multiply by."""
        blocks = self.data.shape[0]
        return self.data.permute(0, 2, 1, 3).reshape(blocks * COLS, self.inner)[: self.out].contiguous()


def packs(weight: Tensor) -> bool:
    """True when this process packs `weight`: a bf16 [out, in] CPU tensor with `in` even, and C kernels built
    with AVX512-BF16 (the AVX2 build has no VDPBF16PS and keeps the row-major layout)."""
    return (weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.device.type == "cpu"
            and weight.shape[1] % 2 == 0 and cpu_build.isa() == "avx512bf16")


def _aligned_empty(shape: tuple[int, ...]) -> Tensor:
    """A bf16 tensor whose data starts on a 64-byte line (the kernel's aligned block loads)."""
    count = 1
    for d in shape:
        count *= d
    raw = torch.empty(count + 32, dtype=torch.bfloat16)
    skip = (-raw.data_ptr() % 64) // 2
    return raw[skip : skip + count].view(shape)


def pack_bf16(weight: Tensor) -> PackedWeight:
    """`weight` [out, in] bf16 (in even) packed for `packed_linear`."""
    check(weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.shape[1] % 2 == 0,
          f"pack_bf16: needs a bf16 [out, in] weight with `in` even, got {weight.dtype} {tuple(weight.shape)}")
    n, k = weight.shape
    blocks = -(-n // COLS)
    data = _aligned_empty((blocks, k // 2, COLS, 2))
    w = weight.contiguous()
    lib = cpu_build.library()
    if lib is not None and w.device.type == "cpu":
        check(lib.sl_pack_bf16(w.data_ptr(), n, k, data.data_ptr()) == 0, "pack_bf16: the kernel refused")
    else:
        data.copy_(F.pad(w, (0, 0, 0, blocks * COLS - n)).view(blocks, COLS, k // 2, 2).permute(0, 2, 1, 3))
    return PackedWeight(data=data, out=n, inner=k)


def packed_linear_ref(x: Tensor, weight: PackedWeight, bias: Tensor | None = None,
                      out_dtype: torch.dtype | None = None) -> Tensor:
    """The torch twin: the row-major decode route's twin on the unpacked weight (rows exact by padding)."""
    y = decode_linear_ref(x, weight.unpack().to(x.dtype), bias)
    return y if out_dtype is None else y.to(out_dtype)


def packed_linear(x: Tensor, weight: PackedWeight, bias: Tensor | None = None,
                  out_dtype: torch.dtype | None = None, threads: int | None = None) -> Tensor:
    """y = x @ weight.T (+ bias) in `out_dtype` (x's by default), each row bit-identical to the same row alone;
    any row count. Where the C kernel cannot serve (no library, another build in use, not bf16 rows) the torch
    twin does."""
    lib = cpu_build.library()
    lead, k = x.shape[:-1], x.shape[-1]
    check(k == weight.inner, f"packed_linear: x has {k} features, weight expects {weight.inner}")
    out = out_dtype or x.dtype
    if lib is None or x.dtype != torch.bfloat16 or out not in _CODES or x.device.type != "cpu" \
            or (bias is not None and (bias.dtype not in _CODES or not bias.is_contiguous())):
        return packed_linear_ref(x, weight, bias, out_dtype)
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], weight.out, dtype=out)
    if x2.shape[0]:
        rc = lib.sl_linear_packed(x2.data_ptr(), 1, weight.data.data_ptr(),
                                  None if bias is None else bias.data_ptr(), _CODES.get(getattr(bias, "dtype", None), 0),
                                  y.data_ptr(), _CODES[out], x2.shape[0], k, weight.out,
                                  threads or torch.get_num_threads())
        if rc != 0:  # the build in use has no VDPBF16PS (a benchmark swapped it in)
            return packed_linear_ref(x, weight, bias, out_dtype)
    return y.reshape(*lead, weight.out)
