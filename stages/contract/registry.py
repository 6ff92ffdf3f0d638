"""The stage registry: stage classes keyed by `kind`; the base class every stage derives from.

A stage is a frozen attrs class whose fields are its parameters, with class-level `inputs`, `outputs` and
`mutates` (names of input ports it changes in place), and one `run(**inputs) -> dict`. Optional hooks:
`prepare(resources)` at plan time (load weights, build caches) and `new_states(resources, slots, max_len)` for
the state ports it owns. Variants are picked by `kind`, never by `if` in the executor. Finding a kind (built-in
or a user stage named by import path) is the framework's job (`pipeline/framework/kinds.py`): this floor imports
no stage.
"""
from __future__ import annotations

from typing import Any, ClassVar

import attrs

from stages.contract.ports import Port

_STAGES: dict[str, type["Stage"]] = {}


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


def registered(kind: str) -> type[Stage] | None:
    """The stage class registered under `kind`, or None (the framework's `kinds.lookup` imports the built-ins)."""
    return _STAGES.get(kind)


def registered_kinds() -> list[str]:
    return sorted(_STAGES)
