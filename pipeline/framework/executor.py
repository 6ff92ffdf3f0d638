"""The executor: plan a validated stage graph once, then run rounds.

Planning fixes the order, resolves every input to the value slot it reads, and calls each stage's `prepare`
hook once. A round is then a flat loop over prepared calls: no graph walk, no name lookups beyond a dict.
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
from speclane.stages.contract.resources import Resources

Key = tuple[str, str]  # (stage name or "" for a round input, port name)


@attrs.frozen
class Step:
    name: str
    stage: Any
    bindings: tuple[tuple[str, Key], ...]  # (input port, where its value lives)


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

    def run(self, inputs: Mapping[str, Any], timer: Callable[[str, float], None] | None = None) -> dict[str, Any]:
        """Run one round. Returns every produced value by port name (round inputs included)."""
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
            start = time.perf_counter() if timer else 0.0
            touched = touched or bool(step.stage.mutates)
            try:
                out = step.stage.run(**kwargs)
            except Exception as exc:  # noqa: BLE001 - named and handed to the engine, which decides
                raise StageFailure(step.name, exc, touched) from exc
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


def plan(graph: StageGraph, resources: Resources | None = None, check_contracts: bool = False) -> Plan:
    """Order the graph, bind every input to its source, and prepare each stage once."""
    resources = resources if resources is not None else Resources(target=None)  # shared by the plan's stages
    steps = []
    for name in graph.order():
        stage = graph.stage(name)
        sources: dict[str, Key] = {}
        for src, _, data in graph.graph.in_edges(name, data=True):
            if data["kind"] == "data":
                for out_port, in_port in data["ports"]:
                    sources[in_port] = (src, out_port)
        bindings = tuple((p.name, sources.get(p.name, ("", p.name))) for p in stage.inputs)
        stage.prepare(resources)
        steps.append(Step(name=name, stage=stage, bindings=bindings))
    return Plan(graph=graph, steps=tuple(steps), check_contracts=check_contracts)
