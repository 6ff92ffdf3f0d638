"""Finding a stage class by `kind`: a built-in kind (the modules `stages.BUILTIN_STAGES` names register
themselves on import), or a user stage named by import path, 'package.module:Class'.

Not here: the Stage base class and `register` (the contract floor, `stages/contract/registry.py`).
"""

from __future__ import annotations

import functools
import importlib

import attrs

from speclane import stages
from speclane.stages.contract.errors import SpecError, did_you_mean
from speclane.stages.contract.registry import Stage, registered, registered_kinds


@functools.cache  # once imported, a lookup is a dict read (rounds make them)
def _load_builtins() -> None:
    for module in stages.BUILTIN_STAGES:
        importlib.import_module(module)


def known_kinds() -> list[str]:
    _load_builtins()
    return registered_kinds()


def lookup(kind: str, where: str) -> type[Stage]:
    """The stage class for `kind`: a registered name, or 'package.module:Class' for a user stage."""
    if ":" in kind:
        module_name, _, attr = kind.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise SpecError(f"{where}: cannot import stage kind '{kind}': {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Stage) and attrs.has(cls)):
            raise SpecError(
                f"{where}: '{kind}' is not an attrs Stage class (subclass speclane.stages.contract.registry.Stage)"
            )
        return cls
    _load_builtins()
    cls = registered(kind)
    if cls is None:
        known = registered_kinds()
        raise SpecError(
            f"{where}: unknown stage kind '{kind}'{did_you_mean(kind, known)}; known kinds: {', '.join(known)}"
        )
    return cls


def find(kind: str) -> type[Stage] | None:
    """The stage class for `kind`, or None when there is none: for callers that only adjust a spec and leave
    reporting a bad kind (with every other problem) to `graph.build_graph`."""
    try:
        return lookup(kind, kind)
    except SpecError:
        return None
