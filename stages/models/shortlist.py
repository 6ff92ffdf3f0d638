"""The shortlist proposal head: the output head's rows for the target's most frequent answer tokens, in int8.

Owns: picking those rows (`ranks`: tokens by how often the target wrote them in its answers while the drafter was
fitted, stored as `shortlist.ranks` in the drafter's file), quantizing them per row as the int8 weights are
(`speclane.kernels.quant`), the argmax over them, their memory, and the form a proposal head is read in fastest
(`for_proposals`, `proposal_logits`: int8 rows times int8 weights where the build has VPDPBUSD, kernels/q8.py). A
model drafter's proposal then streams a fraction of the full head's bytes (the `shortlist_tokens` most frequent of
the vocabulary), the largest part of a draft step: frequency-ranked vocabulary pruning of the draft head, as FR-Spec
does for EAGLE. A token outside the list can never be drafted; ranked by frequency, the list covers far more of the
target's answers than the same number of the lowest ids would (coverage and the count's effect on acceptance:
docs/decisions/0008-shortlist-proposal-head.md), so a file without ranks drafts through the full head (with a
warning). Not here: the counting (`stages/fitting/objectives.py`), the choice of head (the draft stage's `head`,
`--spec-draft-head`).
"""

from __future__ import annotations

import attrs
import torch

from speclane.kernels.packed import PackedWeight, pack, packs
from speclane.kernels.q8 import Q8Weight, pack_q8, q8_linear, q8_serves
from speclane.kernels.quant import Int8Weight, quantize_int8
from speclane.kernels.sampling import row_argmax
from speclane.stages.models.ops import draft_linear

Tensor = torch.Tensor


@attrs.frozen
class Shortlist:
    ids: Tensor  # [n] int64 vocabulary ids, most frequent first
    rows: Int8Weight | PackedWeight | Q8Weight  # [n, hidden] those rows of the head, in the fastest form here

    @classmethod
    def build(cls, head: Tensor, ranks: Tensor, count: int) -> Shortlist:
        """`count` rows of `head` [vocab, hidden], most frequent first (`ranks` [vocab]); for bf16 drafting in the
        form this process's C kernels read fastest (`for_proposals`)."""
        count = max(1, min(count, head.shape[0]))
        ids = ranks.long()[:count].to(head.device)
        rows = quantize_int8(head.index_select(0, ids))
        return cls(ids=ids, rows=for_proposals(rows) if head.dtype == torch.bfloat16 else rows)

    def argmax(self, x: Tensor) -> Tensor:
        """x [..., hidden] -> the vocabulary id of the best shortlisted token [...]."""
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        return self.ids[row_argmax(proposal_logits(flat, self.rows))].reshape(x.shape[:-1])

    def memory_bytes(self) -> int:
        rows = self.rows
        parts = [self.ids, rows.scale]
        if isinstance(rows, Q8Weight):
            parts += [rows.data, rows.rowsum]
        else:
            parts.append(rows.data if isinstance(rows, PackedWeight) else rows.q)
        return sum(t.numel() * t.element_size() for t in parts)


def for_proposals(rows: Int8Weight) -> Int8Weight | PackedWeight | Q8Weight:
    """An int8 proposal head in the form bf16 rows read fastest here: int8 rows times int8 weights
    (kernels/q8.py) where the build has them, else packed for bf16 rows, else as it is."""
    if q8_serves(rows):
        return pack_q8(rows)
    return pack(rows) if packs(rows) else rows


def proposal_logits(x: Tensor, head: Tensor | Int8Weight | PackedWeight | Q8Weight) -> Tensor:
    """float32 logits [rows, out] of proposal rows x [rows, hidden] (bf16 or float32) through `head`."""
    if isinstance(head, Q8Weight):
        return q8_linear(x, head)
    return draft_linear(x, head, logits=True)
