"""anchor_gather: the round's lanes, their anchors, slots and positions, and how many drafts each may take.

The row budget lives here: with R rows and N lanes each lane drafts min(K, R // N - 1), never below 0, and
never more than the lane's own cap (a request may set its draft tokens, or turn speculation off). R = 0
means no cap (`--spec-draft-rows 0` is resolved to the draft stage's default before the spec is built).
"""
from __future__ import annotations

import attrs
import torch

from stages.contract.lanes import MAX_DRAFT_TOKENS, Lane, LaneTable
from stages.contract.ports import Port
from stages.contract.registry import Stage, register


def drafts_per_lane(draft_tokens: int, row_budget: int, lanes: int) -> int:
    """The row budget: each lane drafts min(K, R // lanes - 1), never below 0; R = 0 means no cap."""
    if lanes <= 0:
        return 0
    if row_budget <= 0:
        return draft_tokens
    return max(0, min(draft_tokens, row_budget // lanes - 1))


def _check_range(instance, attribute, value):
    if attribute.name == "draft_tokens" and not 0 <= value <= MAX_DRAFT_TOKENS:
        raise ValueError(f"draft_tokens must be 0 to {MAX_DRAFT_TOKENS}, got {value}")
    if attribute.name == "row_budget" and value < 0:
        raise ValueError(f"row_budget must be >= 0 (0 means no cap), got {value}")


@register
@attrs.frozen
class AnchorGather(Stage):
    kind = "anchor_gather"
    inputs = (Port("lanes", "record", device="host", doc="the lane table", record=LaneTable),)
    outputs = (
        Port("lane_view", "record", ("lanes",), "host", doc="the running lanes, in row order", record=Lane),
        Port("anchors", "int64", ("lanes",), "device"),
        Port("positions", "int64", ("lanes",), "device", doc="each lane's committed KV length"),
        Port("slots", "int64", ("lanes",), "device"),
        Port("draft_limit", "int", ("lanes",), "host", doc="tuple: drafts each lane may take"),
    )
    knobs = {"draft_tokens": "draft_tokens", "draft_rows": "row_budget"}
    draft_tokens: int = attrs.field(default=0, validator=_check_range)
    row_budget: int = attrs.field(default=0, validator=_check_range)
    device: str = "cpu"

    def run(self, lanes):
        view = lanes.running()
        per_lane = drafts_per_lane(self.draft_tokens, self.row_budget, len(view))
        limit = tuple(min(per_lane, lane.draft_tokens) for lane in view)
        host = torch.tensor([[l.anchor, l.kv_len, l.slot] for l in view], dtype=torch.int64).reshape(-1, 3)
        host = host.to(self.device)
        return {"lane_view": view, "anchors": host[:, 0], "positions": host[:, 1], "slots": host[:, 2],
                "draft_limit": limit}
