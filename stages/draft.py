"""draft: the backend proposes up to `draft_limit` tokens after each anchor; the round's rows are laid out.

The backend is picked by name through `speclane.stages.drafters` (none, ngram, dflash2, mtp); swapping it is one line
of the spec. The stage builds it at plan time (`builds`: the engine hands it to every round as the `drafter` input,
and applies the target layers it declares it reads, its `taps`, before the first round) and reads it back each round
from that port. The rows of the round are each lane's anchor then its drafts, lane after lane, with offsets
`cu_rows`; the layout is computed on the host from the draft lengths, so nothing here waits on the device.
The drafter's time per round and per caught-up row go into the engine's `round_costs` (`touches`), for the measured
draft plan; catching up brings the drafting lanes' state up to date (`touches` drafter_state).
"""

from __future__ import annotations

import time

import attrs
import torch

from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.lanes import Lane
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.drafters import backend_class, build_backend
from speclane.stages.models.state import RowBatch


def _known_backend(instance, attribute, value):
    backend_class(value)  # raises SpecError naming the known backends


def _options_by_backend(instance, attribute, value):
    for name, table in value.items():
        backend_class(name)
        if not isinstance(table, dict):
            raise ValueError(f"options.{name} must be a table of that backend's options, got {table!r}")


def _known_head(instance, attribute, value):
    if value not in ("full", "shortlist"):
        raise ValueError(f"head must be 'full' or 'shortlist', got '{value}'")


def row_batch(
    anchors: torch.Tensor,
    drafts: torch.Tensor,
    draft_len: tuple[int, ...],
    lane_start: tuple[int, ...],
    slots: torch.Tensor,
    prompts: tuple[list[int], ...] | None = None,
) -> RowBatch:
    """Flatten anchor + drafts of every lane into rows; a lane with `prompts` tokens (a prompt chunk, read in a
    step's one pass) has those as its rows instead."""
    width = drafts.shape[1] + 1
    prompts = prompts or ((),) * len(draft_len)
    lane_rows = tuple(len(toks) or n + 1 for n, toks in zip(draft_len, prompts))
    flat, pos, cu, extra = [], [], [0], []
    for lane, (n, start, toks) in enumerate(zip(lane_rows, lane_start, prompts)):
        if toks:  # past the grid of anchors and drafts
            flat.extend(range(len(lane_rows) * width + len(extra), len(lane_rows) * width + len(extra) + n))
            extra.extend(toks)
        else:
            flat.extend(range(lane * width, lane * width + n))
        pos.extend(range(start, start + n))
        cu.append(cu[-1] + n)
    grid = torch.cat([anchors[:, None], drafts], dim=1).reshape(-1)
    device = anchors.device
    if extra:
        grid = torch.cat([grid, torch.tensor(extra, dtype=torch.int64).to(device, non_blocking=True)])
    tokens = grid.index_select(0, torch.tensor(flat, dtype=torch.int64).to(device, non_blocking=True))
    return RowBatch(
        tokens=tokens,
        positions=torch.tensor(pos, dtype=torch.int64).to(device),
        cu_rows=torch.tensor(cu, dtype=torch.int64).to(device),
        slots=slots,
        lane_rows=lane_rows,
        lane_start=lane_start,
    )


@attrs.define
class DraftCounts:
    """What the draft stage keeps across rounds: its drafting proposals so far. The first one pays the drafter's
    one-time set-up, so it is not a sample of the drafter's time (docs/decisions/0004-draft-cost-record.md)."""

    proposals: int = 0


