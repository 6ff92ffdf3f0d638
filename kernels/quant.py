"""Weight-only quantization of the linear layers: int8 with one float32 scale per output row.

Owns: `Int8Weight` (the stored form), `quantize_int8` (symmetric, per output row: scale = max|w| / 127,
q = round(w / scale)) and `dequantize`. The decode route's C kernel reads the int8 weight directly and applies the
row's scale after the row's float32 sum (kernels/cpu/rows.c), so a token streams half the bytes of bf16 and rows
stay bit-identical whatever the row count. Not here: which tensors are quantized (stages/models/quantize.py) or
the matmuls (decode_linear.py, wide_linear.py).
"""

from __future__ import annotations

import attrs
import torch

Tensor = torch.Tensor


@attrs.frozen
class Int8Weight:
    q: Tensor  # [out, in] int8, contiguous
    scale: Tensor  # [out] float32

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    def dequantize(self, dtype: torch.dtype) -> Tensor:
        """[out, in] in `dtype`: q * scale computed in float32 (the torch twins' weight)."""
        return (self.q.float() * self.scale[:, None]).to(dtype)


QUANT_ROWS = 1024  # rows quantized at a time: the float32 temporaries stay a few MB whatever the weight


def quantize_int8(w: Tensor) -> Int8Weight:
    """Symmetric per-output-row int8 of a [out, in] weight; an all-zero row gets scale 1 (its q is 0). Done
    `QUANT_ROWS` rows at a time (each row's arithmetic is its own, so the result is the same as all at once), so a
    load holds no float32 copy of a whole weight beside it: the output head's would be four bytes a parameter."""
    out = w.shape[0]
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(out, dtype=torch.float32, device=w.device)
    for start in range(0, out, QUANT_ROWS):
        wf = w[start : start + QUANT_ROWS].to(torch.float32, copy=True)  # divided in place below: never w itself
        amax = wf.abs().amax(dim=1)
        part = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        q[start : start + QUANT_ROWS] = torch.round(wf.div_(part[:, None])).clamp_(-127, 127).to(torch.int8)
        scale[start : start + QUANT_ROWS] = part
    return Int8Weight(q=q, scale=scale)
