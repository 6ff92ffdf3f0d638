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


def quantize_int8(w: Tensor) -> Int8Weight:
    """Symmetric per-output-row int8 of a [out, in] weight; an all-zero row gets scale 1 (its q is 0)."""
    wf = w.float()
    amax = wf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(wf / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    return Int8Weight(q=q, scale=scale.contiguous())