@register
@attrs.frozen
class Draft(Stage):
    kind = "draft"
    inputs = (
        Port("lane_view", "record", ("lanes",), "host", record=Lane),
        Port("anchors", "int64", ("lanes",), "device"),
        Port("slots", "int64", ("lanes",), "device"),
        Port("draft_limit", "int", ("lanes",), "host"),
        Port("drafter", "object", doc="the draft backend this stage built"),
        Port("drafter_state", "object", optional=True, doc="the backend's per-slot state"),
        Port(
            "round_costs", "record", device="host", optional=True, doc="the drafter's times go here", record=RoundCosts
        ),
        Port(
            "prompt_rows", "int", ("lanes",), "host", optional=True, doc="tuple: a prompt chunk's rows (0: it decodes)"
        ),
    )
    outputs = (
        Port("drafts", "int64", ("lanes", "k"), "device", doc="-1 past each lane's draft_len"),
        Port("draft_len", "int", ("lanes",), "host", doc="tuple: drafts each lane proposed"),
        Port(
            "draft_probs",
            "float32",
            ("lanes", "k", "vocab"),
            "device",
            optional=True,
            doc="q the drafts were sampled from; None for a deterministic drafter",
        ),
        Port("batch", "record", doc="the round's rows", record=RowBatch),
    )
    builds = (Port("drafter", "object", doc="the backend named by `backend`, built from the loaded target"),)
    touches = ("drafter_state", "round_costs")
    state = DraftCounts
    knobs = {"backend": "backend", "draft_head": "head"}
    backend: str = attrs.field(default="none", validator=_known_backend)
    # Options per backend, keyed by backend name, so swapping `backend` is one line of the spec.
    options: dict = attrs.field(factory=dict, hash=False, validator=_options_by_backend)
    head: str = attrs.field(default="full", validator=_known_head)

    @classmethod
    def knob_defaults(cls, params):
        """`--spec-draft-rows 0` means the row budget the backend suits (8 for mtp, no cap for the others)."""
        return {"draft_rows": backend_class(params.get("backend", "none")).default_rows}

    def prepare(self, resources):
        return {"drafter": build_backend(self.backend, self.options.get(self.backend, {}), self.head, resources)}

    def run(
        self,
        lane_view,
        anchors,
        slots,
        draft_limit,
        drafter,
        drafter_state=None,
        round_costs=None,
        prompt_rows=None,
        state=None,
    ):
        # A step's one pass (anchor_gather's `prompt_rows`): the lanes reading their prompt come after the decoding
        # ones; the drafter sees only the decoding lanes, and each prompt lane's rows are its chunk.
        m = len(lane_view)
        if prompt_rows is not None and any(prompt_rows):
            m = next(i for i, p in enumerate(prompt_rows) if p)
        if m:
            drafts, draft_len, q = self._propose(
                lane_view[:m], anchors[:m], draft_limit[:m], drafter, drafter_state, round_costs, state
            )
        else:  # prompt lanes alone (a failed step rerun lane by lane)
            drafts, draft_len, q = anchors.new_full((0, 0), -1), (), None
        prompts = None
        if m < len(lane_view):
            n = len(lane_view) - m
            prompts = ((),) * m + tuple(
                lane.prompt_ids[lane.kv_len : lane.kv_len + p] for lane, p in zip(lane_view[m:], prompt_rows[m:])
            )
            drafts = torch.cat([drafts, drafts.new_full((n, drafts.shape[1]), -1)])
            q = None if q is None else torch.cat([q, q.new_zeros(n, *q.shape[1:])])
            draft_len = draft_len + (0,) * n
        lane_start = tuple(lane.kv_len for lane in lane_view)
        batch = row_batch(anchors, drafts, draft_len, lane_start, slots, prompts)
        return {"drafts": drafts, "draft_len": draft_len, "draft_probs": q, "batch": batch}

    def _propose(self, lane_view, anchors, draft_limit, drafter, drafter_state, round_costs, state):
        # The drafting lanes' backlog (a model drafter's window rows since each last drafted: a lane's whole prompt
        # the first time) is timed apart from the proposal: it is paid once and serves the lane's later rounds, so
        # the plan charges it per row, spread over the rounds the lane has left (stages/draft_plan.py); timed with
        # the proposal, a lane's first proposal would carry its prompt's projection and a plan that then stops
        # drafting would keep that sample.
        if any(draft_limit):
            drafting = [lane for lane, n in zip(lane_view, draft_limit) if n]
            rows = sum(drafter.backlog(drafter_state, drafting))
            t0 = time.perf_counter()
            drafter.catch_up(drafter_state, drafting)
            if round_costs is not None:
                round_costs.record_catch_up(rows, time.perf_counter() - t0)
        t0 = time.perf_counter()
        proposal = drafter.propose(lane_view, anchors, draft_limit, drafter_state)
        # The drafter's time per round feeds the measured draft plan; not its first proposal, which pays one-time
        # set-up: as the plan's only sample it could keep a one-lane engine from drafting for a whole batch
        # (docs/decisions/0004-draft-cost-record.md).
        warm = state is None or state.proposals > 0
        if any(draft_limit) and state is not None:
            state.proposals += 1
        if round_costs is not None and warm:
            round_costs.record_draft(
                max(draft_limit, default=0), time.perf_counter() - t0, lanes=sum(1 for n in draft_limit if n > 0)
            )
        return proposal.drafts, proposal.draft_len, proposal.q
