"""The shortlist proposal head: the output head's rows for the target's most frequent answer tokens, in int8.

Owns: picking those rows (`ranks`: tokens by how often the target wrote them in its answers while the drafter was
fitted, stored as `shortlist.ranks` in the drafter's file), quantizing them per row as the int8 weights are
(`speclane.kernels.quant`), the argmax over them, and their memory. A model drafter's proposal then streams a third of
the full head's bytes (16,384 of the default model's 49,152 rows), the largest part of a draft step: frequency-ranked
vocabulary pruning of the draft head, as FR-Spec does for EAGLE. A token outside the list can never be drafted: on the
default model the first 16,384 ranks cover 98.1 % of the target's tokens in its held-out answers (3,606 tokens of the
fitting's held-out data), the first 16,384 ids only 93.8 %, so a file without ranks drafts through the full head (with a
warning). Not here: the counting (`stages/fitting/objectives.py`), the choice of head (the draft stage's `head`,
`--spec-draft-head`).
"""

from __future__ import annotations

import attrs
import torch

from speclane.kernels.packed import PackedWeight, pack, packs
from speclane.kernels.quant import Int8Weight, quantize_int8
from speclane.kernels.sampling import row_argmax
from speclane.stages.models.ops import draft_linear

Tensor = torch.Tensor


@attrs.frozen
class Shortlist:
    ids: Tensor  # [n] int64 vocabulary ids, most frequent first
    rows: Int8Weight | PackedWeight  # [n, hidden] those rows of the head (packed where the build reads it)

    @classmethod
    def build(cls, head: Tensor, ranks: Tensor, count: int) -> Shortlist:
        """`count` rows of `head` [vocab, hidden], most frequent first (`ranks` [vocab]); packed for bf16 drafting
        where this process's C kernels read that layout."""
        count = max(1, min(count, head.shape[0]))
        ids = ranks.long()[:count].to(head.device)
        rows = quantize_int8(head.index_select(0, ids))
        return cls(ids=ids, rows=pack(rows) if head.dtype == torch.bfloat16 and packs(rows) else rows)

    def argmax(self, x: Tensor) -> Tensor:
        """x [..., hidden] -> the vocabulary id of the best shortlisted token [...]."""
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        return self.ids[row_argmax(draft_linear(flat, self.rows, logits=True))].reshape(x.shape[:-1])

    def memory_bytes(self) -> int:
        q = self.rows.data if isinstance(self.rows, PackedWeight) else self.rows.q
        return sum(t.numel() * t.element_size() for t in (self.ids, q, self.rows.scale))
