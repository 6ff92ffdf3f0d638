"""The --spec-* knobs and placement, applied to a spec by what its stage kinds declare.

A stage class lists the knobs it takes (`Stage.knobs`: knob -> the parameter it sets) and what a knob left at 0
means given its own parameters (`Stage.knob_defaults`; the draft stage says what `draft_rows` 0 is for its
backend). A stage with a `device` parameter is placed on the model's device unless the spec says otherwise.
Nothing here names a stage kind, a knob's meaning or a drafter: the kinds declare them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from speclane.pipeline.framework.introspect import param_defaults
from speclane.pipeline.framework.kinds import find
from speclane.pipeline.framework.spec import SpecFile, with_params


def resolve_knobs(spec: SpecFile, knobs: Mapping[str, Any]) -> SpecFile:
    """`spec` with each set knob (not None) written into the parameter its stage declares; a knob set to 0 takes
    the default a stage declares for it (after the other knobs), else stays 0."""
    overrides: dict[str, dict[str, Any]] = {}
    deferred: list[tuple[str, str, str]] = []  # (stage, param, knob) whose knob is 0: "the default"
    for s in spec.stages:
        cls = find(s.kind)
        for knob, param in cls.knobs.items() if cls is not None else ():
            value = knobs.get(knob)
            if value is None:
                continue
            if value == 0 and not isinstance(value, bool):
                deferred.append((s.name, param, knob))
            elif s.params.get(param) != value:
                overrides.setdefault(s.name, {})[param] = value
    if deferred:
        defaults: dict[str, Any] = {}
        for s in spec.stages:
            cls = find(s.kind)
            if cls is not None:
                defaults.update(cls.knob_defaults({**s.params, **overrides.get(s.name, {})}))
        for name, param, knob in deferred:
            overrides.setdefault(name, {})[param] = defaults.get(knob, 0)
    return with_params(spec, overrides) if overrides else spec


def knob_value(spec: SpecFile, knob: str) -> Any:
    """What `spec` sets the knob to: the parameter of the first stage that takes it (its class default when the
    spec leaves it out), or None when no stage takes it."""
    for s in spec.stages:
        cls = find(s.kind)
        if cls is not None and knob in cls.knobs:
            param = cls.knobs[knob]
            return s.params[param] if param in s.params else param_defaults(cls).get(param)
    return None


def place(spec: SpecFile, device: str) -> SpecFile:
    """`spec` with every stage that takes a `device` parameter, and does not set it, placed on `device`."""
    overrides = {}
    for s in spec.stages:
        cls = find(s.kind)
        if cls is not None and "device" in cls.param_names() and "device" not in s.params:
            overrides[s.name] = {"device": device}
    return with_params(spec, overrides) if overrides else spec
