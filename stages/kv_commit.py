"""kv_commit: each lane's committed KV length moves forward by exactly its committed rows.

In a verify round that is the anchor plus the accepted drafts (= committed_len: the bonus token is the next
anchor and has no keys yet); keys of rejected rows stay in the cache and are overwritten by later rows.
In prefill (`advance = "rows"`) every row of the chunk is committed.
"""
from __future__ import annotations

import attrs
import torch

from stages.contract.ports import Port
from stages.contract.registry import Stage, register


def advance_lengths(advance: str, committed_len, batch) -> torch.Tensor:
    """Rows each lane commits: from accept, or every row of the batch."""
    if advance == "committed":
        return committed_len
    return torch.tensor(batch.lane_rows, dtype=torch.int64, device=batch.cu_rows.device)


def _advance(instance, attribute, value):
    if value not in ("committed", "rows"):
        raise ValueError(f"advance must be 'committed' or 'rows', got '{value}'")


@register
@attrs.frozen
class KVCommit(Stage):
    kind = "kv_commit"
    inputs = (
        Port("target", "object"),
        Port("target_state", "object"),
        Port("batch", "object"),
        Port("committed_len", "int64", ("lanes",), "device", optional=True),
    )
    outputs = ()
    mutates = ("target_state",)
    advance: str = attrs.field(default="committed", validator=_advance)

    def run(self, target, target_state, batch, committed_len=None):
        target.commit_kv(target_state, batch, advance_lengths(self.advance, committed_len, batch))
        return {}
