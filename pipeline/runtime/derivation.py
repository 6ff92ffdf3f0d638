"""A profile's speculation settings, derived: every candidate setting's predicted tokens per second at each lane count
on the machine the profile describes, for one model, and the one chosen.

Owns: the candidates (`candidates`: backends none, ngram, mtp and dflash2, draft tokens 7 down to 1, row budgets
the backend's default, 16, 8 and 3; the ones a model lacks the drafter files for are skipped, with the reason),
`memory_check` (whether a candidate fits the fast memory, and a MoE target's expert slots: what the memory plan
leaves the experts once everything else, a model drafter and a wide round's reserve included, has its bytes),
`score` (round_model's predictions for each candidate, by lane count; the same as `best_rate`, which is what the
measured draft plan takes) and `derive` (all of it for a profile, a model and a machine, with the choice). Not here:
gathering figures (plan_figures.py), the arithmetic (round_model.py), printing (pipeline/cli/plan.py).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from speclane.pipeline.runtime.memory_plan import Model, Setting, lay_out
from speclane.pipeline.runtime.request import SpecKnobs
from speclane.pipeline.runtime.round_model import (
    DrafterFigures,
    Machine,
    Round,
    TargetFigures,
    best_rate,
    choose,
    ratings,
)
from speclane.stages.anchor_gather import drafts_per_lane
from speclane.stages.contract.errors import ArtifactError
from speclane.stages.drafters import backend_class

BACKENDS = ("none", "ngram", "mtp", "dflash2")
DRAFT_TOKENS = (7, 6, 5, 4, 3, 2, 1)  # most first: at equal predictions the larger cap wins (the plan takes what pays)
BUDGETS = (0, 16, 8, 3)  # row-budget knob values, 0 = the backend's default


@attrs.frozen
class Candidate:
    """A speculation setting as its knobs: backend, draft tokens (0 with none) and the row-budget knob."""

    backend: str
    draft_tokens: int = 0
    row_budget: int = 0

    @property
    def rows(self) -> int:
        """The row budget in force: the knob, or the backend's default for 0 (0 then: no cap)."""
        return self.row_budget or backend_class(self.backend).default_rows

    def cap(self, lanes: int) -> int:
        return drafts_per_lane(self.draft_tokens, self.rows, lanes) if self.backend != "none" else 0

    def knobs(self) -> SpecKnobs:
        return SpecKnobs(backend=self.backend, draft_tokens=self.draft_tokens or None, draft_rows=self.row_budget)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "draft_tokens": self.draft_tokens, "row_budget": self.rows}


OFF = Candidate("none")


@attrs.frozen
class Scored:
    """A candidate's predictions: `rounds` by lane count, whether it `fits`, the expert slots it leaves."""

    candidate: Candidate
    rounds: dict[int, Round] = attrs.field(hash=False)
    fits: bool
    slots: int | None


