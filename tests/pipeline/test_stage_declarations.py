"""A stage's declarations beyond its ports, as the graph and the executor hold them: what it keeps across rounds
(`state`), what it builds at plan time (`builds`), what it changes in place (`mutates`, `touches`). Each bad
declaration is refused with the stage and the fix named; a kept state lives one plan long and reaches `run`."""

import attrs
import pytest
import torch

from speclane.pipeline.framework.executor import plan
from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.spec import parse_spec
from speclane.stages.contract.errors import ContractError, SpecError
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage

PATH = "tests.pipeline.test_stage_declarations"
COUNT = Port("count", "int64", ("lanes",))


@attrs.define
class Seen:
    rounds: int = 0


@attrs.frozen
class Counts(Stage):
    """Counts its rounds in its kept state and builds the `drafter` handle the engine hands every round."""

    kind = f"{PATH}:Counts"
    inputs = (COUNT, Port("drafter", "object", optional=True))
    outputs = (Port("rounds", "int", ("lanes",), "host"),)
    state = Seen
    builds = (Port("drafter", "object"),)

    def prepare(self, resources):
        return {"drafter": "built once"}

    def run(self, count, state, drafter=None):
        state.rounds += 1
        return {"rounds": (state.rounds,) * len(count) if drafter == "built once" else ()}


@attrs.frozen
class Bad(Stage):
    kind = f"{PATH}:Bad"
    inputs = (Port("state"), COUNT)
    outputs = ()
    touches = ("lanes",)
    builds = (Port("oracle", "object"),)
    state = dict

    def run(self, count, state=None):
        return {}


@attrs.frozen
class BuildsTooMuch(Counts):
    kind = f"{PATH}:BuildsTooMuch"

    def prepare(self, resources):
        return {"drafter": "built", "cache": {}}


def _spec(*kinds):
    return parse_spec({"name": "t", "stages": [{"name": f"s{i}", "kind": k} for i, k in enumerate(kinds)]}, "t.toml")


def test_a_kept_state_lives_one_plan_and_a_built_handle_reaches_every_round():
    made = plan(build_graph(_spec(Counts.kind), provided=("count", "drafter")))
    assert made.built == {"drafter": "built once"} and list(made.states) == ["s0"]
    for n in (1, 2, 3):
        assert made.run({"count": torch.zeros(2, dtype=torch.int64)})["rounds"] == (n, n)
    assert made.states["s0"].rounds == 3
    again = plan(build_graph(_spec(Counts.kind), provided=("count", "drafter")))
    assert again.states["s0"].rounds == 0  # a new plan starts afresh


def test_bad_declarations_are_refused_each_with_its_fix():
    with pytest.raises(SpecError) as err:
        build_graph(_spec(Bad.kind, Counts.kind, Counts.kind), provided=("count", "drafter", "state"))
    text = str(err.value)
    assert "stage 's0': no port may be named 'state'" in text
    assert "stage 's0': `touches` names 'lanes', which is not one of its inputs (state, count)" in text
    assert "stage 's0': builds 'oracle', which the engine does not hand to rounds" in text
    assert "stage 's0': its `state` must be an attrs class" in text
    assert "handle 'drafter' is built by two stages ('s1', 's2'); drop one" in text


def test_a_prepare_that_builds_what_its_class_does_not_declare_is_refused():
    with pytest.raises(ContractError, match=r"stage 's0': prepare\(\) built .*undeclared: cache; missing: none"):
        plan(build_graph(_spec(BuildsTooMuch.kind), provided=("count", "drafter")))
