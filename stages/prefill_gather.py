"""prefill_gather: the next chunk of every waiting lane's prompt, as the rows of a prefill pass.

Rows are handed out lane by lane up to `chunk_rows` per pass, so a long prompt is prefilled over several
passes with bounded activation memory. A chunk also ends at the lane's next `checkpoint_at` position, where the
runtime keeps a prompt checkpoint (a Gated DeltaNet layer's state exists only where a pass ends). A lane whose
chunk ends its prompt is `final`: the pass samples its first token, which becomes its anchor.

`lanes_per_pass` defaults to 1: a lane's prompt then goes through the same shapes whoever else is waiting, so
its first token does not depend on the load. Batched with another prompt, a prompt's rows can land in a pass past
the decode route's 64 rows, whose one large gemm rounds differently in bf16: its last-row logits move and a near-tie
first token can flip. The lanes a pass may take arrive as the engine's `Roster` (`lanes`), held lanes left out.
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.contract.lanes import Lane, Roster
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.models.state import RowBatch


def _positive(instance, attribute, value):
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@register
@attrs.frozen
class PrefillGather(Stage):
    kind = "prefill_gather"
    inputs = (Port("lanes", "record", device="host", doc="the pass's lanes", record=Roster),)
    outputs = (
        Port("lane_view", "record", ("lanes",), "host", record=Lane),
        Port("batch", "record", device="any", doc="the prompt chunks' rows", record=RowBatch),
        Port("drafts", "int64", ("lanes", "k"), "device"),
        Port("draft_len", "int", ("lanes",), "host"),
        Port("final", "bool", ("lanes",), "host", doc="tuple: whether the chunk ends the lane's prompt"),
    )
    knobs = {"prefill_rows": "chunk_rows"}  # the engine's step budget of prompt rows (serve --prefill-rows)
    chunk_rows: int = attrs.field(default=512, validator=_positive)
    lanes_per_pass: int = attrs.field(default=1, validator=_positive)
    device: str = "cpu"

    def run(self, lanes):
        view, tokens, positions, cu, final, lane_rows, lane_start = [], [], [], [0], [], [], []
        budget = self.chunk_rows
        for lane in lanes.waiting_prefill()[: self.lanes_per_pass]:
            if budget == 0:
                break
            n = min(budget, len(lane.prompt_ids) - lane.kv_len)
            cut = next((m for m in lane.checkpoint_at if m > lane.kv_len), None)
            if cut is not None:
                n = min(n, cut - lane.kv_len)
            budget -= n
            view.append(lane)
            tokens.extend(lane.prompt_ids[lane.kv_len : lane.kv_len + n])
            positions.extend(range(lane.kv_len, lane.kv_len + n))
            cu.append(cu[-1] + n)
            final.append(lane.kv_len + n == len(lane.prompt_ids))
            lane_rows.append(n)
            lane_start.append(lane.kv_len)
        dev = self.device
        batch = RowBatch(
            tokens=torch.tensor(tokens, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            cu_rows=torch.tensor(cu, dtype=torch.int64, device=dev),
            slots=torch.tensor([l.slot for l in view], dtype=torch.int64, device=dev),
            lane_rows=tuple(lane_rows),
            lane_start=tuple(lane_start),
        )
        return {
            "lane_view": view,
            "batch": batch,
            "drafts": torch.full((len(view), 0), -1, dtype=torch.int64, device=dev),
            "draft_len": (0,) * len(view),
            "final": tuple(final),
        }
