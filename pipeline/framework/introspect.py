"""Introspection of a built stage graph: a JSON-ready description, and table, Mermaid and DOT renderings.

`graph_json` is the one description; the other formats are drawn from it, so a stage, port or edge that
shows in one shows in all. The server answers the protocol's graph request with `graph_json`. Building and
validating a graph belongs to pipeline/framework/graph.py, reading and editing spec files to pipeline/spec*.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:  # FORMATS is read by `speclane graph`'s parser, which imports neither (nor torch)
    from speclane.pipeline.framework.graph import StageGraph
    from speclane.stages.contract.registry import Stage

FORMATS = ("table", "json", "mermaid", "dot")


def _param_fields(cls: type[Stage]) -> list[attrs.Attribute]:
    """The parameters of a stage kind: init fields that take part in equality. A field such as a user
    stage's log (`eq=False`) is not a setting a spec gives (what a stage keeps across rounds is best its declared
    `state`, which the graph shows)."""
    return [f for f in attrs.fields(cls) if f.init and f.eq and not f.name.startswith("_")]


def param_defaults(cls: type[Stage]) -> dict[str, Any]:
    """The parameters of a stage kind that have a default, with that default."""
    out = {}
    for field in _param_fields(cls):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            out[field.name] = field.default.factory()
        elif field.default is not attrs.NOTHING:
            out[field.name] = field.default
    return out


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def effective_params(stage: Stage) -> dict[str, Any]:
    """Every parameter of a built stage with the value it runs with (the spec's, or the default)."""
    return {f.name: _jsonable(getattr(stage, f.name)) for f in _param_fields(type(stage))}


def round_input_consumers(graph: StageGraph) -> dict[str, list[str]]:
    """Round input name -> the stages that read it straight from the engine, in execution order."""
    out: dict[str, list[str]] = {name: [] for name in graph.round_inputs}
    for name in graph.order():
        bound = {
            in_port
            for _, _, d in graph.graph.in_edges(name, data=True)
            if d["kind"] == "data"
            for _, in_port in d["ports"]
        }
        for port in graph.stage(name).inputs:
            if port.name in out and port.name not in bound:
                out[port.name].append(name)
    return out


def graph_json(graph: StageGraph) -> dict[str, Any]:
    """The graph as plain JSON data: stages in execution order with their ports, edges, round inputs/outputs."""
    stages = []
    for name in graph.order():
        stage = graph.stage(name)
        stages.append(
            {
                "name": name,
                "kind": graph.graph.nodes[name]["kind"],
                "params": effective_params(stage),
                "inputs": [p.describe() for p in stage.inputs],
                "outputs": [p.describe() for p in stage.outputs],
                "mutates": list(stage.mutates),
                "touches": list(stage.touches),
                "state": None if stage.state is None else stage.state.__name__,
                "builds": [p.describe() for p in stage.builds],
            }
        )
    return {
        "name": graph.spec.name,
        "description": graph.spec.description,
        "source": graph.spec.source,
        "fingerprint": graph.spec.fingerprint(),
        "stages": stages,
        "edges": graph.edges(),
        "round_inputs": [{"name": n, "to": to} for n, to in round_input_consumers(graph).items()],
        "round_outputs": list(graph.round_outputs),
    }


def _port_text(port: dict[str, Any]) -> str:
    dims = f"[{', '.join(map(str, port['dims']))}]" if port["dims"] is not None else ""
    return f"{port['dtype']}{dims}{' optional' if port['optional'] else ''}"


def _literal(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else f'"{value}"'


def render_table(data: dict[str, Any]) -> str:
    """A reading of the graph for a terminal: each stage, its parameters, and where each port comes from or goes."""
    sources: dict[tuple[str, str], str] = {}
    sinks: dict[tuple[str, str], list[str]] = {}
    for e in data["edges"]:
        if e["kind"] == "data":
            sources[(e["to"], e["port"])] = f"{e['from']}.{e['from_port']}"
            sinks.setdefault((e["from"], e["from_port"]), []).append(e["to"])
    engine = {ri["name"] for ri in data["round_inputs"]}
    lines = [
        f"spec {data['name']}  fingerprint {data['fingerprint']}  ({data['source']})",
        f"round inputs:  {', '.join(sorted(engine)) or '(none)'}",
        f"round outputs: {', '.join(data['round_outputs']) or '(none)'}",
        "",
    ]
    for i, s in enumerate(data["stages"], 1):
        params = ", ".join(f"{k}={_literal(v)}" for k, v in s["params"].items())
        lines.append(f"{i}. {s['name']}  kind {s['kind']}" + (f"  [{params}]" if params else ""))
        for p in s["inputs"]:
            src = sources.get((s["name"], p["name"]))
            src = src or ("engine" if p["name"] in engine else "(absent: optional)")
            mut = "  (mutates)" if p["name"] in s["mutates"] else "  (touches)" if p["name"] in s["touches"] else ""
            lines.append(f"     in   {p['name']:<16} {_port_text(p):<30} <- {src}{mut}")
        for p in s["outputs"]:
            dst = ", ".join(sinks.get((s["name"], p["name"]), [])) or "round output"
            lines.append(f"     out  {p['name']:<16} {_port_text(p):<30} -> {dst}")
        for p in s["builds"]:
            lines.append(f"     builds {p['name']:<14} {_port_text(p):<30} -> engine, every round")
        if s["state"]:
            lines.append(f"     keeps  {s['state']:<45} across rounds")
    state = [e for e in data["edges"] if e["kind"] == "state"]
    if state:
        lines += ["", "state order (a mutator runs after the readers listed before it):"]
        lines += [f"     {e['from']} before {e['to']} ({e['port']})" for e in state]
    return "\n".join(lines)


def _edge_labels(data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(from, to, kind, label) per connected stage pair, ports joined; renamed ports read 'out→in'."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for e in data["edges"]:
        port = e["port"] if e["port"] == e["from_port"] else f"{e['from_port']}→{e['port']}"
        grouped.setdefault((e["from"], e["to"], e["kind"]), []).append(port)
    return [(a, b, kind, ", ".join(ports)) for (a, b, kind), ports in grouped.items()]


def _draw(data: dict[str, Any], head: list[str], tail: list[str], stage, round_input, edge, input_edge) -> str:
    """The drawing formats share one walk: stage nodes, round input nodes, stage edges, round input edges."""
    lines = head + [stage(s["name"], s["kind"]) for s in data["stages"]]
    lines += [round_input(r["name"]) for r in data["round_inputs"]]
    lines += [edge(a, b, kind, label) for a, b, kind, label in _edge_labels(data)]
    lines += [input_edge(r["name"], b) for r in data["round_inputs"] for b in r["to"]]
    return "\n".join(lines + tail)


def _kind_line(name: str, kind: str) -> list[str]:
    """A node's second line: its kind, unless the stage is named after it (`accept` of kind accept)."""
    return [] if kind == name else [kind]


def _mermaid_text(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'


def render_mermaid(data: dict[str, Any]) -> str:
    """A Mermaid flowchart: stages as boxes, round inputs as rounded nodes, state ordering as dotted arrows."""
    return _draw(
        data,
        ["flowchart TD"],
        [],
        lambda name, kind: (
            f"    s_{name}[{_mermaid_text(''.join([name, *(f'<br/><i>{k}</i>' for k in _kind_line(name, kind))]))}]"
        ),
        lambda name: f"    in_{name}([{_mermaid_text(name)}])",
        lambda a, b, kind, label: f"    s_{a} {'-->' if kind == 'data' else '-.->'}|{_mermaid_text(label)}| s_{b}",
        lambda name, b: f"    in_{name} -.-> s_{b}",
    )


def _dot_quote(*lines: str) -> str:
    """A DOT string; several lines are joined with DOT's own line break escape."""
    return '"' + "\\n".join(t.replace("\\", "\\\\").replace('"', '\\"') for t in lines) + '"'


def render_dot(data: dict[str, Any]) -> str:
    """A Graphviz digraph with the same nodes and edges as the Mermaid rendering."""
    q = _dot_quote
    styles = {"data": "", "state": ", style=dashed"}
    return _draw(
        data,
        [f"digraph {q(data['name'])} {{", "    rankdir=TB;", "    node [shape=box];"],
        ["}"],
        lambda name, kind: f"    {q(name)} [label={q(name, *_kind_line(name, kind))}];",
        lambda name: f"    {q('in:' + name)} [label={q(name)}, shape=ellipse];",
        lambda a, b, kind, label: f"    {q(a)} -> {q(b)} [label={q(label)}{styles[kind]}];",
        lambda name, b: f"    {q('in:' + name)} -> {q(b)} [style=dotted];",
    )


def render(graph: StageGraph, fmt: str) -> str:
    data = graph_json(graph)
    if fmt == "json":
        return json.dumps(data, indent=2)
    return {"table": render_table, "mermaid": render_mermaid, "dot": render_dot}[fmt](data)
