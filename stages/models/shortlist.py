"""The shortlist proposal head: the output head's rows for the most frequent tokens, in 4 bits.

Owns: quantizing those rows (groups of 32 values share one bf16 scale, or a whole row where the hidden size is not
a multiple of 32; values -8..7 packed two per byte), the
argmax over them, and their memory. It is the opt-in `--spec-draft-head shortlist` of dflash2: smaller than the full
head, but a token outside the list can never be drafted. Not here: which tokens are frequent (counted while fitting,
stored as `shortlist.ranks` in dflash2.safetensors).
"""
from __future__ import annotations

import attrs
import torch

from kernels.sampling import row_argmax
from stages.models.ops import draft_linear

Tensor = torch.Tensor
GROUP = 32


@attrs.frozen
class Shortlist:
    ids: Tensor        # [n] int64 vocabulary ids
    packed: Tensor     # [n, hidden // 2] uint8: two 4-bit values a byte, low nibble first
    scales: Tensor     # [n, groups] bfloat16
    # The rows dequantized once per compute dtype: unpacking them on every proposal took 31-43 ms a draft on the
    # AMD EPYC Zen 5 (engine stage timing), several times the target's whole pass.
    dense: dict = attrs.field(factory=dict, eq=False, repr=False)

    @classmethod
    def build(cls, head: Tensor, ranks: Tensor | None, count: int) -> Shortlist:
        """`count` rows of `head` [vocab, hidden], most frequent first (`ranks`; None: the first ids)."""
        vocab, hidden = head.shape
        if hidden % 2:
            raise ValueError(f"the shortlist head packs two values a byte: the hidden size must be even, got {hidden}")
        group = GROUP if hidden % GROUP == 0 else hidden
        count = max(1, min(count, vocab))
        ids = (ranks.long() if ranks is not None else torch.arange(vocab))[:count].to(head.device)
        rows = head.index_select(0, ids).float().view(count, hidden // group, group)
        scale = (rows.abs().amax(-1, keepdim=True) / 7.0).clamp(min=1e-8).to(torch.bfloat16)
        q = (rows / scale.float()).round().clamp(-8, 7).to(torch.int16).view(count, hidden) + 8
        packed = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
        return cls(ids=ids, packed=packed, scales=scale[..., 0])

    def weight(self, dtype: torch.dtype) -> Tensor:
        lo = (self.packed & 0xF).to(torch.int16) - 8
        hi = (self.packed >> 4).to(torch.int16) - 8
        q = torch.stack([lo, hi], dim=-1).view(self.packed.shape[0], self.scales.shape[1], -1).float()
        return (q * self.scales.float()[..., None]).view(self.packed.shape[0], -1).to(dtype)

    def argmax(self, x: Tensor) -> Tensor:
        """x [..., hidden] -> the vocabulary id of the best shortlisted token [...]."""
        w = self.dense.get(x.dtype)
        if w is None:
            w = self.dense[x.dtype] = self.weight(x.dtype)
        flat = x.reshape(-1, x.shape[-1])
        return self.ids[row_argmax(draft_linear(flat, w, logits=True))].reshape(x.shape[:-1])

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.ids, self.packed, self.scales, *self.dense.values()))
