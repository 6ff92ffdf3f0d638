"""The draft backend interface and the result of a proposal."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import torch

from speclane.stages.contract.resources import Resources


@attrs.frozen
class Proposal:
    drafts: torch.Tensor  # [lanes, k] int64, -1 past each lane's draft_len
    draft_len: tuple[int, ...]  # host: drafts of each lane (the row layout depends on it)
    q: torch.Tensor | None = None  # [lanes, k, vocab] float32 the drafts were sampled from; None = deterministic


class DraftBackend:
    """Base of draft backends. `options` are the draft stage's `options` table, checked by the backend."""

    name: ClassVar[str] = ""
    default_rows: ClassVar[int] = 0  # the row budget that --spec-draft-rows 0 means; 0 = no cap
    proposes: ClassVar[bool] = True  # False: never drafts (`none`), so no draft plan is worth measuring
    taps: tuple[int, ...] = ()  # target layers whose outputs the backend reads (0-based)
    option_names: ClassVar[tuple[str, ...]] = ()  # the keys the draft stage's `options` table may hold

    def __init__(self, options: dict[str, Any], head: str, resources: Resources):
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            allowed = ", ".join(self.option_names) or "none"
            raise ValueError(f"backend '{self.name}' options are: {allowed}; not {unknown}")
        self.options = dict(options)
        self.head = head

    def new_state(self, slots: int, max_len: int) -> Any:
        """Per-slot drafter state (window, index); None when the backend keeps none."""
        return None

    def propose(self, lanes: list, anchors: torch.Tensor, limits: tuple[int, ...], state: Any) -> Proposal:
        raise NotImplementedError

    def catch_up(self, state: Any, lanes: list | None = None) -> None:
        """Bring `lanes`' state (None: every lane's) up to the committed rows observed so far (a model drafter's
        queued window rows), as their next proposal would first: the draft stage does it before it times the
        proposal, and times it apart (per row of `backlog`), so the measured draft plan weighs the two apart."""

    def backlog(self, state: Any, lanes: list) -> tuple[int, ...]:
        """Observed rows each lane's `catch_up` would take in now (0 for a backend whose state needs none): what a
        lane that starts drafting pays once, which the measured draft plan weighs (stages/draft_plan.py)."""
        return (0,) * len(lanes)

    def observe(self, state: Any, lanes: list, batch: Any, out: Any, committed_len: torch.Tensor) -> None:
        """Take in the first `committed_len[lane]` rows of each lane (device [lanes]; every row of a prefill chunk,
        the committed run of a verify round) so the next proposal can read them: the drafter_commit stage."""

    def snapshot(self, state: Any, slot: int, base: Any = None) -> Any:
        """What a prompt checkpoint keeps of the slot's drafter state (None: nothing, e.g. state rebuilt from the
        lane's tokens, as the n-gram index is). `base`: the same slot history's previous snapshot, which the new
        one may share its earlier part with. A snapshot may have `segments` (shared parts, each with `nbytes`,
        counted once by the checkpoint store) and `own_bytes` (the rest)."""
        return None

    def restore(self, state: Any, lane: Any, snap: Any) -> None:
        """Put a `snapshot` back into `lane`'s slot, owned by `lane`."""

    def forget(self, state: Any) -> None:
        """Drop what the backend learnt from earlier requests (suffix: its tree over finished answers and the trees
        kept for a next turn), so the next request starts as on a fresh server: a benchmark that runs the same
        prompt twice must not measure a drafter that has seen the answer. Running lanes are untouched."""

    def memory_bytes(self) -> int:
        """Bytes of weights this backend holds beyond the target's (0 for model-free backends)."""
        return 0

    def state_stats(self, state: Any) -> dict[str, int] | None:
        """What its state holds that grows with use, for the server's `stats` (None: nothing worth reporting)."""
        return None

    def chances(self, state: Any, lanes: list, caps: tuple[int, ...]) -> tuple[tuple[float, ...] | None, ...] | None:
        """Per lane, the chance the target accepts each draft the backend would propose at most `caps[i]` of, given
        the drafts before it were accepted (no more than it has drafts for: none, it would propose nothing), which
        the measured draft plan weighs the lane's drafts by (stages/draft_plan.py). None, for a lane or for all: the
        plan's acceptance learnt from the lane's rounds."""
        return None

    def draft_cap(self, costs=None) -> int:
        """The most drafts a lane may take a round where the backend's own options allow more than the draft stage's
        `draft_tokens` (0: that setting is the cap); the row budget still caps each round (stages/anchor_gather.py).
        `costs`: the engine's RoundCosts, where a backend's cap follows this machine's pass cost (suffix's)."""
        return 0

    def prior_acceptance(self) -> float | None:
        """The chance a first draft is accepted that the measured draft plan assumes before any evidence (None:
        the plan's own default, stages/draft_plan.py)."""
        return None


def number_option(backend: str, options: dict, name: str, default, kind, ok, need: str):
    """A backend's numeric option (`kind`: int or float; a bool is neither), `default` where unset; where it is not a
    number of that kind or not `ok`, a ValueError naming the backend, the option and what it must be (`need`)."""
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ValueError(f"backend '{backend}' option {name} must be {need}, got {value!r}")
    value = kind(value)
    if not ok(value):
        raise ValueError(f"backend '{backend}' option {name} must be {need}, got {value!r}")
    return value


def empty_proposal(lanes: int, device: torch.device | str = "cpu") -> Proposal:
    return Proposal(drafts=torch.full((lanes, 0), -1, dtype=torch.int64, device=device), draft_len=(0,) * lanes)


def proposal_from_lists(rows: list[list[int]], limits: tuple[int, ...], device) -> Proposal:
    """A proposal from host lists of draft tokens (each at most its lane's limit), padded with -1."""
    drafts = torch.full((len(rows), max(limits, default=0)), -1, dtype=torch.int64)
    for i, found in enumerate(rows):
        if found:
            drafts[i, : len(found)] = torch.tensor(found, dtype=torch.int64)
    return Proposal(drafts=drafts.to(device), draft_len=tuple(len(r) for r in rows))
