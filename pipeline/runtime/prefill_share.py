"""A step budget of prompt rows for each prompt being read, not for all of them together.

While lanes decode, each engine step runs one prefill pass and then the decoding lanes' verify pass (docs/protocol.md,
"Fairness"). The measured fair budget (`fair_prefill_rows`: the most rows whose pass costs at most FAIR_PASS one-row
passes) bounds what a step that prefills costs the decoders. Held for the whole pass, it makes a burst wait on the
lanes already decoding: eight requests that arrive while one answer streams are read eight rows a step between
them, each step streaming every weight twice (its prefill pass and the verify pass), so the more prompts arrive
together, the later each one's first token, and the passes that read them are the narrowest, dearest a row.

`PrefillShare` gives each prompt being read the fair pass's time instead while the prompts being read outnumber the
decoding lanes: with `waiting` lanes on their prompt, the step's one prefill pass may take up to `waiting` fair
passes, so the rows come from one wide pass (each weight read once for all of them) and a prompt's time to first
token does not grow with the prompts beside it, up to the prefill spec's chunk. The decoders' gap between tokens
grows by a fair pass for each prompt being read at once, never past one chunk's pass. With at least as many lanes
decoding, the budget is the fair one: one long prompt arriving among streaming answers, and agents whose turns
come and go among each other's answers. Widening there too made eight agents over two replicas slower, from turn 3
and over the whole replay (docs/benchmarks.md, "A burst of prompts"; why was not traced).

Where lanes decode and others read their prompt, a step is one pass (`StepPlans`): the verify round with the prompt
chunks' rows after the decoding lanes' (anchor_gather's `prompt_rows`), so every weight is streamed once a step, not
once for the prompts and again for the decoders. What the prompt rows cost the decoders is then only their own
arithmetic, and serve's measured budget reads it so: a step's prompt rows are the fair budget, or as many more as
add at most FAIR_PASS one-row passes to the round's own pass in the probe's table (the two-pass step's bound on
what a step that prefills adds to the decoders' gap). A pass with prompt rows stays within the decode route's rows
where the decoding lanes' rows do, and on a target with Gated DeltaNet layers within them always, each chunk no
longer than a prefill pass reads through the per-row step: prompt rows that do not fit get a prefill pass of their
own after the round (stages/anchor_gather.py, `_joins`).

A pass's time is read from the pass-cost probe's table, extended past its widest pass by the last step's slope (the
prefill route past 64 rows costs less a row, so a budget read this way is on the short side). Budgets are the base
times 1, 2, 3, 4, 6, 8, ... up to the chunk, each planned once, when a step first needs it.
"""

from __future__ import annotations

from collections.abc import Callable

from speclane.pipeline.framework.executor import Plan, plan
from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.knobs import knob_value, place, resolve_knobs
from speclane.pipeline.framework.spec import SpecFile
from speclane.stages.contract.costs import FAIR_PASS, RoundCosts
from speclane.stages.contract.errors import ConfigError

STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # the budgets planned: the fair one times these, then the chunk


def shared_rows(
    costs: RoundCosts, base: int, chunk: int, waiting: int, decoding: int = 1, fair: float = FAIR_PASS
) -> int:
    """The step budget of prompt rows with `waiting` lanes on their prompt and `decoding` lanes decoding: `base`
    unless the first outnumber the second, else the widest of base * STEPS (and `chunk`, the most) whose pass costs
    at most `waiting` times `fair` one-row passes."""
    if waiting <= max(1, decoding) or base >= chunk:
        return base
    allowance = fair * costs.target_s(1) * waiting
    levels = [base * m for m in STEPS if base * m < chunk] + [chunk]
    return max((r for r in levels if costs.target_s(r) <= allowance), default=base)


