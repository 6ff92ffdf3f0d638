"""Spec files: the declarative description of a round, read from TOML and validated by pydantic.

A spec lists stages (`name`, `kind`, `params`) and optional `wires` that rename an edge
(`from = "stage.port"`, `to = "stage.port"`). Edges otherwise come from port names (pipeline/framework/graph.py).
This module only reads, checks the file's shape and resolves overrides; building and validating the graph
belongs to pipeline/framework/graph.py, and comment-preserving edits to pipeline/framework/spec_edit.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from speclane.stages.contract.errors import SpecError, raise_all

SPEC_DIR = Path(__file__).resolve().parents[2] / "specs"


class StageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    kind: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class WireSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: str = Field(alias="from", pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
    to: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


class SpecFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    version: int = 1
    stages: list[StageSpec] = Field(min_length=1)
    wires: list[WireSpec] = Field(default_factory=list)
    _source: str = PrivateAttr(default="")

    @property
    def source(self) -> str:
        """Where the spec came from (a file path), for error messages."""
        return self._source or f"spec '{self.name}'"

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def fingerprint(self) -> str:
        """A short hash of the resolved spec: two specs that run the same have the same fingerprint."""
        blob = json.dumps(self.model_dump(by_alias=True), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _pydantic_problems(exc: ValidationError, source: str) -> list[str]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            out.append(f"{source}: unknown key '{loc}' (remove it; see docs/spec-format.md)")
        else:
            out.append(f"{source}: '{loc}': {err['msg']}")
    return out


def parse_spec(data: dict[str, Any], source: str) -> SpecFile:
    try:
        spec = SpecFile.model_validate(data)
    except ValidationError as exc:
        raise_all(SpecError, _pydantic_problems(exc, source), f"invalid spec {source}")
        raise  # unreachable: raise_all raised
    names = [s.name for s in spec.stages]
    dupes = sorted({n for n in names if names.count(n) > 1})
    raise_all(
        SpecError,
        [f"{source}: stage name '{n}' is used twice; names must be unique" for n in dupes],
        f"invalid spec {source}",
    )
    return spec


def load_spec(path: str | Path) -> SpecFile:
    """Read and shape-check a spec file. A bare name such as 'verify' means specs/verify.toml."""
    path = Path(path)
    if not path.suffix and not path.exists():
        path = SPEC_DIR / f"{path.name}.toml"
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(
            f"cannot read spec file {path}: {exc.strerror}; pass an existing .toml file "
            f"or one of: {', '.join(sorted(p.stem for p in SPEC_DIR.glob('*.toml')))}"
        ) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from exc
    spec = parse_spec(data, str(path))
    spec._source = str(path)
    return spec


def with_params(spec: SpecFile, overrides: dict[str, dict[str, Any]]) -> SpecFile:
    """A copy of `spec` with `overrides[stage_name][param] = value` applied (CLI knobs land here)."""
    data = copy.deepcopy(spec.model_dump(by_alias=True))
    for stage_name, params in overrides.items():
        for stage in data["stages"]:
            if stage["name"] == stage_name:
                stage["params"].update(params)
                break
        else:
            raise SpecError(f"spec '{spec.name}' has no stage named '{stage_name}' to set {sorted(params)} on")
    out = parse_spec(data, f"{spec.source} (with overrides)")
    out._source = spec.source
    return out


def dotted(spec: SpecFile) -> dict[str, Any]:
    """The resolved spec as flat `dotted.key -> value` pairs (`stages.<name>.params.<p>`)."""
    out: dict[str, Any] = {"name": spec.name, "version": spec.version, "description": spec.description}
    for s in spec.stages:
        out[f"stages.{s.name}.kind"] = s.kind
        for key, value in sorted(s.params.items()):
            out[f"stages.{s.name}.params.{key}"] = value
    for i, w in enumerate(spec.wires):
        out[f"wires.{i}.from"] = w.from_
        out[f"wires.{i}.to"] = w.to
    return out
