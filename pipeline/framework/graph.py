"""The stage graph: a networkx DiGraph built from a spec, its edges made from port names, validated as a whole.

An input port binds to the one output of the same name (or to the output a `wire` names). An input nobody
produces is a round input, supplied by the engine; it must be one the engine provides (`provided`), and so must a
handle a stage `builds` at plan time (the engine hands it to every round). A stage that changes a port in place
(`mutates` or `touches`) runs after every stage listed before it that reads the same port (an implicit `state`
edge), so state is ordered like data. Every problem is collected and reported at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import networkx as nx

from speclane.pipeline.framework.kinds import lookup
from speclane.pipeline.framework.spec import SpecFile
from speclane.stages.contract.errors import SpecError, did_you_mean, raise_all
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import STATE, Stage

# What the engine hands every round (pipeline/runtime/engine.py builds exactly these).
ENGINE_INPUTS = ("lanes", "target", "target_state", "drafter", "drafter_state", "round_costs")


@attrs.frozen
class StageGraph:
    spec: SpecFile
    graph: nx.DiGraph  # nodes: stage names (attr "stage", "cls", "index"); edges: attr "ports" [(out, in)]
    round_inputs: tuple[str, ...]
    round_outputs: tuple[str, ...]

    def order(self) -> list[str]:
        """Stages in execution order: topological, ties broken by their order in the spec."""
        index = nx.get_node_attributes(self.graph, "index")
        return list(nx.lexicographical_topological_sort(self.graph, key=lambda n: index[n]))

    def stage(self, name: str) -> Stage:
        return self.graph.nodes[name]["stage"]

    def edges(self) -> list[dict[str, str]]:
        out = []
        for a, b, data in self.graph.edges(data=True):
            for out_port, in_port in data["ports"]:
                out.append({"from": a, "to": b, "port": in_port, "from_port": out_port, "kind": data["kind"]})
        return out


def _instantiate(cls: type[Stage], params: dict[str, Any], where: str, problems: list[str]) -> Stage | None:
    allowed = cls.param_names()
    bad = [k for k in params if k not in allowed]
    for key in bad:
        problems.append(
            f"{where}: unknown parameter '{key}'{did_you_mean(key, allowed)}; "
            f"parameters of kind '{cls.kind}': {', '.join(allowed) or '(none)'}"
        )
    if bad:
        return None
    try:
        return cls(**params)
    except (TypeError, ValueError, SpecError) as exc:  # SpecError: a validator that looks a name up (draft backends)
        problems.append(f"{where}: bad parameter value: {exc}")
        return None


def _declarations(where: str, stage: Stage, provided: Iterable[str]) -> list[str]:
    """What is wrong with a stage class's own declarations: a port named like the kept state, a port changed in
    place that is not an input, a handle built that the engine does not hand to rounds, a state that is not a class."""
    out = []
    names = [p.name for p in stage.inputs]
    if STATE in names + [p.name for p in stage.outputs]:
        out.append(f"{where}: no port may be named '{STATE}': `run` takes the stage's kept state under that name")
    for declared in ("mutates", "touches"):
        for port in getattr(stage, declared):
            if port not in names:
                out.append(f"{where}: `{declared}` names '{port}', which is not one of its inputs ({', '.join(names)})")
    for port in stage.builds:
        if port.name not in provided:
            out.append(
                f"{where}: builds '{port.name}', which the engine does not hand to rounds; a stage builds only "
                f"round inputs ({', '.join(provided)})"
            )
    if stage.state is not None and not attrs.has(stage.state):
        out.append(f"{where}: its `state` must be an attrs class, the record of what it keeps across rounds")
    return out


def build_graph(spec: SpecFile, provided: Iterable[str] = ENGINE_INPUTS, source: str | None = None) -> StageGraph:
    """Build and validate the graph of `spec`; raise SpecError listing every problem."""
    source = source or spec.source
    problems: list[str] = []
    g = nx.DiGraph()
    stages: dict[str, Stage] = {}
    broken: dict[str, type[Stage]] = {}  # known kind, bad params: its ports still count, to avoid knock-on errors
    unknown_kind = False
    for index, s in enumerate(spec.stages):
        where = f"{source}: stage '{s.name}'"
        try:
            cls = lookup(s.kind, where)
        except SpecError as exc:
            problems.append(str(exc))
            unknown_kind = True
            continue
        stage = _instantiate(cls, s.params, where, problems)
        if stage is not None:
            stages[s.name] = stage
            g.add_node(s.name, stage=stage, cls=cls, index=index, kind=s.kind)
        else:
            broken[s.name] = cls

    for name, stage in stages.items():
        problems.extend(_declarations(f"{source}: stage '{name}'", stage, provided))
    builders: dict[str, list[str]] = {}
    for name, stage in stages.items():
        for port in stage.builds:
            builders.setdefault(port.name, []).append(f"'{name}'")
    problems.extend(
        f"{source}: handle '{n}' is built by two stages ({', '.join(b)}); drop one"
        for n, b in builders.items()
        if len(b) > 1
    )

    producers: dict[str, list[tuple[str, Port]]] = {}
    for name, stage in list(stages.items()) + list(broken.items()):
        for port in stage.outputs:
            producers.setdefault(port.name, []).append((name, port))
    for port_name, prods in producers.items():
        if len(prods) > 1:
            names = ", ".join(f"'{p[0]}'" for p in prods)
            problems.append(
                f"{source}: port '{port_name}' has two producers ({names}); rename one output "
                f"with a [[wires]] entry or drop a stage"
            )

    wired: dict[tuple[str, str], tuple[str, str]] = {}
    for w in spec.wires:
        (src_stage, src_port), (dst_stage, dst_port) = w.from_.split("."), w.to.split(".")
        ok = True
        for st, pt, side in ((src_stage, src_port, "outputs"), (dst_stage, dst_port, "inputs")):
            if st not in stages:
                problems.append(f"{source}: wire {w.from_} -> {w.to}: no stage '{st}'{did_you_mean(st, stages)}")
                ok = False
            elif pt not in [p.name for p in getattr(stages[st], side)]:
                names = [p.name for p in getattr(stages[st], side)]
                problems.append(
                    f"{source}: wire {w.from_} -> {w.to}: stage '{st}' has no {side[:-1]} port "
                    f"'{pt}'{did_you_mean(pt, names)}"
                )
                ok = False
        if ok:
            wired[(dst_stage, dst_port)] = (src_stage, src_port)

    round_inputs: set[str] = set()
    consumed: set[tuple[str, str]] = set()
    all_outputs = sorted(producers)
    for name, stage in stages.items():
        for port in stage.inputs:
            where = f"{source}: stage '{name}' input '{port.name}'"
            if (name, port.name) in wired:
                src, out_name = wired[(name, port.name)]
                out_port = next(p for p in stages[src].outputs if p.name == out_name)
            elif port.name in producers:
                src, out_port = producers[port.name][0]
                if src in broken:
                    continue
            else:
                if port.name in provided:
                    round_inputs.add(port.name)
                elif not port.optional and not unknown_kind:
                    problems.append(
                        f"{where}: no stage produces it and the engine does not provide it"
                        f"{did_you_mean(port.name, all_outputs + list(provided))}; add a producer "
                        f"or a [[wires]] entry"
                    )
                continue
            if src == name:
                problems.append(f"{where}: the stage consumes its own output")
                continue
            why = port.compatible(out_port)
            if why:
                problems.append(f"{where}: contract mismatch with '{src}.{out_port.name}': {why}")
            consumed.add((src, out_port.name))
            data = g.get_edge_data(src, name) or {"ports": [], "kind": "data"}
            data["ports"].append((out_port.name, port.name))
            g.add_edge(src, name, **data)

    # State ordering: a mutator runs after the readers listed before it.
    index = {n: g.nodes[n]["index"] for n in g.nodes}
    for name, stage in stages.items():
        for state in (*stage.mutates, *stage.touches):
            for other, ost in stages.items():
                if other != name and index[other] < index[name] and state in [p.name for p in ost.inputs]:
                    if not g.has_edge(other, name):
                        g.add_edge(other, name, ports=[(state, state)], kind="state")

    if stages and not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        path = " -> ".join([a for a, _ in cycle] + [cycle[-1][1]])
        problems.append(f"{source}: the stages form a cycle: {path}; break it by renaming a port")
    raise_all(SpecError, problems, f"invalid spec {source}")
    round_outputs = sorted({p.name for n, s in stages.items() for p in s.outputs if (n, p.name) not in consumed})
    return StageGraph(spec=spec, graph=g, round_inputs=tuple(sorted(round_inputs)), round_outputs=tuple(round_outputs))
