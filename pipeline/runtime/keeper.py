"""When the engine's slots are checkpointed and restored: prompt checkpoints.

Owns the rule: a lane that takes a slot starts from the longest held checkpoint its prompt begins with; a checkpoint
is taken at the end of each prompt (the chat template's assistant opener), at the end of a chat prompt's shared
head (`marks`), at every multiple of `every` tokens of a long prompt, and at the end of each finished answer, each
right after a commit. The prefill ends a chunk at each such position (`Lane.checkpoint_at`), since a Gated DeltaNet
layer's state exists only where a pass ends: at most one pass more than the prompt needs anyway, and none where the
head is already held (the lane starts past it). Each new
checkpoint of a lane extends the lane's previous one (the one it was restored from, or the one it took last), so
its keys (stages/models/checkpoint.py) and its model drafter's window (stages/models/drafter_window.py) share their
earlier positions, and a long conversation's checkpoints cost what each added. The keeper is handed what it uses:
the slot state's handles (`SlotHandles`: the target, its state, the drafter and its state) and the chat renderer
(for a chat's head), never the engine. Not here: the store, its budgets and its host tier (checkpoints.py), files
(snapshots.py), what a snapshot holds (stages/models/checkpoint.py and the drafters' `snapshot`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from speclane.pipeline.runtime.checkpoints import MIN_TOKENS, Checkpoint, CheckpointStore
from speclane.pipeline.runtime.snapshots import CheckpointFiles
from speclane.stages.contract.errors import ArtifactError, RequestError
from speclane.stages.models.checkpoint import restore_slot, snapshot_slot

log = logging.getLogger("speclane.engine")

EVERY_TOKENS = 1024  # default: a checkpoint every this many tokens of a long prefill
HOST_CHECKPOINT_BYTES = 4 << 30  # default host memory for checkpoints off a GPU's full budget (0 on a CPU)
HEADS = 64  # system prompts whose rendered head is remembered (`Keeper.head`)
PROBES = ("A", "B")  # two user messages that differ in their first character: their renderings part where it does


def common_prefix(*seqs) -> int:
    """How many leading items all `seqs` share."""
    n = 0
    for items in zip(*seqs):
        if any(x != items[0] for x in items[1:]):
            break
        n += 1
    return n


@attrs.frozen
class SlotHandles:
    """What a checkpoint copies a slot's state between: the target (its identity names checkpoint files, its device
    places them), the target's state, and the drafter with its state (None: no drafter)."""

    target: Any
    state: Any
    drafter: Any = None
    drafter_state: Any = None


