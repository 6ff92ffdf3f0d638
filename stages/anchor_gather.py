"""anchor_gather: the round's lanes, their anchors, slots and positions, and how many drafts each may take.

The row budget lives here: with R rows and N lanes each lane drafts min(K, R // N - 1), never below 0, and never
more than the lane's own cap (a request may set its draft tokens, or turn speculation off). A backend whose own
option allows more drafts than K (`DraftBackend.draft_cap`, e.g. suffix's `max_drafts`) raises K to it for the lanes
whose own cap is the stage's; the row budget still holds. R = 0 means no cap (`--spec-draft-rows 0` is resolved to
the draft stage's default before the spec is built). With `plan = "measured"` (specs/verify.toml's default) those
caps are an upper bound and each lane takes the drafts that maximise the round's expected tokens per second on this
machine (stages/draft_plan.py), from the measured pass cost (probed at the first round that may draft, cached per
machine and model) and each lane's own acceptance, or the drafter's own chance for each of this round's drafts where
it gives them; `plan = "fixed"` takes every draft the caps allow (benchmark sweeps, reproducible tests). What the
measured plan reads arrives on ports: the drafter (whether it drafts, its prior, its lanes' backlog) and its state,
the engine's `round_costs` (it probes the pass cost into them and counts planning rounds: `touches`) and the target
(the probe runs it); each lane's acceptance is what the stage keeps across rounds (its `state`).

`prompt_rows` > 0 makes the round a step's one pass: after the decoding lanes come the lanes still reading their
prompt, each with its next chunk (prefill_gather's rule, up to `prompt_rows` rows in all and `prompt_lanes` lanes),
no drafts, so a prompt's rows share the pass that streams every weight for the decoders' rows instead of a pass of
their own. `prompt_rows` says each lane's chunk (0: a decoding lane) and `final` whether the lane commits a token
this pass (a decoding lane always; a prompt lane when its chunk ends the prompt). At 0 (the default) the round has
only decoding lanes. `prompt_fair` > 0 (serve's measured budget) reads `prompt_rows` as a floor: the pass takes as
many more as add at most that many one-row passes to the decoding rows' own pass in the pass-cost table. Up to
DECODE_ROUTE_MAX_ROWS rows a pass computes every row as a one-row decode does, whatever
its neighbours: prompt rows that would take the decoding lanes' rows past it stay out (the engine then reads them
in a prefill pass), so a decoding lane's tokens never depend on the prompts beside it. On a target with Gated
DeltaNet layers a pass with prompt rows never passes it (a verify pass records every row's recurrent state, so a
wide chunk there would hold a state per row where a prefill pass keeps each lane's last), and a chunk joins only
up to the rows a prefill pass reads through the same per-row step (`_joins`): the state a prompt leaves is then
bit for bit the one its own pass leaves.
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.errors import ContractError
from speclane.stages.contract.lanes import MAX_DRAFT_TOKENS, Lane, Roster
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.draft_plan import PRIOR, AcceptanceTracker, catch_up_charges, lane_values, plan_drafts
from speclane.stages.models.config import FULL
from speclane.stages.models.gated_deltanet import STEP_ROUTE_MAX_ROWS
from speclane.stages.models.ops import DECODE_ROUTE_MAX_ROWS
from speclane.stages.models.pass_cost import ROWS_PER_LANE, pass_costs, probe_rows
from speclane.stages.prefill_gather import prompt_chunks

PLANS = ("measured", "fixed")


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
    if attribute.name == "prompt_rows" and value < 0:
        raise ValueError(f"prompt_rows must be >= 0 (0: no prompt rows in the round), got {value}")
    if attribute.name == "prompt_lanes" and value < 1:
        raise ValueError(f"prompt_lanes must be >= 1, got {value}")
    if attribute.name == "plan" and value not in PLANS:
        raise ValueError(f"plan must be one of {', '.join(PLANS)}, got '{value}'")


def _fair_rows(rows: int, fair: float, costs: RoundCosts) -> int:
    """The most prompt rows whose addition to a pass of `rows` decoding rows costs at most `fair` one-row passes in
    the pass-cost table, within the decode route's rows (0 where none fits)."""
    base, allowance = costs.target_s(rows), fair * costs.target_s(1)
    fits = [p for p in range(1, DECODE_ROUTE_MAX_ROWS - rows + 1) if costs.target_s(rows + p) - base <= allowance]
    return max(fits, default=0)


