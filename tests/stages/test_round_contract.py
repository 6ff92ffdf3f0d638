"""The round contract: a stage reads and writes only what its ports and declarations name.

Real rounds (prefill and verify, on tiny targets of the three families, with the ngram and mtp drafters, dflash2,
the oracle control whose continuations the test hands its drafter, and the measured plan with its pass-cost probe)
run with every stage behind the guard of tests/stages/round_guard.py and give the same tokens as unguarded runs; the
keeper reaches no engine. Planted stages, one side channel each (a Resources handle kept from prepare, a read of
Resources after planning, a write to the target or to Resources at prepare, a lane changed without `mutates`, an
undeclared output), show the guard refuses each.
"""

from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import torch

from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.spec import parse_spec
from speclane.pipeline.runtime import engine as engine_module
from speclane.pipeline.runtime.engine import Engine
from speclane.stages.contract.errors import StageFailure
from speclane.stages.contract.lanes import Lane, Roster
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage
from speclane.stages.contract.resources import Resources
from tests.drafters.conftest import write_drafter
from tests.models.target_artifacts import artifacts  # noqa: F401  (fixture)
from tests.round.conftest import engine, mixed_prompts, requests, targets  # noqa: F401  (fixture)
from tests.stages.conftest import make_lane, table
from tests.stages.round_guard import Guarded, Undeclared, guarded_plan, reaches

CASES = [(f, b, "fixed") for f in ("llama", "qwen3_5_text", "qwen3_next") for b in ("ngram", "mtp")]
CASES += [("llama", "dflash2", "fixed"), ("qwen3_next", "ngram", "measured"), ("qwen3_next", "oracle", "fixed")]


@pytest.fixture(scope="module")
def drafter_files(targets, tmp_path_factory):  # noqa: F811
    """family -> a directory with random mtp and dflash2 files for its target."""
    out = {}
    for name, target in targets.items():
        out[name] = tmp_path_factory.mktemp(f"contract-{name}")
        for backend in ("mtp", "dflash2"):
            write_drafter(backend, target, out[name])
    return out


def _run(target, backend, plan, directory):
    prompts, options, answers = mixed_prompts(2) + mixed_prompts(1), None, None
    if backend == "oracle":  # the plain run's own tokens, a share corrupted: accepted and rejected drafts both
        answers = {i: list(r.tokens) for i, r in enumerate(engine(target).generate(requests(prompts, 12)))}
        options = {"corrupt": 0.3, "seed": 1}
    elif backend != "ngram":
        options = {"path": str(directory)}
    eng = engine(target, backend, k=4, max_lanes=2, options=options, oracle=answers, plan=plan)
    done = eng.generate(requests(prompts, 12))
    return eng, [r.tokens for r in done]


@pytest.mark.parametrize("family, backend, plan", CASES)
def test_real_rounds_reach_only_what_their_stages_declare(
    family, backend, plan, targets, drafter_files, monkeypatch, tmp_path
):  # noqa: F811
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))  # the measured plan probes the pass cost afresh
    target, taps = targets[family], targets[family].hidden_taps
    try:
        with monkeypatch.context() as guarded:
            guarded.setattr(engine_module, "plan", guarded_plan())
            eng, tokens = _run(target, backend, plan, drafter_files[family])
        assert all(type(step.stage).__name__ == "Guarded" for step in eng.verify.steps + eng.prefill.steps)
        assert tokens == _run(target, backend, plan, drafter_files[family])[1]  # the guard changes nothing
    finally:
        target.tap(taps)
    stats = eng.stats(list(eng.retired))
    assert stats["rounds"] > 0
    if plan == "fixed":
        assert stats["drafted"] > 0
    else:
        assert eng.round_costs.source == "measured now"  # the probe ran, through the round's declared target input
    assert not reaches(eng.keeper, Engine)  # the keeper holds the handles it uses, not the engine


def _ports(*names):
    return tuple(Port(n, "record", ("lanes",), "host", record=Lane) if n == "lane_view" else Port(n) for n in names)


_KEPT: dict[str, Any] = {}


