"""`speclane graph`: the round's stage graph as a table, JSON, Mermaid or DOT, after the --spec-* knobs."""

from __future__ import annotations

import argparse

from speclane.pipeline.cli.common import add_knob_flags, knobs_from_args
from speclane.pipeline.framework.introspect import FORMATS, render
from speclane.pipeline.framework.spec import load_spec


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="show a spec's stage graph: stages, ports, edges, round inputs and outputs")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (for reading), json (for programs), mermaid or dot (for drawing)",
    )
    add_knob_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speclane.pipeline.framework.graph import build_graph
    from speclane.pipeline.runtime.engine import resolve_spec

    graph = build_graph(resolve_spec(load_spec(args.spec), knobs_from_args(args)))
    print(render(graph, args.format))
    return 0