def _joins(rows: int, chunks: list[int], target) -> bool:
    """Whether prompt chunks of `chunks` rows may join a round of at most `rows` decoding rows: not where they would
    take it past the decode route's rows (a decoding lane's tokens would depend on them); on a target with Gated
    DeltaNet layers not past those rows at all (a verify pass records every row's recurrent state), nor a chunk past
    the per-row step's (a prefill pass reads a longer one through the chunked form: the state would differ in
    rounding from that of the same chunk read alone)."""
    total = rows + sum(chunks)
    if target is not None and any(t != FULL for t in target.cfg.layer_types):
        return total <= DECODE_ROUTE_MAX_ROWS and max(chunks, default=0) <= STEP_ROUTE_MAX_ROWS
    return rows > DECODE_ROUTE_MAX_ROWS or total <= DECODE_ROUTE_MAX_ROWS


@register
@attrs.frozen
class AnchorGather(Stage):
    kind = "anchor_gather"
    inputs = (
        Port("lanes", "record", device="host", doc="the pass's lanes and queue", record=Roster),
        Port("drafter", "object", optional=True, doc="the draft backend (measured plan: its prior, its backlog)"),
        Port("drafter_state", "object", optional=True, doc="the backend's per-slot state (its backlog)"),
        Port("round_costs", "record", device="host", optional=True, doc="measured plan", record=RoundCosts),
        Port("target", "object", optional=True, doc="the target model: the pass-cost probe runs it"),
    )
    outputs = (
        Port("lane_view", "record", ("lanes",), "host", doc="the running lanes, in row order", record=Lane),
        Port("anchors", "int64", ("lanes",), "device"),
        Port("positions", "int64", ("lanes",), "device", doc="each lane's committed KV length"),
        Port("slots", "int64", ("lanes",), "device"),
        Port("draft_limit", "int", ("lanes",), "host", doc="tuple: drafts each lane may take"),
        Port("prompt_rows", "int", ("lanes",), "host", doc="tuple: rows of its prompt a lane reads (0: it decodes)"),
        Port("final", "bool", ("lanes",), "host", doc="tuple: whether the lane commits a token this pass"),
    )
    touches = ("drafter_state", "round_costs")  # a backend may keep what it found for the plan (suffix: the draft)
    state = AcceptanceTracker  # each lane's acceptance and the engine's, for the measured plan
    knobs = {
        "draft_tokens": "draft_tokens",
        "draft_rows": "row_budget",
        "draft_plan": "plan",
        "prompt_rows": "prompt_rows",
        "prompt_lanes": "prompt_lanes",
        "prompt_fair": "prompt_fair",
    }
    draft_tokens: int = attrs.field(default=0, validator=_check_range)
    row_budget: int = attrs.field(default=0, validator=_check_range)
    plan: str = attrs.field(default="fixed", validator=_check_range)
    prompt_rows: int = attrs.field(default=0, validator=_check_range)
    prompt_lanes: int = attrs.field(default=64, validator=_check_range)
    prompt_fair: float = 0.0
    device: str = "cpu"

    def run(self, lanes, drafter=None, drafter_state=None, round_costs=None, target=None, state=None):
        view = lanes.running()
        most = self._most(drafter, round_costs)
        per_lane = drafts_per_lane(self.draft_tokens, self.row_budget, len(view))
        wide = drafts_per_lane(most, self.row_budget, len(view))
        limit = tuple(
            min(
                wide if lane.draft_tokens >= self.draft_tokens > 0 else min(per_lane, lane.draft_tokens),
                lane.draft_room,
            )
            for lane in view
        )
        if self.plan == "measured" and drafter is not None and drafter.proposes and any(limit):
            if round_costs is None or state is None:
                raise ContractError("anchor_gather: plan 'measured' needs the round_costs input and its kept state")
            limit = self._measured(lanes, view, limit, most, drafter, drafter_state, round_costs, target, state)
        rows = self.prompt_rows
        if rows and self.prompt_fair > 0 and round_costs is not None and round_costs.rows:
            rows = max(rows, _fair_rows(len(view) + sum(limit), self.prompt_fair, round_costs))
        chunks = prompt_chunks(lanes, rows, self.prompt_lanes) if rows else []
        if not _joins(len(view) + sum(limit), [n for _, n in chunks], target):
            chunks = []  # the prompts get a prefill pass of their own (the engine's)
        prompt_rows = (0,) * len(view) + tuple(n for _, n in chunks)
        final = (True,) * len(view) + tuple(lane.kv_len + n == len(lane.prompt_ids) for lane, n in chunks)
        view = view + [lane for lane, _ in chunks]
        host = torch.tensor([[l.anchor, l.kv_len, l.slot] for l in view], dtype=torch.int64).reshape(-1, 3)
        host = host.to(self.device)
        return {
            "lane_view": view,
            "anchors": host[:, 0],
            "positions": host[:, 1],
            "slots": host[:, 2],
            "draft_limit": limit + (0,) * len(chunks),
            "prompt_rows": prompt_rows,
            "final": final,
        }

    def _most(self, drafter, costs=None) -> int:
        """Drafts a lane whose own cap is the stage's may take before the row budget: `draft_tokens`, or the
        backend's own larger cap (`DraftBackend.draft_cap`, which may follow the measured pass cost) where
        speculation is on."""
        own = drafter.draft_cap(costs) if drafter is not None and self.draft_tokens > 0 else 0
        return max(self.draft_tokens, own)

    def _measured(
        self, lanes: Roster, view, caps: tuple[int, ...], most: int, drafter, drafter_state, costs, target, tracker
    ) -> tuple[int, ...]:
        """The caps cut to what pays on this machine (probing the pass cost the first time it is needed)."""
        widest = lanes.max_lanes * max(most + 1, min(self.draft_tokens + 1, ROWS_PER_LANE))  # the widest round
        widest = min(widest, self.row_budget) if self.row_budget else widest
        if not costs.covers(probe_rows(widest)[-1]):  # past the probe's widest pass the table is extrapolated
            pass_costs(target, costs, widest)
        if tracker.tested == 0 and tracker.hits == 0:  # before any evidence: the drafter's own guess
            prior = drafter.prior_acceptance()
            tracker.prior = PRIOR if prior is None else prior
        tracker.update(view)
        costs.next_round()
        remaining = tuple(lane.draft_room + 1 for lane in view)
        values, waiting = lane_values(
            remaining, tuple(lane.draft_room + 1 for lane in lanes.waiting_prefill()), lanes.queued, most + 1
        )
        rates = tuple(tracker.rate(lane) for lane in view)
        own = drafter.chances(drafter_state, view, caps) or (None,) * len(view)  # the drafter's own, where it has them
        # after the chances: a chain chooses there which of its parts drafts each lane, and its backlog is that part's
        backlog = tuple(map(costs.catch_up_s, drafter.backlog(drafter_state, view)))
        chances = tuple(c if c is not None else tracker.chances(lane, cap) for c, lane, cap in zip(own, view, caps))
        charges = catch_up_charges(backlog, remaining, caps, rates, chances)
        rooms = tuple(lane.draft_room for lane in view)
        keys = tuple(lane.kv_len for lane in view)
        return plan_drafts(caps, rates, costs, values, waiting, charges, chances, rooms, keys)