def lane_counts(most: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `most`, and `most`."""
    out, n = [], 1
    while n < most:
        out.append(n)
        n *= 2
    return (*out, max(1, most))


def candidates(backends: tuple[str, ...] = BACKENDS) -> list[Candidate]:
    out = [OFF] if "none" in backends else []
    out += [Candidate(b, k, r) for b in backends if b != "none" for k in DRAFT_TOKENS for r in BUDGETS]
    return out


def memory_check(model: Model, base: Setting, memory: int, c: Candidate) -> tuple[bool, int | None]:
    """(fits, expert slots) of candidate `c` with `base`'s lanes allocated, in `memory` bytes of fast memory. A MoE
    target on a GPU gets the slots the plan leaves (every expert at most); on a CPU its experts are all resident
    unless `base` gives an expert cache, whose slots the plan lays out."""
    s = attrs.evolve(base, backend=c.backend, draft_tokens=c.draft_tokens, row_budget=c.rows)
    moe = any(model.cfg.moe_layers)
    if not moe or (base.build.device.type == "cpu" and base.expert_cache_bytes is None):
        return lay_out(model, s).bound <= memory, None
    if base.build.device.type == "cpu":
        plan = lay_out(model, s, memory)
        return bool(plan.fits), plan.expert_slots
    plan = lay_out(model, attrs.evolve(s, expert_cache_bytes=None))
    every = sum(model.cfg.moe_layers) * model.cfg.num_experts
    slots = min(every, (memory - plan.bound + plan.lines["experts_fast"]) // plan.one_expert)
    return slots >= 1, max(slots, 0)


def score(
    machine: Machine,
    target: TargetFigures,
    drafters: dict[str, DrafterFigures | None],
    cands: list[Candidate],
    lanes: tuple[int, ...],
    memory: Callable[[Candidate], tuple[bool, int | None]],
) -> list[Scored]:
    """Each candidate whose backend is in `drafters`, predicted at each lane count; candidates predicted exactly as
    an earlier one (the same drafts taken at every lane count, the same slots) are left out."""
    out, seen = [], set()
    for c in cands:
        if c.backend not in drafters:
            continue
        fits, slots = memory(c)
        rounds = {n: best_rate(machine, target, drafters[c.backend], n, c.cap(n), slots) for n in lanes}
        key = (c.backend, fits, slots, tuple(r.drafts for r in rounds.values()))
        if key in seen:
            continue
        seen.add(key)
        out.append(Scored(c, rounds, fits, slots))
    return out


@attrs.frozen
class Derivation:
    """What `derive` found: the machine's and the model's figures, the predictions, the choice and its score (the
    geometric mean of tokens per second over speculation off across `lanes`)."""

    profile: str
    model: str
    machine: Machine
    figures: dict = attrs.field(hash=False)
    lanes: tuple[int, ...]
    scored: list[Scored] = attrs.field(hash=False)
    choice: Candidate
    score: float
    rated: dict = attrs.field(hash=False)  # candidate -> its rating (round_model.ratings), None: not eligible
    acceptance: dict[str, str] = attrs.field(hash=False)
    skipped: dict[str, str] = attrs.field(hash=False)
    notes: tuple[str, ...] = ()
    target: TargetFigures | None = None
    drafters: dict = attrs.field(factory=dict, hash=False)
    memory: Callable | None = attrs.field(default=None, hash=False)

    def predict(self, c: Candidate, lanes: int) -> Round:
        """The prediction for any candidate of a backend this derivation weighed (a KeyError for one it skipped)."""
        _, slots = self.memory(c)
        return best_rate(self.machine, self.target, self.drafters[c.backend], lanes, c.cap(lanes), slots)

    @property
    def knobs(self) -> SpecKnobs:
        return self.choice.knobs()

    def off(self) -> Scored:
        return next(s for s in self.scored if s.candidate == OFF)

    def line(self) -> str:
        """One line that says what was derived and why, for a log."""
        c, off = self.choice, self.off()
        what = "speculation off" if c == OFF else f"{c.backend}, {c.draft_tokens} draft tokens, {c.rows or 'no'} rows"
        mine = next(s for s in self.scored if s.candidate == c)
        pred = ", ".join(f"{n} lane(s) {mine.rounds[n].tps / off.rounds[n].tps:.2f}x" for n in self.lanes)
        return (
            f"profile {self.profile}: {what} (predicted against speculation off: {pred}; "
            f"`speclane plan --profile {self.profile} --model ...` shows every candidate)"
        )


def derive(
    name: str,
    model: Model,
    base: Setting,
    memory: int,
    machine: Machine,
    target: TargetFigures,
    drafter_for: Callable[[str], DrafterFigures | None],
    figures: dict,
    lanes: tuple[int, ...],
    backends: tuple[str, ...] = BACKENDS,
) -> Derivation:
    """The derivation for profile `name`: `base` the configuration's other settings (lanes allocated, context,
    checkpoints, build), `memory` the fast memory in bytes, `drafter_for(backend)` a backend's figures (an
    ArtifactError: the model lacks the drafter, so the backend is skipped)."""
    drafters, skipped = {}, {}
    for b in backends:
        try:
            drafters[b] = drafter_for(b)
        except ArtifactError as exc:
            skipped[b] = str(exc).split(";")[0]

    def fit(c: Candidate) -> tuple[bool, int | None]:
        return memory_check(model, base, memory, c)

    scored = score(machine, target, drafters, candidates(backends), lanes, fit)
    table = {s.candidate: {n: (r.tps, s.fits) for n, r in s.rounds.items()} for s in scored}
    choice, value = choose(table, OFF)
    rated = ratings(table, OFF)
    acceptance = {b: d.accept_source for b, d in drafters.items() if d is not None}
    notes = []
    if not next(s for s in scored if s.candidate == OFF).fits:
        notes.append("speculation off does not fit this memory either: no setting fits (`speclane plan --memory`)")
    if target.routing is not None and base.build.device.type != "cpu":
        notes.append("the GPU expert tier is not built yet: the expert figures predict the tier the plan lays out")
    return Derivation(
        name,
        str(model.directory),
        machine,
        figures,
        lanes,
        scored,
        choice,
        value,
        rated,
        acceptance,
        skipped,
        tuple(notes),
        target,
        drafters,
        fit,
    )
