"""Plan resources: what the engine loaded, handed to every stage's `prepare` at plan time, each a typed field.

The engine makes one `Resources` per engine (the target and tokenizer it loaded) and hands it to `prepare` only: no
stage or backend reads it in a round. What a stage builds from it (the draft stage's drafter) is declared in the
stage's `builds` and reaches the rounds as a round input; what a round measures (its cost figures,
`stages/contract/costs.py`) is the engine's `round_costs` round input. A new kind of shared thing is a new field.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs


class Drafter(Protocol):
    """What the engine and the stages ask of a draft backend (stages/drafters/base.py implements it)."""

    taps: tuple[int, ...]  # target layers whose outputs the drafter reads (0-based); () when it reads none
    proposes: bool  # False for a backend that never drafts

    def new_state(self, slots: int, max_len: int) -> Any: ...

    def propose(self, lanes: list, anchors: Any, limits: tuple[int, ...], state: Any) -> Any: ...

    def catch_up(self, state: Any, lanes: list | None = None) -> None: ...

    def backlog(self, state: Any, lanes: list) -> tuple[int, ...]: ...

    def observe(self, state: Any, lanes: list, batch: Any, out: Any, committed_len: Any) -> None: ...

    def snapshot(self, state: Any, slot: int, base: Any = None) -> Any: ...

    def restore(self, state: Any, lane: Any, snap: Any) -> None: ...

    def prior_acceptance(self) -> float | None: ...

    def memory_bytes(self) -> int: ...


@attrs.define(eq=False)
class Resources:
    target: Any  # speclane.stages.models.target.Target: the model every plan runs
    tokenizer: Any = None  # speclane.stages.models.tokenizer.Tokenizer
