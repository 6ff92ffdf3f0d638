"""The named error hierarchy. Every message names the file, stage, port or field at fault and says what to do.

Validation collects every problem and raises once (`problems` holds them all); `assert` is for internal
invariants only, never for user input.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class SpeclaneError(Exception):
    """Base of every error speclane raises on purpose."""

    def __init__(self, message: str, problems: Iterable[str] = ()):
        self.problems = list(problems) or [message]
        super().__init__(message)


class SpecError(SpeclaneError):
    """A spec file (or a spec edit) is invalid: unknown kind, cycle, missing input, two producers, bad param."""


class ContractError(SpeclaneError):
    """A port's value breaks its declared contract (dtype, dims, device), or two ports disagree."""


class ArtifactError(SpeclaneError):
    """A model artifact cannot be used: missing file, unknown model_type, missing tensor, wrong shape."""


class RequestError(SpeclaneError):
    """A request is invalid; `field` names the offending field so the reply can say it."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_request"):
        self.field = field
        self.code = code
        super().__init__(message)


class StageFailure(SpeclaneError):
    """A stage raised while running a round. `state_touched`: a stage that mutates state had already run (or was
    the one that failed), so the round cannot simply be run again. `lanes`: the round's lanes (its `lane_view`) where
    a stage had laid them out, else None."""

    def __init__(self, stage: str, cause: BaseException, state_touched: bool, lanes: list | None = None):
        self.stage, self.cause, self.state_touched, self.lanes = stage, cause, state_touched, lanes
        super().__init__(f"stage '{stage}' failed: {type(cause).__name__}: {cause}")


class ConfigError(SpeclaneError):
    """A command-line or engine setting is out of range or inconsistent."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' (did you mean "x"?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


def raise_all(kind: type[SpeclaneError], problems: list[str], header: str) -> None:
    """Raise `kind` listing every problem at once, if there are any."""
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise kind(f"{header}: {len(problems)} problem(s)\n{lines}", problems)
