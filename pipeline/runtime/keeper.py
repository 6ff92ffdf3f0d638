"""When the engine's slots are checkpointed and restored (issue 17's prompt checkpoints).

Owns the rule: a lane that takes a slot starts from the longest held checkpoint its prompt begins with; a checkpoint
is taken at the end of each prompt (the chat template's assistant opener), every `every` tokens of a long prefill,
and at the end of each finished answer, each right after a commit, so no extra target pass is run. Each new
checkpoint of a lane extends the lane's previous one (the one it was restored from, or the one it took last), so
its keys (stages/models/checkpoint.py) and its model drafter's window (stages/models/drafter_window.py) share their
earlier positions, and a long conversation's checkpoints cost what each added. Not here: the store, its budgets
and its host tier (checkpoints.py), files (snapshots.py), what a snapshot holds (stages/models/checkpoint.py and
the drafters' `snapshot`).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from pipeline.runtime.checkpoints import Checkpoint, CheckpointStore
from pipeline.runtime.snapshots import CheckpointFiles
from stages.models.checkpoint import restore_slot, snapshot_slot

log = logging.getLogger("speclane.engine")

EVERY_TOKENS = 1024   # default: a checkpoint every this many tokens of a long prefill
HOST_CHECKPOINT_BYTES = 4 << 30   # default host memory for checkpoints off a GPU's full budget (0 on a CPU)


class Keeper:
    def __init__(self, engine, budget_bytes: int, every: int = EVERY_TOKENS, snapshot_dir: str | Path | None = None,
                 host_bytes: int | None = None):
        if every < 0:
            raise ValueError(f"checkpoint_every (--checkpoint-interval) must be >= 0 (0: only at prompt and answer "
                             f"ends), got {every}")
        if host_bytes is None:  # on a CPU the model's memory is host memory: no second tier
            host_bytes = 0 if torch.device(engine.target.device).type == "cpu" else HOST_CHECKPOINT_BYTES
        if host_bytes < 0:
            raise ValueError(f"checkpoint_host_bytes (--checkpoint-host-memory) must be >= 0 (0: none), got "
                             f"{host_bytes}")
        self.engine, self.every = engine, every
        self.store = CheckpointStore(budget_bytes, host_bytes) if budget_bytes > 0 else None
        self.files = None  # checkpoint files (--snapshot-dir): written as taken, read back at start
        self._last: dict[object, Checkpoint] = {}   # lane -> its latest checkpoint, which the next one extends
        if snapshot_dir is not None and self.store is not None:
            self.files = CheckpointFiles(snapshot_dir, engine.target, engine.drafter)
            self.store.on_evict = self.files.remove
            log.info("%d checkpoint(s) read from %s", self.files.load_into(self.store, engine.target.device),
                     snapshot_dir)

    def restore(self, lane) -> None:
        """Start `lane` from the longest checkpoint its prompt begins with: only the rest is prefilled."""
        found = self.store.match(lane.prompt_ids) if self.store is not None else None
        if found is None:
            return
        eng = self.engine
        restore_slot(eng.state, lane.slot, found.target)
        if eng.drafter is not None:
            eng.drafter.restore(eng.drafter_state, lane, found.drafter)
        lane.kv_len = lane.prefix_reused = found.target.length
        self._last[lane] = found

    def after_prefill(self, lane, before: int) -> None:
        """A prefill chunk took `lane` from `before` to `lane.kv_len` committed tokens."""
        if lane.finish_reason is not None:
            return
        at_end = lane.kv_len == len(lane.prompt_ids)
        if at_end or (self.every and lane.kv_len // self.every > before // self.every):
            self.keep(lane)

    def keep(self, lane) -> None:
        """Checkpoint `lane`'s slot at its committed length, when its tokens up to there are known (a run cut by a
        stop string commits keys past the text it returns: nothing is kept then)."""
        tokens = (lane.prompt_ids + lane.out_ids)[:lane.kv_len]
        if self.store is None or len(tokens) != lane.kv_len or not self.store.wants(tokens):
            return
        eng, last = self.engine, self._last.get(lane)
        target = snapshot_slot(eng.state, lane.slot, lane.kv_len, base=last.target if last is not None else None)
        drafter = None
        if eng.drafter is not None:
            drafter = eng.drafter.snapshot(eng.drafter_state, lane.slot,
                                           base=last.drafter if last is not None else None)
        ck = Checkpoint(tuple(tokens), target, drafter, target.own_bytes + getattr(drafter, "own_bytes", 0))
        if self.store.add(ck):
            self._last[lane] = ck
            if self.files is not None:
                self.files.write(ck)

    def release(self, lane) -> None:
        """`lane` left its slot: its next checkpoint, if any, has no slot history to extend."""
        self._last.pop(lane, None)
