"""prefill_gather: the next chunk of every waiting lane's prompt, as the rows of a prefill pass.

Rows are handed out lane by lane up to `chunk_rows` per pass, so a long prompt is prefilled over several
passes with bounded activation memory. A chunk also ends at the lane's next `checkpoint_at` position, where the
runtime keeps a prompt checkpoint (a Gated DeltaNet layer's state exists only where a pass ends). A lane whose
chunk ends its prompt is `final`: the pass samples its first token, which becomes its anchor.

`lanes_per_pass` caps the prompts one pass reads (the `prefill_lanes` knob, `serve --prefill-lanes`). The shipped
spec reads every waiting prompt up to the chunk, as vLLM and llama.cpp batch prompts: agents that send their next
turns at once then get their first tokens after one wide pass, not one prompt after another while the first ones
decode and the step budget holds the rest to a few rows a step. The price: batched with another prompt, a prompt's
rows can land in a pass past the decode route's 64 rows, whose one large gemm rounds differently in bf16, so a
near-tie first token can depend on which prompts shared its pass (as it can on the step budget's chunking). At 1 a
prompt alone in a pass goes through the same shapes whoever else is waiting. A prompt whose chunk reads what a prompt
already in the pass reads, up to a checkpoint that one keeps, waits a pass and starts from that checkpoint. The
lanes a pass may take arrive as the engine's `Roster` (`lanes`), held lanes left out.
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


def _follows(lane: Lane, taken: list[tuple[Lane, int]]) -> bool:
    """Whether a lane already in this pass ends its chunk at a checkpoint it keeps past what `lane` has read, and
    reads the same tokens up to there: `lane` then waits a pass and starts from that checkpoint (the keeper's restore
    before each prefill step), so prompts that share a head (agents' system prompt, the n choices of one prompt)
    prefill it once, not once each side by side. The checkpoint need not be one of `lane`'s own marks: the first of
    n choices keeps its prompt one token short of the end, the others mark nothing there."""
    return any(
        lane.kv_len < other.kv_len + n
        and other.kv_len + n in other.checkpoint_at
        and other.prompt_ids[: other.kv_len + n] == lane.prompt_ids[: other.kv_len + n]
        for other, n in taken
    )


def prompt_chunks(lanes: Roster, chunk_rows: int, lanes_per_pass: int) -> list[tuple[Lane, int]]:
    """The lanes a pass reads prompt rows of, oldest first, and how many rows each: up to `chunk_rows` in all and
    `lanes_per_pass` lanes, a chunk ending at the lane's next checkpoint, a lane that `_follows` another left out."""
    out: list[tuple[Lane, int]] = []
    budget = chunk_rows
    for lane in lanes.waiting_prefill():
        if budget == 0 or len(out) == lanes_per_pass:
            break
        n = min(budget, len(lane.prompt_ids) - lane.kv_len)
        cut = next((m for m in lane.checkpoint_at if m > lane.kv_len), None)
        if cut is not None:
            n = min(n, cut - lane.kv_len)
        if _follows(lane, out):
            continue
        budget -= n
        out.append((lane, n))
    return out


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
    # the engine's step budget of prompt rows (serve --prefill-rows) and the most prompts a pass (--prefill-lanes)
    knobs = {"prefill_rows": "chunk_rows", "prefill_lanes": "lanes_per_pass"}
    chunk_rows: int = attrs.field(default=512, validator=_positive)
    lanes_per_pass: int = attrs.field(default=1, validator=_positive)
    device: str = "cpu"

    def run(self, lanes):
        chunks = prompt_chunks(lanes, self.chunk_rows, self.lanes_per_pass)
        view, tokens, positions, cu, final = [], [], [], [0], []
        for lane, n in chunks:
            view.append(lane)
            tokens.extend(lane.prompt_ids[lane.kv_len : lane.kv_len + n])
            positions.extend(range(lane.kv_len, lane.kv_len + n))
            cu.append(cu[-1] + n)
            final.append(lane.kv_len + n == len(lane.prompt_ids))
        dev = self.device
        batch = RowBatch(
            tokens=torch.tensor(tokens, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            cu_rows=torch.tensor(cu, dtype=torch.int64, device=dev),
            slots=torch.tensor([l.slot for l in view], dtype=torch.int64, device=dev),
            lane_rows=tuple(n for _, n in chunks),
            lane_start=tuple(lane.kv_len for lane in view),
        )
        return {
            "lane_view": view,
            "batch": batch,
            "drafts": torch.full((len(view), 0), -1, dtype=torch.int64, device=dev),
            "draft_len": (0,) * len(view),
            "final": tuple(final),
        }
