"""`speclane spec validate | get | set | diff`: check and edit spec files from the command line.

The work is done by pipeline/framework/spec_edit.py; this module only parses arguments and prints.
"""

from __future__ import annotations

import argparse
import sys

from speclane.stages.contract.errors import SpecError


def add_parser(sub) -> None:
    p = sub.add_parser("spec", help="validate, read, edit and compare spec files")
    ops = p.add_subparsers(dest="op", required=True, metavar="OP")

    v = ops.add_parser("validate", help="check spec files; lists every problem, exits 2 if any")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.set_defaults(func=run_validate)

    g = ops.add_parser("get", help="the resolved values as `dotted.key = value` lines (defaults marked)")
    g.add_argument("file", metavar="FILE")
    g.add_argument("key", nargs="?", metavar="KEY", help="one key, or a prefix such as stages.draft")
    g.set_defaults(func=run_get)

    s = ops.add_parser("set", help="edit values, keeping comments and layout; refuses an edit that would not validate")
    s.add_argument("file", metavar="FILE")
    s.add_argument(
        "assignments",
        nargs="+",
        metavar="KEY=VALUE",
        help="VALUE is a TOML literal: 7, true, '\"ngram\"', '{ min_n = 1 }'; setting stages.NEW.kind adds a stage",
    )
    s.add_argument("--out", metavar="FILE", help="write the edited spec here; FILE is left as it is")
    place = s.add_mutually_exclusive_group()
    place.add_argument("--before", metavar="STAGE", help="place a stage this edit adds before STAGE")
    place.add_argument("--after", metavar="STAGE", help="place a stage this edit adds after STAGE")
    s.set_defaults(func=run_set)

    d = ops.add_parser("diff", help="what differs between two specs' resolved values; exits 1 if anything")
    d.add_argument("a", metavar="A")
    d.add_argument("b", metavar="B")
    d.set_defaults(func=run_diff)


def run_validate(args: argparse.Namespace) -> int:
    from speclane.pipeline.framework.graph import build_graph
    from speclane.pipeline.framework.spec import load_spec

    failed = 0
    for path in args.files:
        try:
            graph = build_graph(load_spec(path))
        except SpecError as exc:
            failed += 1
            print(f"speclane spec validate: error: {exc}", file=sys.stderr)
            continue
        print(f"{path}: ok ({len(graph.order())} stages, fingerprint {graph.spec.fingerprint()})")
    return 2 if failed else 0


def run_get(args: argparse.Namespace) -> int:
    from speclane.pipeline.framework.spec_edit import get_lines

    print("\n".join(get_lines(args.file, args.key)))
    return 0


def run_set(args: argparse.Namespace) -> int:
    from speclane.pipeline.framework.spec_edit import edit, get_lines

    pairs = []
    for text in args.assignments:
        key, eq, value = text.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"'{text}' is not KEY=VALUE, e.g. stages.draft.params.backend='\"none\"'")
        pairs.append((key.strip(), value.strip()))
    graph = edit(args.file, pairs, out=args.out, before=args.before, after=args.after)
    where = args.out or args.file
    for key, _ in pairs:
        for line in get_lines(where, key):
            print(f"{where}: {line}")
    print(f"{where}: ok ({len(graph.order())} stages, fingerprint {graph.spec.fingerprint()})")
    return 0


def run_diff(args: argparse.Namespace) -> int:
    from speclane.pipeline.framework.spec_edit import diff_lines

    lines = diff_lines(args.a, args.b)
    if lines:
        print(f"--- {args.a}\n+++ {args.b}")
        print("\n".join(lines))
    return 1 if lines else 0
