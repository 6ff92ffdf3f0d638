"""A cost model of a verify round on a machine described by figures, and the choice of speculation settings from it.

A round of L lanes, each of 1 + d rows (its anchor and d drafts; fewer on average for a drafter that does not
always draft, as the round probe measured how often it does: `DrafterFigures.offered`), costs
- the target pass: the bytes every pass reads (`dense_bytes`) plus, for a MoE target, the distinct routed experts
  the round's rows choose in every MoE layer, over the fast memory's bandwidth, plus rows x FLOPs a row over the
  compute peak where the machine states one; on a machine whose figures include a measured pass (the pass-cost
  probe: pass seconds by rows) that measurement replaces the dense part and the experts term counts only the
  distinct experts past the `top_k` one row reads, which the probe's rows already read;
- the copies: the experts the fast tier does not hold (misses), over the slow tier's link;
- the drafter: for d drafts, its weights read once a step (a chain drafter steps once a draft, a block drafter once
  a proposal) over the bandwidth, plus its rows' FLOPs over the compute peak; or, where the machine's figures are
  measured, its proposals as the round probe timed them (pipeline/runtime/drafter_probe.py).
The terms add (no overlap assumed: an upper bound where copies or compute overlap the reads). Where the machine's
figures are measured, the round probe (pipeline/runtime/drafter_probe.py) also timed whole rounds of the setting
(speculation off's in `Machine.rounds`, a drafter's in `DrafterFigures.rounds`); what such a round took beyond the
terms above, each lane's attention, the stages' bookkeeping, one-off costs inside a request, is the part `rest`,
interpolated between the measured widths and lane counts like the proposals, so at a measured setting the
prediction is the measured round. A round commits
L x tau(d) tokens, tau(d) = 1 + P(draft 1 accepted) + P(drafts 1..2 accepted) + ... (`tau`), from the drafter's
measured acceptance. The distinct experts and the misses come from the model's routing (routing_model.py).

`rate` is one round's tokens per second; `best_rate` what the measured draft plan (stages/draft_plan.py) takes within
a lane's cap: the drafts with the best rate, drafting only when predicted `MARGIN` faster than none. `choose` picks,
among settings that fit, never predicted below `FLOOR` x speculation off at any lane count, the one with the best
geometric mean of tokens per second over speculation off across the lane counts. Pure Python, no tensors: the figures
come in as numbers (pipeline/runtime/plan_figures.py gathers them). Not here: where figures come from (profiles.py),
the bytes a configuration holds (memory_plan.py).
"""

from __future__ import annotations

import functools
import math

import attrs

from speclane.pipeline.runtime.routing_model import RoutingTrace
from speclane.stages.contract.costs import RoundCosts
from speclane.stages.draft_plan import MARGIN, PRIOR

FLOOR = 0.97  # the defaults' promise: never below this x speculation off at any lane count


@attrs.frozen
class Machine:
    """Figures in SI units: fast memory `bandwidth` (bytes/s), the slow tier's `link` into it (bytes/s; None: no
    slow tier), `compute` (FLOP/s; None: not counted), `probe` a measured target pass (rows, seconds) or None;
    `rounds` speculation off's measured rounds as (lanes, 0, seconds) (the round probe; () where not measured),
    `probe_slots` the expert slots the measured rounds ran with (None: every expert resident)."""

    bandwidth: float
    link: float | None = None
    compute: float | None = None
    probe: tuple[tuple[int, ...], tuple[float, ...]] | None = None
    rounds: tuple[tuple[int, int, float], ...] = ()
    probe_slots: int | None = None

    @property
    def costs(self) -> RoundCosts | None:
        return None if self.probe is None else RoundCosts(*self.probe)


@attrs.frozen
class TargetFigures:
    """`dense_bytes` read by every pass whatever its rows (all but the routed experts), `row_flops` FLOPs a row,
    `expert_bytes` one routed expert, `routing` the measured routing of a MoE target (None: dense)."""

    dense_bytes: int
    row_flops: float
    expert_bytes: int = 0
    routing: RoutingTrace | None = None


