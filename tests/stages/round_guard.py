"""A guard around every stage of a plan, for the round-contract tests: a stage reaches only what it declares.

`guarded_plan` stands in for the executor's `plan` (the engine's planning calls it). While the plan is made, each
stage's `prepare` sees the engine's `Resources` through a `Gate` that refuses writes, and the target's own fields
must come out of planning unchanged; after planning the gate is shut, so a stage that kept it and reads it in a
round fails. Each planned stage must be made of its parameters only (no field past them: what it keeps is its
declared `state`), and runs behind `Guarded`: `run` gets a `Confined` self (its parameters, its class's declarations
and methods, nothing else), every input it does not declare in `mutates` or `touches` must come out unchanged (host
records field by field, tensors by version and bytes, what a handle holds directly), and it may return only its
declared outputs. A breach raises `Undeclared`, an AssertionError naming the stage and what it reached.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import types
from typing import Any

import attrs
import torch

from speclane.pipeline.framework import executor

# Opaque backend handles: what they hold is the backend's own; a stage may not change their fields (depth 1).
HANDLES = ("target", "drafter")
PRIMITIVES = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device)


class Undeclared(AssertionError):
    """A stage read or wrote something its declarations do not name."""


def digest(t: torch.Tensor) -> bytes:
    """A hash of a tensor's bytes: the C kernels write through pointers, which torch's version counter never sees."""
    if t.device.type == "meta":
        return b""
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))  # stride 1, even for one element
    raw = flat.view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(raw, digest_size=16).digest()


def footprint(value: Any, depth: int = 5, seen: set | None = None) -> Any:
    """A comparable picture of `value` and what it holds, `depth` levels down: equal before and after a call
    unless the call changed it in place. Tensors by identity, in-place version and bytes; objects by identity and
    fields."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version, digest(value))
    if isinstance(value, PRIMITIVES):
        return value
    seen = set() if seen is None else seen
    if depth == 0 or id(value) in seen or inspect.isroutine(value) or isinstance(value, type):
        return ("ref", id(value))
    seen.add(id(value))

    def down(v):
        return footprint(v, depth - 1, seen)

    if isinstance(value, (list, tuple, collections.deque)):
        return (type(value).__name__, tuple(down(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(v if isinstance(v, PRIMITIVES) else id(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k if isinstance(k, PRIMITIVES) else id(k), down(v)) for k, v in value.items()))
    if attrs.has(type(value)):
        fields = {f.name: getattr(value, f.name) for f in attrs.fields(type(value))}
    elif hasattr(value, "__dict__"):
        fields = dict(vars(value))
    else:
        return ("ref", id(value))
    return (type(value).__name__, id(value), tuple((k, down(v)) for k, v in sorted(fields.items())))


class Gate:
    """`Resources` as a stage's `prepare` sees them: readable while the plan is made, never written, shut after."""

    def __init__(self, resources):
        object.__setattr__(self, "_resources", resources)
        object.__setattr__(self, "_open", True)

    def __getattr__(self, name):
        if not object.__getattribute__(self, "_open"):
            raise Undeclared(f"Resources.{name} read after planning: a round's values arrive on ports")
        return getattr(object.__getattribute__(self, "_resources"), name)

    def __setattr__(self, name, value):
        raise Undeclared(f"a stage's prepare wrote Resources.{name}: it builds what it declares in `builds`")

    def shut(self) -> None:
        object.__setattr__(self, "_open", False)


class Confined:
    """A stage's `self` while it runs: its parameters and its class's declarations and methods (bound to this
    confined self, so they are confined too); any other attribute, and every write, raises `Undeclared`."""

    def __init__(self, stage, name: str):
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr):
        stage, name = object.__getattribute__(self, "_stage"), object.__getattribute__(self, "_name")
        cls = type(stage)
        if attr in cls.param_names():
            return getattr(stage, attr)
        try:
            found = inspect.getattr_static(cls, attr)
        except AttributeError:
            found = None
        if found is None or isinstance(found, types.MemberDescriptorType):  # an attrs slot that is no parameter
            raise Undeclared(f"stage '{name}' read self.{attr}: neither a parameter nor a class declaration")
        if isinstance(found, (staticmethod, classmethod)):
            return getattr(cls, attr)
        if isinstance(found, property):
            return found.fget(self)
        if inspect.isfunction(found):
            return types.MethodType(found, self)
        return found

    def __setattr__(self, attr, value):
        raise Undeclared(f"stage '{object.__getattribute__(self, '_name')}' wrote self.{attr}")


def check_fields(stage, name: str) -> None:
    """A stage is made of its parameters: no field the spec cannot set (kept state is the declared `state`)."""
    extra = [f.name for f in attrs.fields(type(stage)) if not f.init or f.name not in type(stage).param_names()]
    if extra:
        raise Undeclared(f"stage '{name}' has fields past its parameters: {extra}; declare a `state` instead")


class Guarded:
    """A planned stage behind the checks of this module; the executor sees its declarations unchanged."""

    def __init__(self, stage, name: str, may_change: tuple[str, ...] = ()):
        self.stage, self.name = stage, name
        for decl in ("inputs", "outputs", "mutates", "touches", "state", "builds", "kind"):
            setattr(self, decl, getattr(stage, decl))
        self.changing = {*stage.mutates, *stage.touches, *may_change}

    def run(self, **kwargs):
        watched = {
            p.name: footprint(kwargs.get(p.name), 1 if p.name in HANDLES else 5)
            for p in self.stage.inputs
            if p.name not in self.changing
        }
        own = footprint(self.stage)
        out = type(self.stage).run(Confined(self.stage, self.name), **kwargs)
        extra = sorted(set(out) - {p.name for p in self.stage.outputs})
        if extra:
            raise Undeclared(f"stage '{self.name}' returned undeclared outputs {extra}")
        for port, before in watched.items():
            if footprint(kwargs.get(port), 1 if port in HANDLES else 5) != before:
                raise Undeclared(
                    f"stage '{self.name}' changed its input '{port}' in place; it declares neither "
                    f"`mutates` nor `touches` for it"
                )
        if footprint(self.stage) != own:
            raise Undeclared(f"stage '{self.name}' changed its own fields while it ran")
        return out


def guarded_plan(may_change: dict[str, tuple[str, ...]] | None = None):
    """A stand-in for `executor.plan` that plans behind a `Gate` and guards every stage (`may_change`: stage kind
    -> inputs it may change without declaring them, each a known gap named where it is passed)."""
    may_change = may_change or {}

    def plan(graph, resources=None, check_contracts=False):
        target = resources.target
        before = footprint(target, 1)
        gate = Gate(resources)
        made = executor.plan(graph, gate, check_contracts)
        gate.shut()
        if footprint(target, 1) != before:
            raise Undeclared("planning changed the target's fields: a stage's prepare reaches nothing it is not handed")
        for step in made.steps:
            check_fields(step.stage, step.name)
        made.steps = tuple(
            attrs.evolve(s, stage=Guarded(s.stage, s.name, may_change.get(s.stage.kind, ()))) for s in made.steps
        )
        return made

    return plan


def reaches(root: Any, cls: type, depth: int = 4) -> bool:
    """Whether an instance of `cls` is reachable from `root` through fields, containers, bound methods' selves and
    closures, `depth` levels down."""
    todo, seen = [(root, depth)], set()
    while todo:
        value, left = todo.pop()
        if isinstance(value, cls):
            return True
        if left == 0 or id(value) in seen or isinstance(value, PRIMITIVES + (torch.Tensor,)):
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, (list, tuple, set, frozenset, collections.deque)):
            children = list(value)
        elif isinstance(value, types.MethodType):
            children = [value.__self__]
        elif isinstance(value, types.FunctionType):
            children = [c.cell_contents for c in value.__closure__ or ()]
        elif attrs.has(type(value)):
            children = [getattr(value, f.name) for f in attrs.fields(type(value))]
        else:
            children = list(vars(value).values()) if hasattr(value, "__dict__") else []
        todo.extend((c, left - 1) for c in children)
    return False
