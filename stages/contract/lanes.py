"""Lanes: the host-side record of each request being decoded, and the table of slots they occupy.

This is contract, not runtime: the round's stages read the lane table through a pass's `Roster` (anchor_gather,
prefill_gather) and the lanes (accept reads their seeds and sampling settings, stream_emit appends their tokens), so
it sits on the floor stages import. The engine owns the table and makes each pass's roster; the pydantic request
behind `Lane.request` belongs to the runtime above.

A lane owns a slot (an index into the target's state tensors and the drafter's window), its token history,
its anchor, its committed KV length, its sampling settings and seeded generator, its stop criteria and its
acceptance counters. During a round kv_commit advances `kv_len` (the one KV length: the state on the device keeps
none) and stream_emit appends tokens. Device state lives in stages/models.
"""

from __future__ import annotations

from typing import Any

import attrs

# Drafts a lane may take in one round, at most: the bound of every draft_tokens setting.
MAX_DRAFT_TOKENS = 7


@attrs.define(eq=False)
class Lane:
    rid: str | int
    order: int  # arrival order, for results in input order
    slot: int
    prompt_ids: list[int]
    request: Any  # speclane.pipeline.runtime.request.GenerateRequest: sampling and stop settings
    draft_tokens: int  # this lane's own cap on drafts per round (0: speculation off for it)
    eos_ids: frozenset[int]
    detok: Any  # incremental detokenizer: push(id) -> str, flush() -> str
    seed: int  # keys this lane's uniforms by output position (stages/accept.py)
    out_ids: list[int] = attrs.field(factory=list)
    kv_len: int = 0  # tokens whose keys are committed (prompt + accepted rows)
    prefix_reused: int = 0  # prompt tokens restored from a checkpoint instead of prefilled; kv_commit moves it
    # prompt positions where a prefill chunk ends so that a checkpoint can be taken there (pipeline/runtime/keeper.py)
    checkpoint_at: tuple[int, ...] = ()
    anchor: int = -1
    text: str = ""  # decoded output so far (held-back tail included)
    sent: int = 0  # characters of `text` already streamed
    finish_reason: str | None = None
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    offered_at: list[int] = attrs.field(factory=list)  # per draft position: rounds that reached it
    accepted_at: list[int] = attrs.field(factory=list)  # per draft position: rounds that accepted it
    drafted_at: list[int] = attrs.field(factory=list)  # per draft position: rounds that drafted it
    error: str | None = None
    t_submit: float = 0.0
    t_first: float = 0.0
    t_done: float = 0.0

    @property
    def tokens(self) -> list[int]:
        """Prompt plus output: what the n-gram drafter looks up."""
        return self.prompt_ids + self.out_ids

    @property
    def draft_room(self) -> int:
        """Drafts this lane can still use: a round emits at most its drafts plus one, so a draft past
        `max_tokens - 1` outputs would be verified for nothing and its keys committed past the answer's end."""
        return max(0, self.request.max_tokens - len(self.out_ids) - 1)

    @property
    def sampling(self) -> tuple[float, float, int]:
        r = self.request
        return r.temperature, r.top_p, r.top_k

    def count_round(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.drafted_at.extend([0] * (drafted - len(self.drafted_at)))
        for i in range(drafted):
            self.drafted_at[i] += 1
        while len(self.offered_at) < drafted:
            self.offered_at.append(0)
            self.accepted_at.append(0)
        for i in range(drafted):
            self.offered_at[i] += 1
            if i < accepted:
                self.accepted_at[i] += 1
            if i >= accepted:
                break

    def spec_stats(self, k: int) -> dict[str, Any]:
        return spec_stats([self], k)

    def done_event(self):
        """The lane's one final event (a DoneEvent): why it ended, its usage and speculation counts, text, tokens."""
        from speclane.stages.contract.events import DoneEvent  # torch (its ports): not at a CLI's --help

        return DoneEvent(
            self.rid,
            self.finish_reason or "cancelled",
            self.usage(),
            self.spec_stats(self.draft_tokens),
            text=self.text,
            tokens=tuple(self.out_ids),
            error=getattr(self, "error", None),
        )

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.out_ids),
            "total_tokens": len(self.prompt_ids) + len(self.out_ids),
        }