class Planted(Stage):
    """A stage that reads the lane view and produces nothing; each subclass plants one side channel."""

    inputs = _ports("lane_view")
    outputs = ()

    def run(self, lane_view):
        return {}


@attrs.frozen
class KeepsResources(Planted):
    """anchor_gather before this change: the Resources handed to prepare, kept on the stage and read in a round."""

    kind = "tests.stages.test_round_contract:KeepsResources"
    _resources: Any = attrs.field(default=None, init=False, eq=False)

    def prepare(self, resources):
        object.__setattr__(self, "_resources", resources)

    def run(self, lane_view):
        return {} if self._resources.target is not None else {}


@attrs.frozen
class ReadsAfterPlanning(Planted):
    """Resources kept outside the stage (a module's dict) and read in a round."""

    kind = "tests.stages.test_round_contract:ReadsAfterPlanning"

    def prepare(self, resources):
        _KEPT["resources"] = resources

    def run(self, lane_view):
        return {} if _KEPT["resources"].tokenizer is None else {}


@attrs.frozen
class TapsTarget(Planted):
    """The draft stage before this change: it set the target's taps from its prepare."""

    kind = "tests.stages.test_round_contract:TapsTarget"

    def prepare(self, resources):
        resources.target.hidden_taps = (0,)


@attrs.frozen
class WritesResources(Planted):
    """A handle left on Resources for another stage to find."""

    kind = "tests.stages.test_round_contract:WritesResources"

    def prepare(self, resources):
        resources.drafter = object()


@attrs.frozen
class PausesLanes(Planted):
    """The engine's `lane.paused` before this change, as a stage: a lane field changed without `mutates`."""

    kind = "tests.stages.test_round_contract:PausesLanes"

    def run(self, lane_view):
        lane_view[0].anchor = -1
        return {}


@attrs.frozen
class ExtraOutput(Planted):
    kind = "tests.stages.test_round_contract:ExtraOutput"

    def run(self, lane_view):
        return {"queued": 3}


def _plan_one(cls):
    spec = parse_spec({"name": "one", "stages": [{"name": "one", "kind": cls.kind}]}, "one.toml")
    target = SimpleNamespace(hidden_taps=())
    return guarded_plan()(build_graph(spec, provided=("lane_view",)), Resources(target=target))


@pytest.mark.parametrize(
    "cls, words",
    [
        (KeepsResources, r"fields past its parameters: \['_resources'\]"),
        (TapsTarget, "planning changed the target's fields"),
        (WritesResources, "prepare wrote Resources.drafter"),
    ],
)
def test_a_side_channel_made_at_planning_is_refused(cls, words):
    with pytest.raises(Undeclared, match=words):
        _plan_one(cls)


@pytest.mark.parametrize(
    "cls, words",
    [
        (ReadsAfterPlanning, "Resources.tokenizer read after planning"),
        (PausesLanes, "changed its input 'lane_view' in place"),
        (ExtraOutput, r"returned undeclared outputs \['queued'\]"),
    ],
)
def test_a_side_channel_used_in_a_round_is_refused(cls, words):
    lanes = [make_lane(slot=0, anchor=5, kv_len=3)]
    with pytest.raises(StageFailure) as failed:
        _plan_one(cls).run({"lane_view": lanes})
    assert isinstance(failed.value.cause, Undeclared) and failed.match(words)


def test_a_kept_handle_read_in_a_round_is_refused():
    """The field check refuses the stage at planning; behind it, its run could not read the field either."""
    stage = KeepsResources()
    stage.prepare(Resources(target=None))
    with pytest.raises(Undeclared, match=r"stage 'kept' read self._resources"):
        Guarded(stage, "kept").run(lane_view=[make_lane()])


def test_the_roster_hands_a_pass_its_lanes_but_the_held_ones():
    a, b = make_lane(slot=0, anchor=5), make_lane(slot=1, anchor=6)
    roster = Roster(table(a, b), held=frozenset({a}), queued=2)
    assert roster.running() == [b] and roster.queued == 2 and roster.max_lanes == 8
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        roster.queued = 0  # type: ignore[misc]
    assert torch.equal(torch.tensor([lane.slot for lane in Roster(table(a, b)).running()]), torch.tensor([0, 1]))
