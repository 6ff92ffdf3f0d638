"""The stage registry: stage classes keyed by `kind`; the base class every stage derives from.

A stage is a frozen attrs class whose fields are its parameters, with class-level declarations of everything it
reads or changes: `inputs` and `outputs` (typed ports), `mutates` (input ports it changes in place, which a failed
round cannot take back), `touches` (input ports it changes in place in a way a rerun of the round tolerates:
measurements added to a record, a backend's state brought up to date, scratch past what is committed), `state`
(the record class of what it keeps across rounds, made once a plan by `new_state` and handed to `run` as `state`)
and `builds` (handles its `prepare` makes at plan time, which the engine hands to every round as the round inputs
of the same names). One `run(**inputs) -> dict` a round. The --spec-* knobs it takes: `knobs`, `knob_defaults`.
Variants are picked by `kind`, never by `if` in the executor. Finding a kind (built-in or a user stage named by
import path) is the framework's job (`pipeline/framework/kinds.py`): this floor imports no stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from speclane.stages.contract.ports import Port
from speclane.stages.contract.resources import Resources

_STAGES: dict[str, type["Stage"]] = {}

STATE = "state"  # the keyword `run` takes the stage's kept state under; no port may take this name


class Stage:
    """Base of every stage class. Subclasses are `@attrs.frozen` and call `register`."""

    kind: ClassVar[str] = ""
    inputs: ClassVar[tuple[Port, ...]] = ()
    outputs: ClassVar[tuple[Port, ...]] = ()
    mutates: ClassVar[tuple[str, ...]] = ()
    touches: ClassVar[tuple[str, ...]] = ()
    state: ClassVar[type | None] = None
    builds: ClassVar[tuple[Port, ...]] = ()
    # The --spec-* knobs this kind takes: knob name (a field of the runtime's SpecKnobs) -> the parameter it sets.
    knobs: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def knob_defaults(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """What a knob set to 0 ("the default") means, given this stage's parameters after the other knobs."""
        return {}

    def prepare(self, resources: Resources) -> Mapping[str, Any] | None:
        """Plan-time setup, once a plan: reads `resources` (the models the engine loaded) and returns the handles
        named in `builds`, by name (None: it builds none). It changes nothing it is handed and keeps nothing: what
        a round needs arrives on a port, what the stage keeps across rounds is its declared `state`."""
        return None

    def new_state(self) -> Any:
        """A fresh record of what this stage keeps across rounds (an instance of `state`), or None."""
        return None if self.state is None else self.state()

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