def spec_stats(lanes: list[Lane], k: int) -> dict[str, Any]:
    """Speculation metrics over lanes: rounds, drafted, accepted, tokens per round, acceptance per position."""
    rounds = sum(l.rounds for l in lanes)
    width = max([k] + [len(l.offered_at) for l in lanes])
    offered = [sum(l.offered_at[i] for l in lanes if i < len(l.offered_at)) for i in range(width)]
    accepted = [sum(l.accepted_at[i] for l in lanes if i < len(l.accepted_at)) for i in range(width)]
    # The first output token comes from prefill, not from a round.
    decoded = sum(max(0, len(l.out_ids) - 1) for l in lanes)
    return {
        "rounds": rounds,
        "drafted": sum(l.drafted for l in lanes),
        "accepted": sum(l.accepted for l in lanes),
        "tokens_per_round": round(decoded / rounds, 4) if rounds else 0.0,
        "accepted_per_position": [round(a / o, 4) if o else 0.0 for a, o in zip(accepted, offered)],
    }


@attrs.define
class LaneTable:
    """Slots and the lanes in them. A finished lane's slot goes back to the free list for reuse."""

    max_lanes: int
    active: dict[int, Lane] = attrs.field(factory=dict)  # slot -> lane
    free: list[int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.free = list(range(self.max_lanes - 1, -1, -1))

    def has_room(self) -> bool:
        return bool(self.free)

    def take_slot(self) -> int:
        return self.free.pop()

    def add(self, lane: Lane) -> None:
        assert lane.slot not in self.active
        self.active[lane.slot] = lane

    def release(self, lane: Lane) -> None:
        del self.active[lane.slot]
        self.free.append(lane.slot)

    def running(self) -> list[Lane]:
        """Lanes that decode this round (prefilled, not finished), in slot order: a stable row layout."""
        return [
            self.active[s]
            for s in sorted(self.active)
            if self.active[s].finish_reason is None and self.active[s].anchor >= 0
        ]

    def waiting_prefill(self) -> list[Lane]:
        """Lanes whose prompt is not yet all in the KV cache, oldest first."""
        pending = [l for l in self.active.values() if l.finish_reason is None and l.kv_len < len(l.prompt_ids)]
        return sorted(pending, key=lambda l: l.order)


@attrs.frozen
class Roster:
    """What one pass may take from the engine's lane table: the `lanes` round input. The engine makes one a pass;
    nothing in a round changes it. `held`: lanes the engine keeps out of this pass (their prompt ended in this
    step's prefill, so their first round is the next step's; or a failed round is being rerun one lane at a time).
    `queued`: requests waiting for a slot (what a lane's early end is worth to the draft plan, stages/draft_plan.py)."""

    table: LaneTable
    held: frozenset[Lane] = frozenset()
    queued: int = 0

    @property
    def max_lanes(self) -> int:
        return self.table.max_lanes

    def running(self) -> list[Lane]:
        """The table's decoding lanes, in slot order, but the held ones."""
        return [lane for lane in self.table.running() if lane not in self.held]

    def waiting_prefill(self) -> list[Lane]:
        """The table's lanes still reading their prompt, oldest first, but the held ones."""
        return [lane for lane in self.table.waiting_prefill() if lane not in self.held]


def _held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that could still grow into a stop string."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return hold


def push_token(lane: Lane, token: int) -> tuple[str, bool]:
    """Append one committed token to `lane`; return the text to stream with it and whether the lane is done.

    A stop token, a stop string or the max-token limit ends the lane at this token: nothing after it is
    emitted. Text that might be the start of a stop string is held back until it is decided, and flushed
    when the stream ends.
    """
    req = lane.request
    lane.out_ids.append(token)
    is_eos = token in lane.eos_ids and not req.ignore_eos
    if not is_eos:
        lane.text += lane.detok.push(token)
    if is_eos:
        lane.finish_reason = "stop"
    elif len(lane.out_ids) >= req.max_tokens:
        lane.finish_reason = "length"
    if lane.finish_reason is not None:
        lane.text += lane.detok.flush()
    if req.stop:
        start = max(0, lane.sent - max(len(s) for s in req.stop))
        cut = min((i for i in (lane.text.find(s, start) for s in req.stop) if i >= 0), default=-1)
        if cut >= 0:
            lane.text = lane.text[:cut]
            lane.finish_reason = "stop"
    if lane.finish_reason is not None:
        piece = lane.text[lane.sent :]
    else:
        piece = lane.text[lane.sent : len(lane.text) - _held_back(lane.text, req.stop)]
    lane.sent += len(piece)
    return piece, lane.finish_reason is not None