class PrefillShare:
    """The prefill plan for a step, by the lanes on their prompt: `costs` the pass-cost table; `planned` the plans
    made already, by budget: the fair one (the fewest rows) and the idle step's, the prefill spec's chunk (the most);
    `plan_rows(rows)` plans the prefill pass with another budget, returning it and its rows. The prompts a pass
    reads are at most its `prefill_lanes` knob: more than that waiting share no pass, so they earn it no rows."""

    def __init__(self, costs: RoundCosts, planned: dict[int, Plan], plan_rows: Callable[[int], tuple[Plan, int]]):
        if not costs.rows:
            raise ValueError("PrefillShare: the pass-cost table is empty (run the probe first)")
        self.costs, self.plans, self._plan_rows = costs, dict(planned), plan_rows
        self.base, self.chunk = min(planned), max(planned)
        self.lanes = int(knob_value(planned[self.base].graph.spec, "prefill_lanes") or 1)

    def rows(self, waiting: int, decoding: int = 1) -> int:
        return shared_rows(self.costs, self.base, self.chunk, min(waiting, self.lanes), decoding)

    def plan(self, waiting: int, decoding: int = 1) -> Plan:
        rows = self.rows(waiting, decoding)
        if rows not in self.plans:
            self.plans[rows] = self._plan_rows(rows)[0]
        return self.plans[rows]


def check_budget(rows: int | None, lanes: int | None) -> None:
    for name, value in (("prefill_rows (--prefill-rows)", rows), ("prefill_lanes (--prefill-lanes)", lanes)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")


class StepPlans:
    """A step's one pass by its budget of prompt rows: `spec` (the resolved verify spec) with its `prompt_rows` knob
    set, planned once per budget like `verify` (sharing its drafter and what its stages keep), reading at most `lanes`
    prompts a pass. `StepPlans.serves(spec)`: whether a step may be one pass (its stages take the knob)."""

    def __init__(self, spec: SpecFile, verify: Plan, resources, device: str, lanes: int, check: bool = False):
        self.spec, self.verify, self.resources, self.device = spec, verify, resources, device
        self.lanes, self.check, self.plans = lanes, check, {}

    @staticmethod
    def serves(spec: SpecFile) -> bool:
        return knob_value(spec, "prompt_rows") is not None

    @classmethod
    def of(cls, engine) -> StepPlans | None:
        """The engine's step plans, at most as many prompts a pass as its prefill pass; None where not served."""
        if not cls.serves(engine.spec):
            return None
        most = engine._prefill_lanes or int(knob_value(engine._prefill_spec, "prefill_lanes") or 1)
        device = str(engine.target.device)
        return cls(engine.spec, engine.verify, engine.resources, device, most, engine._check_contracts)

    def plan(self, rows: int, fair: bool = False) -> Plan:
        """The one pass with a budget of `rows` prompt rows; `fair` (serve's measured budget, not a fixed one): at
        least `rows`, and as many more as add at most FAIR_PASS one-row passes to the round's own pass."""
        if (rows, fair) not in self.plans:
            knobs = {"prompt_rows": rows, "prompt_lanes": self.lanes, "prompt_fair": FAIR_PASS if fair else 0.0}
            spec = place(resolve_knobs(self.spec, knobs), self.device)
            self.plans[rows, fair] = plan(build_graph(spec), self.resources, self.check, like=self.verify)
        return self.plans[rows, fair]


def set_serve_budget(engine, rows: int | None, lanes: int | None, one_pass: bool = True) -> None:
    """`speclane serve`'s step budget (a replica's too): `rows` given (--prefill-rows), that many rows a step
    whatever waits; else the fair budget measured on this machine, for each prompt being read (`PrefillShare`).
    `one_pass` (--one-pass-steps): prompt rows in the decoding lanes' pass where the target serves it."""
    from speclane.stages.models.pass_cost import PREFILL_ROWS, PROBE_ROWS, fair_prefill_rows, pass_costs

    if rows:
        engine.set_prefill_rows(rows, lanes, one_pass=one_pass)
        return
    costs = engine.round_costs  # the engine's own table: a one pass's round reads it for its prompt rows
    pass_costs(engine.target, costs, PROBE_ROWS[-1])
    rows = fair_prefill_rows(engine.target, PREFILL_ROWS, costs=costs)
    engine.set_prefill_rows(rows, lanes, share=costs, one_pass=one_pass)
