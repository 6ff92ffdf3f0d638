"""Plan resources: what a plan's stages share beyond the ports of a round, each a declared, typed field.

The engine makes one `Resources` per engine (the models it loaded) and hands it to every stage's `prepare`; the fields
stages fill are `drafter`, which the draft stage builds and the engine then hands to every round as the `drafter` input
port, and `round_costs`, which anchor_gather's measured plan reads (the pass-cost probe it runs, the drafter times the
draft stage records). Nothing travels here by an ad-hoc key: a new kind of shared thing is a new field.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from speclane.stages.contract.costs import RoundCosts


class Drafter(Protocol):
    """What the engine and the stages ask of a draft backend (stages/drafters/base.py implements it)."""

    taps: tuple[int, ...]  # target layers whose outputs the drafter reads (0-based); () when it reads none
    proposes: bool  # False for a backend that never drafts

    def new_state(self, slots: int, max_len: int) -> Any: ...

    def propose(self, lanes: list, anchors: Any, limits: tuple[int, ...], state: Any) -> Any: ...

    def observe(self, state: Any, lanes: list, batch: Any, out: Any, committed_len: Any) -> None: ...

    def snapshot(self, state: Any, slot: int) -> Any: ...

    def restore(self, state: Any, lane: Any, snap: Any) -> None: ...

    def memory_bytes(self) -> int: ...


@attrs.define(eq=False)
class Resources:
    target: Any  # speclane.stages.models.target.Target: the model every plan runs
    tokenizer: Any = None  # speclane.stages.models.tokenizer.Tokenizer
    drafter: Drafter | None = None  # built by the draft stage's `prepare`; None while no plan drafts
    # What a round costs here: the pass-cost probe (filled by anchor_gather's measured plan) and the drafter's
    # time per round (recorded by the draft stage).
    round_costs: RoundCosts = attrs.field(factory=RoundCosts)
    # The `oracle` control's continuations, by request id (key None: one for every request); tests and bench set it.
    oracle: dict = attrs.field(factory=dict)