class Keeper:
    def __init__(
        self,
        handles: SlotHandles,
        render: Callable[[list[dict[str, str]]], list[int]],
        budget_bytes: int,
        every: int = EVERY_TOKENS,
        snapshot_dir: str | Path | None = None,
        host_bytes: int | None = None,
    ):
        if every < 0:
            raise ValueError(
                f"checkpoint_every (--checkpoint-interval) must be >= 0 (0: only at prompt and answer "
                f"ends), got {every}"
            )
        if host_bytes is None:  # on a CPU the model's memory is host memory: no second tier
            host_bytes = 0 if torch.device(handles.target.device).type == "cpu" else HOST_CHECKPOINT_BYTES
        if host_bytes < 0:
            raise ValueError(
                f"checkpoint_host_bytes (--checkpoint-host-memory) must be >= 0 (0: none), got {host_bytes}"
            )
        self.handles, self.render, self.every = handles, render, every
        self.store = CheckpointStore(budget_bytes, host_bytes) if budget_bytes > 0 else None
        self.files = None  # checkpoint files (--snapshot-dir): written as taken, read back at start
        self._last: dict[object, Checkpoint] = {}  # lane -> its latest checkpoint, which the next one extends
        self._asked: dict[object, int] = {}  # lane not yet prefilling -> the store's `added` when it last asked
        # leading system messages -> the tokens every such chat begins with; filled by `marks`, which a server calls
        # from its request threads (an OrderedDict's popitem is one call under the GIL, a dict's next(iter()) is not)
        self._heads: collections.OrderedDict[tuple, list[int]] = collections.OrderedDict()
        if snapshot_dir is not None and self.store is not None:
            self.files = CheckpointFiles.for_engine(snapshot_dir, handles)  # reads the four handles it names
            self.store.on_evict = self.files.remove
            log.info(
                "%d checkpoint(s) read from %s", self.files.load_into(self.store, handles.target.device), snapshot_dir
            )

    def restore(self, lane, again: bool = False) -> None:
        """Start `lane` from the longest checkpoint its prompt begins with: only the rest is prefilled. Asked when
        the lane takes its slot, and `again` before each prefill step until its own prefill starts, when checkpoints
        were added since it last asked: lanes admitted together prefill one at a time, so the second of two agents
        that share a system prompt starts from the head the first one's prefill has just kept."""
        if self.store is None:
            return
        if again:
            if lane.kv_len != lane.prefix_reused or self._asked.get(lane) == self.store.added:
                return
            found = self.store.match(lane.prompt_ids, held=lane.prefix_reused)
        else:
            found = self.store.match(lane.prompt_ids)
        self._asked[lane] = self.store.added
        if found is None:
            return
        h = self.handles
        restore_slot(h.state, lane.slot, found.target)
        if h.drafter is not None:
            h.drafter.restore(h.drafter_state, lane, found.drafter)
        lane.kv_len = lane.prefix_reused = found.target.length
        self._last[lane] = found

    def marks(self, ids: list[int], messages: list[dict[str, str]] | None = None) -> tuple[int, ...]:
        """Positions inside the prompt `ids` where its prefill stops for a checkpoint: every multiple of `every`, and
        for a chat (`messages`) the end of its head, the tokens any chat with the same system messages begins with
        (the system prompt, or the template's own default one), so conversations that share it prefill it once."""
        if self.store is None:
            return ()
        at = set(range(self.every, len(ids), self.every)) if self.every else set()
        head = self.head(ids, messages) if messages else 0
        if MIN_TOKENS <= head < len(ids):
            at.add(head)
        return tuple(sorted(at))

    def head(self, ids: list[int], messages: list[dict[str, str]]) -> int:
        """The length of `ids`' shared head: what the renderings of its leading system messages followed by two user
        messages that differ from their first character have in common, and `ids` with them. Found in tokens, so a
        template's text and the tokenizer's merges at the boundary are whatever they are; 0 when the template refuses
        the probes."""
        system = []
        for m in messages:
            if m["role"] != "system":
                break
            system.append(m)
        if len(system) == len(messages):
            return 0
        key = tuple(m["content"] for m in system)
        shared = self._heads.get(key)
        if shared is None:
            try:
                probes = [self.render(system + [{"role": "user", "content": c}]) for c in PROBES]
            except (RequestError, ArtifactError):
                return 0
            shared = probes[0][: common_prefix(*probes)]
            if len(self._heads) >= HEADS:
                self._heads.popitem(last=False)
            self._heads[key] = shared
        return common_prefix(ids, shared)

    def before_prefill(self, lanes) -> list[int]:
        """Lanes waiting to prefill ask again for a checkpoint (`restore`); their committed lengths, for after."""
        for lane in lanes:
            self.restore(lane, again=True)
        return [lane.kv_len for lane in lanes]

    def after_prefill(self, lane, before: int) -> None:
        """A prefill chunk took `lane` from `before` to `lane.kv_len` committed tokens."""
        if lane.finish_reason is not None or lane.kv_len == before:
            return
        if lane.kv_len == len(lane.prompt_ids) or lane.kv_len in lane.checkpoint_at:
            self.keep(lane)

    def keep(self, lane) -> None:
        """Checkpoint `lane`'s slot at its committed length, when its tokens up to there are known (a run cut by a
        stop string commits keys past the text it returns: nothing is kept then)."""
        tokens = (lane.prompt_ids + lane.out_ids)[: lane.kv_len]
        if self.store is None or len(tokens) != lane.kv_len or not self.store.wants(tokens):
            return
        h, last = self.handles, self._last.get(lane)
        target = snapshot_slot(h.state, lane.slot, lane.kv_len, base=last.target if last is not None else None)
        drafter = None
        if h.drafter is not None:
            drafter = h.drafter.snapshot(h.drafter_state, lane.slot, base=last.drafter if last is not None else None)
        ck = Checkpoint(tuple(tokens), target, drafter, target.own_bytes + getattr(drafter, "own_bytes", 0))
        if self.store.add(ck):
            self._last[lane] = ck
            if self.files is not None:
                self.files.write(ck)

    def release(self, lane) -> None:
        """`lane` left its slot: its next checkpoint, if any, has no slot history to extend."""
        self._last.pop(lane, None)
        self._asked.pop(lane, None)