@attrs.frozen
class DrafterFigures:
    """A draft backend: `accept[j]` the chance drafts 1..j+1 are all accepted (`accept_source` says where it was
    measured), `step_bytes` read a drafting step, `step_flops` FLOPs a row of a step, `chain`: a step makes one
    draft (else one step makes the whole proposal), `block_rows` rows a lane of a block step; `probed`, where the
    machine's figures are measured, its proposals' seconds as (lanes, draft tokens, seconds), which replace the
    estimate from bytes and FLOPs; `rounds` its whole rounds measured with the fixed plan, (lanes, drafts a lane,
    seconds); `offered[j]` the chance a round drafts j+1 drafts or more (() : every round drafts all it may)."""

    backend: str
    accept: tuple[float, ...]
    accept_source: str
    step_bytes: int = 0
    step_flops: float = 0.0
    chain: bool = True
    block_rows: int = 0
    probed: tuple[tuple[int, int, float], ...] = ()
    rounds: tuple[tuple[int, int, float], ...] = ()
    offered: tuple[float, ...] = ()

    def drafted(self, drafts: int) -> float:
        """Drafts a lane verifies a round on average when it may draft `drafts`: the sum of `offered` up to it (past
        the measured positions, the last one's chance), or `drafts` where nothing was measured."""
        if not self.offered or drafts <= 0:
            return float(max(drafts, 0))
        o = self.offered
        return sum(o[min(j, len(o) - 1)] for j in range(drafts))


@attrs.frozen
class Round:
    """A round's prediction: drafts a lane, tokens committed, seconds by part, tokens per second."""

    lanes: int
    drafts: int
    tokens: float
    parts: dict[str, float] = attrs.field(hash=False)

    @property
    def seconds(self) -> float:
        return sum(self.parts.values())

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


def tau(accept: tuple[float, ...], drafts: int) -> float:
    """Expected tokens a lane commits in a round of `drafts` drafts: 1 + the chances that drafts 1..j are all
    accepted, j = 1..drafts. Past the measured positions each draft keeps the last measured ratio P(j)/P(j-1);
    with no measurement, each draft is accepted with the measured plan's prior chance given the ones before."""
    probs = list(accept) or [PRIOR]
    ratio = probs[-1] / probs[-2] if len(probs) > 1 and probs[-2] > 0 else probs[0]
    while len(probs) < drafts:
        probs.append(probs[-1] * ratio)
    return 1.0 + sum(probs[:drafts])


def pass_parts(
    m: Machine, t: TargetFigures, lanes: int, drafts: int, step: float, slots: int | None, drafted: float | None = None
) -> dict:
    """Seconds of one target pass of `lanes` x (1 + `drafts`) rows by part: `pass` (dense reads and compute, or the
    probe), `experts` (routed experts read from fast memory), `copies` (misses over the link); `step` the tokens a
    lane moves on a round, `slots` the fast tier's expert slots (None: every expert resident); `drafted` the drafts
    a lane verifies on average (None: `drafts`; fewer where the drafter does not always draft: the rows are then
    lanes x (1 + drafted), and a lane drafts its `drafts` in that share of the rounds)."""
    drafted = float(drafts) if drafted is None else drafted
    rows = lanes * (drafted + 1)
    costs = m.costs
    if costs is not None:
        base = costs.target_s(rows)
    else:
        base = t.dense_bytes / m.bandwidth + (rows * t.row_flops / m.compute if m.compute else 0.0)
    parts = {"pass": base, "experts": 0.0, "copies": 0.0}
    r = t.routing
    if r is None:
        return parts
    every = r.experts * r.moe_layers
    share = drafted / drafts if drafts else 1.0
    seen = r.round(lanes, drafts, step, every if slots is None else slots, share)
    read = seen.distinct - (r.top_k if costs is not None else 0.0)
    parts["experts"] = max(0.0, read) * r.moe_layers * t.expert_bytes / m.bandwidth
    if seen.misses:
        if m.link is None:
            raise ValueError("round model: this machine states no link to a slow tier, but the experts do not all fit")
        parts["copies"] = seen.misses * t.expert_bytes / m.link
    return parts


def drafter_seconds(m: Machine, d: DrafterFigures | None, lanes: int, drafts: int) -> float:
    """The drafter's seconds for `lanes` lanes drafting `drafts` each: its probed proposals where it has them (linear
    in draft tokens between the probed ones, and in lanes between the probed lane counts; past the most lanes probed,
    in proportion), else its weights once a step and its rows' FLOPs."""
    if d is None or drafts <= 0:
        return 0.0
    if d.probed:
        return _probed(d.probed, lanes, drafts)
    if not d.step_bytes:
        return 0.0
    steps, rows = (drafts, lanes) if d.chain else (1, lanes * max(d.block_rows, drafts + 1))
    flops = rows * d.step_flops / m.compute if m.compute else 0.0
    return steps * (d.step_bytes / m.bandwidth + flops)


def _probed(table: tuple[tuple[int, int, float], ...], lanes: int, drafts: int) -> float:
    by_lanes: dict[int, list[tuple[int, float]]] = {}
    for n, w, sec in table:
        by_lanes.setdefault(n, []).append((w, sec))

    def at(points: list[tuple[int, float]], x: float) -> float:
        points = sorted(points)
        if len(points) == 1 or x <= points[0][0]:
            return points[0][1] * (x / points[0][0] if len(points) == 1 else 1.0)
        lo, hi = next(((a, b) for a, b in zip(points, points[1:]) if x <= b[0]), (points[-2], points[-1]))
        return lo[1] + (hi[1] - lo[1]) * (x - lo[0]) / (hi[0] - lo[0])

    per_lanes = [(n, at(points, drafts)) for n, points in by_lanes.items()]
    most = max(n for n, _ in per_lanes)
    if lanes > most:
        return dict(per_lanes)[most] * lanes / most
    return at(per_lanes, lanes) if len(per_lanes) > 1 else per_lanes[0][1]


