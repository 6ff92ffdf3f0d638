"""The stage registry: stage classes keyed by `kind`, plus user stages named by import path.

A stage is a frozen attrs class whose fields are its parameters, with class-level `inputs`, `outputs` and
`mutates` (names of input ports it changes in place), and one `run(**inputs) -> dict`. Optional hooks:
`prepare(resources)` at plan time (load weights, build caches) and `new_states(resources, slots, max_len)` for
the state ports it owns. Variants are picked here by `kind`, never by `if` in the executor.
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar

import attrs

from pipeline.errors import SpecError, did_you_mean
from pipeline.ports import Port

_STAGES: dict[str, type["Stage"]] = {}
# Modules that register the built-in stage kinds; imported lazily so `pipeline` does not import `stages` eagerly.
_BUILTIN_MODULES = (
    "stages.anchor_gather", "stages.draft", "stages.target_pass", "stages.accept", "stages.kv_commit",
    "stages.recurrent_replay", "stages.stream_emit", "stages.prefill_gather",
)


class Stage:
    """Base of every stage class. Subclasses are `@attrs.frozen` and call `register`."""

    kind: ClassVar[str] = ""
    inputs: ClassVar[tuple[Port, ...]] = ()
    outputs: ClassVar[tuple[Port, ...]] = ()
    mutates: ClassVar[tuple[str, ...]] = ()

    def prepare(self, resources: dict[str, Any]) -> None:
        """Plan-time setup (loading weights, caches). Runs once per plan."""

    def run(self, **inputs: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def param_names(cls) -> list[str]:
        return [a.name for a in attrs.fields(cls) if not a.name.startswith("_")]


def register(cls: type[Stage]) -> type[Stage]:
    """Class decorator: make `cls` available to spec files under `cls.kind`."""
    assert cls.kind, f"{cls.__name__} has no kind"
    assert attrs.has(cls), f"{cls.__name__} must be an attrs class"
    assert cls.kind not in _STAGES or _STAGES[cls.kind] is cls, f"kind {cls.kind} registered twice"
    _STAGES[cls.kind] = cls
    return cls


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def known_kinds() -> list[str]:
    _load_builtins()
    return sorted(_STAGES)


def lookup(kind: str, where: str) -> type[Stage]:
    """The stage class for `kind`: a registered name, or 'package.module:Class' for a user stage."""
    if ":" in kind:
        module_name, _, attr = kind.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise SpecError(f"{where}: cannot import stage kind '{kind}': {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Stage) and attrs.has(cls)):
            raise SpecError(f"{where}: '{kind}' is not an attrs Stage class (subclass pipeline.registry.Stage)")
        return cls
    _load_builtins()
    if kind not in _STAGES:
        raise SpecError(f"{where}: unknown stage kind '{kind}'{did_you_mean(kind, _STAGES)}; "
                        f"known kinds: {', '.join(sorted(_STAGES))}")
    return _STAGES[kind]
