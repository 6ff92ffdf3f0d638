"""The executor: plan a validated stage graph once, then run rounds.

Planning fixes the order, resolves every input to the value slot it reads, calls each stage's `prepare` hook once
(keeping the handles it `builds`, `Plan.built`) and makes each stage's kept `state` (`Plan.states`). A round is then
a flat loop over prepared calls: no graph walk, no name lookups beyond a dict. A stage gets exactly its declared
inputs, and its state under `state`; a handle a stage built is a round input of every round of the plan unless the
caller hands its own.
Per-stage timing is a hook (`timer`), off by default. On CPU the stages run in order on the calling thread;
stage code itself decides what runs on an accelerator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from speclane.pipeline.framework.graph import StageGraph
from speclane.stages.contract.errors import ContractError, StageFailure
from speclane.stages.contract.ports import check_value
from speclane.stages.contract.registry import STATE
from speclane.stages.contract.resources import Resources

Key = tuple[str, str]  # (stage name or "" for a round input, port name)


@attrs.frozen
class Step:
    name: str
    stage: Any
    bindings: tuple[tuple[str, Key], ...]  # (input port, where its value lives)
    state: Any = None  # what the stage keeps across rounds (its declared `state`), handed to `run` as `state`


@attrs.define
class StageTimes:
    """Accumulated wall time per stage, for `--stage-times`."""

    seconds: dict[str, float] = attrs.field(factory=dict)
    rounds: int = 0

    def __call__(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def shares(self) -> dict[str, float]:
        total = sum(self.seconds.values()) or 1.0
        return {k: v / total for k, v in self.seconds.items()}


@attrs.define
class Plan:
    graph: StageGraph
    steps: tuple[Step, ...]
    check_contracts: bool = False
    built: dict[str, Any] = attrs.field(factory=dict)  # handle name -> what a stage's `prepare` built

    @property
    def states(self) -> dict[str, Any]:
        """Stage name -> what it keeps across rounds, for the stages that declare a `state`."""
        return {step.name: step.state for step in self.steps if step.state is not None}

    def run(self, inputs: Mapping[str, Any], timer: Callable[[str, float], None] | None = None) -> dict[str, Any]:
        """Run one round. Returns every produced value by port name (round inputs included)."""
        inputs = {**self.built, **inputs}
        missing = [n for n in self.graph.round_inputs if n not in inputs]
        if missing:
            raise ContractError(f"round of spec '{self.graph.spec.name}' is missing round inputs {missing}")
        values: dict[Key, Any] = {("", k): v for k, v in inputs.items()}
        sizes: dict[str, int] = {}
        touched = False
        for step in self.steps:
            kwargs = {port: values.get(key) for port, key in step.bindings}
            if self.check_contracts:
                for port in step.stage.inputs:
                    check_value(port, kwargs.get(port.name), sizes, f"stage '{step.name}' input")
            if step.state is not None:
                kwargs[STATE] = step.state
            start = time.perf_counter() if timer else 0.0
            touched = touched or bool(step.stage.mutates)
            try:
                out = step.stage.run(**kwargs)
            except Exception as exc:  # noqa: BLE001 - named and handed to the engine, which decides
                laid = next((v for (_, port), v in values.items() if port == "lane_view"), None)
                raise StageFailure(step.name, exc, touched, laid) from exc
            if timer:
                timer(step.name, time.perf_counter() - start)
            for port in step.stage.outputs:
                if port.name not in out and not port.optional:
                    raise ContractError(f"stage '{step.name}' did not produce its output '{port.name}'")
                value = out.get(port.name)
                if self.check_contracts:
                    check_value(port, value, sizes, f"stage '{step.name}' output")
                values[(step.name, port.name)] = value
        result = {k: v for (_, k), v in values.items()}
        return result


def plan(
    graph: StageGraph, resources: Resources | None = None, check_contracts: bool = False, like: Plan | None = None
) -> Plan:
    """Order the graph, bind every input to its source, prepare each stage once and make its kept state. `like`: a
    plan of the same stages with other parameters; a stage of the same name and kind there lends its kept state and
    is not prepared again, its handles being `like`'s (one drafter and one acceptance record for both plans)."""
    resources = resources if resources is not None else Resources(target=None)  # shared by the plan's stages
    steps, built = [], dict(like.built) if like is not None else {}
    twins = {step.name: step for step in like.steps} if like is not None else {}
    for name in graph.order():
        stage = graph.stage(name)
        sources: dict[str, Key] = {}
        for src, _, data in graph.graph.in_edges(name, data=True):
            if data["kind"] == "data":
                for out_port, in_port in data["ports"]:
                    sources[in_port] = (src, out_port)
        bindings = tuple((p.name, sources.get(p.name, ("", p.name))) for p in stage.inputs)
        twin = twins.get(name)
        if twin is not None and type(twin.stage) is type(stage):
            steps.append(Step(name=name, stage=stage, bindings=bindings, state=twin.state))
            continue
        built.update(_built(name, stage, stage.prepare(resources)))
        state = stage.new_state()
        if stage.state is not None and not isinstance(state, stage.state):
            raise ContractError(f"stage '{name}': new_state() gave a {type(state).__name__}, not its {stage.state}")
        steps.append(Step(name=name, stage=stage, bindings=bindings, state=state))
    return Plan(graph=graph, steps=tuple(steps), check_contracts=check_contracts, built=built)


def _built(name: str, stage: Any, made: Mapping[str, Any] | None) -> dict[str, Any]:
    """What `prepare` returned, checked against the stage's `builds`: every handle it declares, nothing else."""
    made = dict(made or {})
    declared = {p.name: p for p in stage.builds}
    extra = sorted(set(made) - set(declared))
    missing = sorted(n for n, p in declared.items() if made.get(n) is None and not p.optional)
    if extra or missing:
        raise ContractError(
            f"stage '{name}': prepare() built {sorted(made)}, but its class declares builds {sorted(declared)} "
            f"(undeclared: {', '.join(extra) or 'none'}; missing: {', '.join(missing) or 'none'}); declare every "
            f"handle in `builds`"
        )
    return made
