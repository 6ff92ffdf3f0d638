"""Checkpoint files: prompt checkpoints written to a directory, so a restarted server serves from them.

Format `speclane-checkpoint` version 1 (docs/artifacts.md, "Checkpoint files"): one safetensors file a checkpoint,
named by a hash of its tokens. Tensors: `target.<layer>.0` / `target.<layer>.1` (attention: keys and values
[kv_heads, length, head_dim]; Gated DeltaNet: conv and recurrent state) and, for a model drafter, `drafter.k`,
`drafter.v`, `drafter.carry`. The safetensors metadata (strings) holds `format`, `version`, `model` and `drafter`
(identities: a file is refused unless both match the running engine's), `tokens` (JSON list) and `drafter_count`.
A file of another format, version, model or drafter is refused with a warning naming the file and what differs,
and never loaded. Not here: when checkpoints are taken or matched (checkpoints.py, the engine).
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from speclane.pipeline.runtime.checkpoints import Checkpoint
from speclane.stages.models.checkpoint import SlotSnapshot
from speclane.stages.models.drafter_window import WindowSnapshot

log = logging.getLogger("speclane.snapshots")

FORMAT, VERSION = "speclane-checkpoint", "1"


def model_identity(target) -> str:
    """What a checkpoint's state depends on: the model's shapes, weights (by artifact), dtype and weight format."""
    source = getattr(target, "artifact_dir", None)
    parts = [repr(target.cfg), str(target.dtype), type(target.weights.head).__name__,
             str(Path(source).resolve()) if source is not None else "-"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def drafter_identity(drafter) -> str:
    if drafter is None:
        return "none"
    files = getattr(drafter, "files", ())
    stamp = [f"{Path(f).resolve()}:{Path(f).stat().st_size}" for f in files if Path(f).is_file()]
    return f"{drafter.name}:" + hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]


def save(directory: Path, ck: Checkpoint, model: str, drafter: str) -> Path:
    tensors, target = {}, ck.target.flat()   # a file stands alone: the segments it shares are copied in
    for i, (a, b) in enumerate(target.layers):
        tensors[f"target.{i}.0"], tensors[f"target.{i}.1"] = a.contiguous(), b.contiguous()
    meta = {"format": FORMAT, "version": VERSION, "model": model, "drafter": drafter,
            "tokens": json.dumps(list(ck.tokens)), "layers": str(len(target.layers))}
    if ck.drafter is not None:
        k, v = ck.drafter.ring()   # the window as its ring held it: segments it shares are copied in
        tensors.update({"drafter.k": k, "drafter.v": v, "drafter.carry": ck.drafter.carry.contiguous()})
        meta["drafter_count"] = str(ck.drafter.count)
    path = directory / f"{_name(ck.tokens)}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def load(path: Path, model: str, drafter: str, device) -> Checkpoint | None:
    """The checkpoint in `path`, or None (with a warning saying why) when it is not this engine's to use."""
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            want = {"format": FORMAT, "version": VERSION, "model": model, "drafter": drafter}
            wrong = [f"{k} {meta.get(k)!r} (this engine: {v!r})" for k, v in want.items() if meta.get(k) != v]
            if wrong:
                log.warning("checkpoint file %s refused: %s", path, "; ".join(wrong))
                return None
            tokens = tuple(json.loads(meta["tokens"]))
            layers = tuple((f.get_tensor(f"target.{i}.0"), f.get_tensor(f"target.{i}.1"))
                           for i in range(int(meta["layers"])))
            snap = None
            if "drafter_count" in meta:
                snap = WindowSnapshot.from_ring(f.get_tensor("drafter.k"), f.get_tensor("drafter.v"),
                                                int(meta["drafter_count"]), f.get_tensor("drafter.carry"))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        log.warning("checkpoint file %s refused: unreadable (%s)", path, exc)
        return None
    target = SlotSnapshot.from_layers(len(tokens), layers)
    return Checkpoint(tokens, target, snap, target.own_bytes + (snap.own_bytes if snap is not None else 0))


def _name(tokens) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:24]


class CheckpointFiles:
    """A directory of checkpoint files kept in step with an engine's store: written as taken, deleted as evicted,
    read back (oldest first, so the newest survive a smaller budget) when an engine starts."""

    def __init__(self, directory: str | Path, target, drafter):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model, self.drafter = model_identity(target), drafter_identity(drafter)

    def load_into(self, store, device) -> int:
        loaded = 0
        for path in sorted(self.dir.glob("*.safetensors"), key=lambda p: p.stat().st_mtime):
            ck = load(path, self.model, self.drafter, device)
            loaded += ck is not None and store.add(ck)
        return loaded

    def write(self, ck: Checkpoint) -> None:
        save(self.dir, ck, self.model, self.drafter)

    def remove(self, ck: Checkpoint) -> None:
        (self.dir / f"{_name(ck.tokens)}.safetensors").unlink(missing_ok=True)
