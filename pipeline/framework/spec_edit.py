"""Reading and editing spec files by dotted key, keeping their comments and layout.

Keys are the ones `speclane.pipeline.framework.spec.dotted` prints: `name`, `description`, `version`,
`stages.<stage>.kind`, `stages.<stage>.params.<param>` (deeper for a table parameter:
`stages.draft.params.options.max_n`) and `wires.<i>.from` / `.to`. Values are TOML literals (`7`, `"ngram"`, `{ min_n =
1 }`). Edits go through tomlkit, so a file keeps every comment and its layout; an edit that would leave the spec invalid
is refused with every problem and the file is left as it was. Building graphs belongs to pipeline/framework/graph.py,
rendering them to pipeline/framework/introspect.py.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from speclane.pipeline.framework.graph import StageGraph, build_graph
from speclane.pipeline.framework.introspect import param_defaults
from speclane.pipeline.framework.kinds import lookup
from speclane.pipeline.framework.spec import SpecFile, dotted, load_spec, parse_spec
from speclane.stages.contract.errors import SpecError, did_you_mean, raise_all

DEFAULT = "  # default"


def toml_literal(value: Any) -> str:
    """`value` written as a TOML literal, the form `spec set` takes back."""
    if value is None:
        return "(none)"  # TOML has no null: a parameter whose default is None can only be set, not echoed
    if isinstance(value, dict):
        table = tomlkit.inline_table()
        table.update(value)
        return table.as_string()
    return tomlkit.item(value).as_string()


def resolved_values(spec: SpecFile) -> dict[str, tuple[Any, bool]]:
    """Every dotted key of `spec` -> (value, is_default): the file's values, and each stage kind's defaults
    for the parameters the file leaves out, in the order `dotted` gives (a stage's parameters sorted)."""
    given = dotted(spec)
    out = {key: (value, False) for key, value in given.items() if not key.startswith(("stages.", "wires."))}
    for stage in spec.stages:
        prefix = f"stages.{stage.name}."
        out[prefix + "kind"] = (stage.kind, False)
        try:
            defaults = param_defaults(lookup(stage.kind, f"{spec.source}: stage '{stage.name}'"))
        except SpecError:
            defaults = {}  # `spec validate` reports an unknown kind; the file's own values still print
        for name in sorted(set(stage.params) | set(defaults)):
            key = f"{prefix}params.{name}"
            out[key] = (given[key], False) if key in given else (defaults[name], True)
    out.update((key, (value, False)) for key, value in given.items() if key.startswith("wires."))
    return out


def get_lines(path: str | Path, key: str | None = None) -> list[str]:
    """`dotted.key = value` lines of the resolved spec, all or those at and under `key`."""
    values = resolved_values(load_spec(path))
    if key is not None:
        values = {k: v for k, v in values.items() if k == key or k.startswith(key + ".")}
        if not values:
            keys = resolved_values(load_spec(path))
            raise SpecError(
                f"{path}: no key '{key}'{did_you_mean(key, keys)}; `speclane spec get {path}` lists them all"
            )
    return [f"{k} = {toml_literal(v)}{DEFAULT if is_default else ''}" for k, (v, is_default) in values.items()]


def parse_literal(key: str, text: str) -> Any:
    """A tomlkit item for the TOML literal `text` (one value; a string needs its quotes)."""
    try:
        doc = tomlkit.parse(f"value = {text}\n")
    except TOMLKitError:
        doc = None
    if doc is None or list(doc) != ["value"] or "\n" in text:
        raise SpecError(
            f"{key}: '{text}' is not one TOML value; a string needs quotes, e.g. "
            f"{key}='\"{text}\"', a table is written {{ key = value }}"
        )
    return doc["value"]


def _stage_table(doc, name: str, key: str, create_at: int | None):
    stages = doc.get("stages")
    names = [t.get("name") for t in stages] if stages is not None else []
    if name in names:
        return stages[names.index(name)]
    if create_at is None:
        raise SpecError(
            f"{key}: the spec has no stage '{name}'{did_you_mean(name, names)}; to add one, set "
            f"stages.{name}.kind first (with --before or --after to place it)"
        )
    table = tomlkit.table()
    table["name"] = name
    stages.insert(min(create_at, len(stages)), table)
    return table


def _place(doc, before: str | None, after: str | None) -> int:
    names = [t.get("name") for t in doc.get("stages", [])]
    for anchor, shift in ((before, 0), (after, 1)):
        if anchor is not None:
            if anchor not in names:
                raise SpecError(f"no stage '{anchor}' to place the new stage next to{did_you_mean(anchor, names)}")
            return names.index(anchor) + shift
    return len(names)


def assign(doc, key: str, value, before: str | None = None, after: str | None = None):
    """Set dotted `key` in the tomlkit document `doc`; `stages.<new>.kind` adds a stage (placed by before/after).

    Returns the stage table it added, if it added one."""
    parts = key.split(".")
    added = None
    if parts[0] == "stages" and len(parts) >= 3:
        creating = parts[2:] == ["kind"]
        container = _stage_table(doc, parts[1], key, _place(doc, before, after) if creating else None)
        if creating and "kind" not in container:
            added = container
        path = parts[2:]
    elif parts[0] == "wires" and len(parts) == 3:
        wires = doc.get("wires", [])
        if not parts[1].isdigit() or int(parts[1]) >= len(wires):
            raise SpecError(
                f"{key}: the spec has {len(wires)} wire(s); set `wires` as a whole to add one, e.g. "
                f'wires=\'[{{ from = "a.out", to = "b.in" }}]\''
            )
        container, path = wires[int(parts[1])], parts[2:]
    elif len(parts) == 1 and parts[0] != "stages":
        container, path = doc, parts
    else:
        raise SpecError(
            f"'{key}' is not a key of a spec; keys look like stages.<stage>.params.<param>, "
            f"stages.<stage>.kind, wires.<i>.from, name, description, version"
        )
    for part in path[:-1]:
        if part not in container:
            container[part] = tomlkit.inline_table()  # e.g. `params` of a stage that had none
        container = container[part]
        if not isinstance(container, dict):
            raise SpecError(f"{key}: '{part}' holds a value, not a table")
    container[path[-1]] = value
    return added


def edit(
    path: str | Path,
    assignments: list[tuple[str, str]],
    out: str | Path | None = None,
    before: str | None = None,
    after: str | None = None,
) -> StageGraph:
    """Apply `key = literal` assignments to the spec at `path` and write it (to `out` when given).

    The edited spec must load and build; otherwise SpecError lists every problem and nothing is written.
    Returns the edited spec's graph.
    """
    path = Path(path)
    try:
        doc = tomlkit.parse(path.read_text())
    except OSError as exc:
        raise SpecError(f"cannot read spec file {path}: {exc.strerror}") from exc
    except TOMLKitError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from exc
    problems: list[str] = []
    added = []
    for key, text in assignments:
        try:
            added.append(assign(doc, key, parse_literal(key, text), before, after))
        except SpecError as exc:
            problems.extend(exc.problems)
    for table in filter(None, added):
        table.add(tomlkit.nl())  # the blank line between [[stages]] entries, as the shipped specs have
    raise_all(SpecError, problems, f"{path}: edit refused")
    text = tomlkit.dumps(doc)
    edits = ", ".join(f"{k} = {v}" for k, v in assignments)
    try:
        spec = parse_spec(tomllib.loads(text), str(path))
        graph = build_graph(spec, source=str(path))
    except SpecError as exc:
        raise SpecError(
            f"{path}: refused {edits}: the spec would be invalid ({len(exc.problems)} problem(s)); "
            f"the file is unchanged\n" + "\n".join(f"  - {p}" for p in exc.problems),
            exc.problems,
        ) from None
    _write(Path(out) if out else path, text)
    return graph


def _write(path: Path, text: str) -> None:
    """Replace `path` whole, so a reader never sees half a spec."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def diff_lines(a: str | Path, b: str | Path) -> list[str]:
    """What differs between two specs' resolved values, as `- key = old` / `+ key = new` lines (empty: same)."""
    spec_a, spec_b = load_spec(a), load_spec(b)
    va = {k: v for k, (v, _) in resolved_values(spec_a).items()}
    vb = {k: v for k, (v, _) in resolved_values(spec_b).items()}
    lines = []
    order_a, order_b = [s.name for s in spec_a.stages], [s.name for s in spec_b.stages]
    if order_a != order_b:
        lines += [f"- stages = {', '.join(order_a)}", f"+ stages = {', '.join(order_b)}"]
    for key in list(va) + [k for k in vb if k not in va]:
        if key in va and key in vb and va[key] == vb[key]:
            continue
        if key in va:
            lines.append(f"- {key} = {toml_literal(va[key])}")
        if key in vb:
            lines.append(f"+ {key} = {toml_literal(vb[key])}")
    return lines