def _modelled(m: Machine, t: TargetFigures, d: DrafterFigures | None, lanes: int, drafts: int, slots) -> dict:
    drafts = drafts if d is not None else 0
    step = tau(d.accept, drafts) if d is not None else 1.0
    parts = pass_parts(m, t, lanes, drafts, step, slots, d.drafted(drafts) if d is not None else None)
    parts["drafter"] = drafter_seconds(m, d, lanes, drafts)
    return parts


@functools.lru_cache(maxsize=256)
def _rests(m: Machine, t: TargetFigures, d: DrafterFigures | None) -> tuple[tuple[int, int, float], ...]:
    """(lanes, drafts, seconds) the measured rounds took beyond the modelled parts, at the probe's slots."""
    table = d.rounds if d is not None and d.rounds else m.rounds  # a drafter not measured: off's rounds at least
    return tuple((n, w, sec - sum(_modelled(m, t, d, n, w, m.probe_slots).values())) for n, w, sec in table)


def rest_seconds(m: Machine, t: TargetFigures, d: DrafterFigures | None, lanes: int, drafts: int) -> float | None:
    """The part `rest` of a round of `lanes` lanes drafting `drafts` (speculation off's where `drafts` is 0): linear
    between the measured drafts (the nearest measured outside them) and lane counts, past the most lanes measured
    in proportion; None where no round was measured."""
    table = _rests(m, t, None if drafts == 0 else d)
    if not table:
        return None
    by_lanes: dict[int, list[tuple[int, float]]] = {}
    for n, w, sec in table:
        by_lanes.setdefault(n, []).append((w, sec))
    per_lanes = sorted((n, _line(sorted(points), drafts)) for n, points in by_lanes.items())
    if lanes > per_lanes[-1][0]:
        return per_lanes[-1][1] * lanes / per_lanes[-1][0]
    return _line(per_lanes, lanes)


def _line(points: list[tuple[int, float]], x: float) -> float:
    """Linear between sorted points, the end points' values outside them."""
    if x <= points[0][0] or len(points) == 1:
        return points[0][1] if x <= points[0][0] else points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def rate(m: Machine, t: TargetFigures, d: DrafterFigures | None, lanes: int, drafts: int, slots: int | None) -> Round:
    """The prediction for rounds of `lanes` lanes each drafting `drafts` (0 with no drafter)."""
    drafts = drafts if d is not None else 0
    per_lane = tau(d.accept, drafts) if d is not None else 1.0
    parts = _modelled(m, t, d, lanes, drafts, slots)
    rest = rest_seconds(m, t, d, lanes, drafts)
    if rest is not None:
        parts["rest"] = rest
    return Round(lanes, drafts, lanes * per_lane, parts)


def best_rate(m: Machine, t: TargetFigures, d: DrafterFigures | None, lanes: int, cap: int, slots: int | None) -> Round:
    """What the measured draft plan takes with at most `cap` drafts a lane: the drafts with the best predicted
    rate, drafting only when that is `MARGIN` faster than no drafts."""
    plain = rate(m, t, d, lanes, 0, slots)
    best = max((rate(m, t, d, lanes, k, slots) for k in range(1, cap + 1)), key=lambda r: r.tps, default=plain)
    return best if d is not None and best.tps >= MARGIN * plain.tps else plain


def ratings(scores: dict, off) -> dict:
    """Each key's geometric mean of tokens per second over speculation off across the lane counts, or None where it
    does not fit at some lane count or is predicted below `FLOOR` x off at one: `scores[key]` maps each lane count
    to (tokens per second, fits); `off` is speculation off's key."""
    base = scores[off]
    out = {}
    for key, by_lanes in scores.items():
        ratios = [tps / base[n][0] for n, (tps, fits) in by_lanes.items() if fits]
        ok = len(ratios) == len(by_lanes) and min(ratios) >= FLOOR
        out[key] = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ok else None
    return out


def choose(scores: dict, off) -> tuple:
    """(key, its rating) of the best-rated key of `scores` (`ratings`); keys come in order of preference, the first
    wins a tie, and `off` is chosen when nothing else is rated above it (or nothing fits)."""
    best, best_score = off, 1.0
    for key, value in ratings(scores, off).items():
        if value is not None and value > best_score * (1 + 1e-9):
            best, best_score = key, value
    return best, best_score
