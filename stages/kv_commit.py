"""kv_commit: the round's commit point on the host: the one device->host copy, each lane's KV length and counters.

A lane's committed KV length has one home, `Lane.kv_len` on the host: the round's layout (anchor_gather's
positions, the draft stage's `lane_start`, prefill_gather's chunks) is computed from it before the target pass,
so the pass never reads a length from the device and stays capturable per row bucket. This stage is the one
place that advances it: in a verify round by the committed run (`advance = "committed"`: the anchor plus the
accepted drafts; the bonus token is the next anchor and has no keys yet), in prefill by every row of the chunk
(`advance = "rows"`), and in a step's one pass a prompt lane's by its chunk (`prompt_rows`). Keys of rejected rows
stay in the cache past the length and are overwritten later.

The host lengths come from the round's single transfer, made here: the committed runs and their lengths in one
copy (`runs`, `run_len`), which stream_emit then reads without touching the device.

Acceptance is counted here too (`Lane.count_round`: drafts offered and accepted per position, verify rounds only):
it is a fact of what the round committed, and this is where the commit becomes the lane's. Counting at the commit
counts a round exactly when it took effect: a round that fails before it (and is rerun lane by lane) is not
counted twice, and one that commits is counted even when stream_emit then cuts the run at a stop.
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.contract.lanes import Lane
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.models.state import RowBatch


def advance_lengths(advance: str, committed_len, batch, prompt_rows=None) -> torch.Tensor:
    """Rows each lane commits, on the device (the device-side commits beside this stage use it): from accept, or
    every row of the batch; in a step's one pass (`prompt_rows`), every row of a prompt lane's chunk."""
    if advance == "committed":
        if prompt_rows is not None and any(prompt_rows):
            prompt = torch.tensor(prompt_rows, dtype=torch.int64).to(committed_len.device)
            return torch.where(prompt > 0, prompt, committed_len)
        return committed_len
    return torch.tensor(batch.lane_rows, dtype=torch.int64, device=batch.cu_rows.device)


def _advance(instance, attribute, value):
    if value not in ("committed", "rows"):
        raise ValueError(f"advance must be 'committed' or 'rows', got '{value}'")


def to_host(committed: torch.Tensor, committed_len: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The round's one device->host copy: runs [lanes, k1] int64 on the CPU and their lengths as Python ints."""
    host = torch.cat([committed, committed_len[:, None]], dim=1).cpu()
    return host[:, :-1], tuple(host[:, -1].tolist())


@register
@attrs.frozen
class KVCommit(Stage):
    kind = "kv_commit"
    inputs = (
        Port("lane_view", "record", ("lanes",), "host", record=Lane),
        Port("batch", "record", record=RowBatch),
        Port("committed", "int64", ("lanes", "k1"), "device"),
        Port("committed_len", "int64", ("lanes",), "device"),
        Port("draft_len", "int", ("lanes",), "host", doc="tuple: drafts each lane proposed (counted as offered)"),
        Port("prompt_rows", "int", ("lanes",), "host", optional=True, doc="a step's one pass: a prompt chunk's rows"),
    )
    outputs = (
        Port("runs", "int64", ("lanes", "k1"), "host", doc="the committed runs, copied to the host (-1 padded)"),
        Port("run_len", "int", ("lanes",), "host", doc="tuple: tokens of each lane's run (0: nothing committed)"),
    )
    mutates = ("lane_view",)
    advance: str = attrs.field(default="committed", validator=_advance)

    def run(self, lane_view, batch, committed, committed_len, draft_len, prompt_rows=None):
        runs, run_len = to_host(committed, committed_len)
        if self.advance == "committed":
            for lane, n, drafted, prompt in zip(lane_view, run_len, draft_len, prompt_rows or (0,) * len(lane_view)):
                if prompt:  # a prompt chunk in a step's one pass: read, not a round
                    lane.kv_len += prompt
                    continue
                lane.kv_len += n
                lane.count_round(drafted, n - 1)
        else:  # prefill is not a round: nothing drafted, nothing counted
            for lane, n in zip(lane_view, batch.lane_rows):
                lane.kv_len += n
        return {"runs": runs, "run_len": run_len}
