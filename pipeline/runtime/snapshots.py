"""Checkpoint files: prompt checkpoints written to a directory, so a restarted server serves from them.

Format `speclane-checkpoint` version 2 (docs/artifacts.md, "Checkpoint files"): one safetensors file a checkpoint,
named by a hash of its tokens. Tensors: `target.<layer>.0` / `target.<layer>.1` (attention: keys and values
[kv_heads, length, head_dim]; Gated DeltaNet: conv and recurrent state) and, for a model drafter, `drafter.k`,
`drafter.v`, `drafter.carry`. The safetensors metadata (strings) holds `format`, `version`, `model` and `drafter`
(identities: a file is refused unless both match the running engine's), `tokens` (JSON list), `layers`,
`drafter_count` and `checksum`. Owns writing a file (whole or not at all), building a checkpoint from a verified
one, the identities, and the directory kept in step with an engine's store. Not here: verifying a file and
refusing one (snapshot_checks.py); when checkpoints are taken or matched (checkpoints.py, the engine).

Beside them, in `suffix-cache/`, the suffix drafter's tree over finished requests (`RequestFiles`): format
`speclane-suffix-cache` version 1, one safetensors file a request the tree holds (`<order>.safetensors`, tensor
`tokens` int32 [n]; metadata `format`, `version`, `vocab` (an identity: the artifact and its vocabulary size, so a
file outlives a change of dtype or quantization, not of tokenizer), `order` and `checksum` as above), written as
the tree takes the request in (requests that ended are taken in when an answer's checkpoint is written, else at
the drafter's next round), deleted as it drops it, and read back oldest first when an engine starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from speclane.pipeline.runtime.checkpoints import Checkpoint
from speclane.pipeline.runtime.snapshot_checks import BAD, FORMAT, VERSION, Layout, Refused, checksum, refuse, verified
from speclane.stages.models.checkpoint import SlotSnapshot
from speclane.stages.models.window_snapshot import WindowSnapshot

log = logging.getLogger("speclane.snapshots")


def model_identity(target) -> str:
    """What a checkpoint's state depends on: the model's shapes, weights (by artifact), dtype and weight format."""
    source = getattr(target, "artifact_dir", None)
    parts = [
        repr(target.cfg),
        str(target.dtype),
        type(target.weights.head).__name__,
        str(Path(source).resolve()) if source is not None else "-",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def drafter_identity(drafter) -> str:
    if drafter is None:
        return "none"
    files = getattr(drafter, "files", ())
    stamp = [f"{Path(f).resolve()}:{Path(f).stat().st_size}" for f in files if Path(f).is_file()]
    return f"{drafter.name}:" + hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]


def write(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> Path:
    """Write a file with its checksum, whole or not at all (a temporary file renamed over `path`)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={**meta, "checksum": checksum(meta, tensors)})
    tmp.replace(path)
    return path


def save(directory: Path, ck: Checkpoint, model: str, drafter: str) -> Path:
    tensors, target = {}, ck.target.flat()  # a file stands alone: the segments it shares are copied in
    for i, (a, b) in enumerate(target.layers):
        tensors[f"target.{i}.0"], tensors[f"target.{i}.1"] = a, b
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "drafter": drafter,
        "tokens": json.dumps(list(ck.tokens)),
        "layers": str(len(target.layers)),
    }
    if ck.drafter is not None:
        k, v = ck.drafter.ring()  # the window as its ring held it: segments it shares are copied in
        tensors.update({"drafter.k": k, "drafter.v": v, "drafter.carry": ck.drafter.carry})
        meta["drafter_count"] = str(ck.drafter.count)
    return write(Path(directory) / f"{_name(ck.tokens)}.safetensors", tensors, meta)


def read(path: Path, model: str, drafter: str, device, layout: Layout | None = None) -> Checkpoint:
    """The checkpoint in `path`, verified (checksum, identities, then with `layout` every shape and dtype) before any
    of it is used; `Refused` says why not."""
    meta, tensors, tokens = verified(path, model, drafter, layout)
    try:
        tensors = {k: v.to(device) for k, v in tensors.items()}
    except RuntimeError as exc:  # the device's memory, not the file
        raise Refused(f"not moved to {device} ({exc})", damaged=False) from exc
    try:
        layers = tuple((tensors[f"target.{i}.0"], tensors[f"target.{i}.1"]) for i in range(int(meta["layers"])))
        snap = None
        if "drafter_count" in meta:
            snap = WindowSnapshot.from_ring(
                tensors["drafter.k"], tensors["drafter.v"], int(meta["drafter_count"]), tensors["drafter.carry"]
            )
    except (KeyError, ValueError, RuntimeError) as exc:
        raise Refused(f"inconsistent ({type(exc).__name__}: {exc})") from exc
    target = SlotSnapshot.from_layers(len(tokens), layers)
    return Checkpoint(tokens, target, snap, target.own_bytes + (snap.own_bytes if snap is not None else 0))


def load(path: Path, model: str, drafter: str, device, layout: Layout | None = None) -> Checkpoint | None:
    """`read`, or None with a warning saying why (the file is left where it is)."""
    try:
        return read(path, model, drafter, device, layout)
    except Refused as exc:
        log.warning("checkpoint file %s refused: %s", path, exc)
        return None


def _name(tokens) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:24]


def _age(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class CheckpointFiles:
    """A directory of checkpoint files kept in step with an engine's store: written as taken, deleted as evicted,
    read back (oldest first, so the newest survive a smaller budget) when an engine starts."""

    def __init__(self, directory: str | Path, model: str, drafter: str, layout: Layout | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model, self.drafter, self.layout = model, drafter, layout
        self.requests: RequestFiles | None = None  # a suffix drafter's finished requests (`for_engine`)

    @classmethod
    def for_engine(cls, directory: str | Path, engine) -> CheckpointFiles:
        files = cls(
            directory,
            model_identity(engine.target),
            drafter_identity(engine.drafter),
            Layout.of(engine.state, engine.drafter_state),
        )
        cache = getattr(engine.drafter, "request_cache", None)  # a drafter that learns from finished requests
        if cache is not None:
            files.requests = RequestFiles(
                files.dir / REQUESTS_DIR, vocab_identity(engine.target), lambda: cache(engine.drafter_state)
            )
        return files

    def load_into(self, store, device) -> int:
        """Add every usable file's checkpoint to `store`; each refused file gets one warning line, and one no
        engine can use is moved aside. The number added."""
        loaded = 0
        for path in sorted(self.dir.glob("*.safetensors"), key=_age):
            try:
                ck = read(path, self.model, self.drafter, device, self.layout)
            except Refused as exc:
                refuse(path, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - start-up goes on without a file this code cannot read
                refuse(path, Refused(f"{type(exc).__name__}: {exc}", damaged=False))
                continue
            loaded += store.add(ck)
        if self.requests is not None:
            log.info("%d finished request(s) read into the suffix cache", self.requests.load())
        return loaded

    def write(self, ck: Checkpoint) -> None:
        save(self.dir, ck, self.model, self.drafter)
        if self.requests is not None:  # an answer's end: its request goes into the cache, and so into a file
            self.requests.cache_of()

    def remove(self, ck: Checkpoint) -> None:
        (self.dir / f"{_name(ck.tokens)}.safetensors").unlink(missing_ok=True)


REQUESTS_DIR, REQUESTS_FORMAT, REQUESTS_VERSION = "suffix-cache", "speclane-suffix-cache", "1"


def vocab_identity(target) -> str:
    """What a token id means: the artifact and its vocabulary size (not its dtype or weight format)."""
    source = getattr(target, "artifact_dir", None)
    where = str(Path(source).resolve()) if source is not None else "-"
    return hashlib.sha256(f"{where}\n{target.cfg.vocab_size}".encode()).hexdigest()[:24]


class RequestFiles:
    """A directory of one file a request held by a suffix drafter's cache of finished requests (the module's
    docstring has the format), kept in step with it through its `on_add` / `on_drop`: `load` first. `cache_of`
    returns the drafter's RequestCache (stages/drafters/suffix.py), the requests that have ended taken in first."""

    def __init__(self, directory: Path, vocab: str, cache_of: Callable):
        self.dir, self.vocab, self.cache_of = Path(directory), vocab, cache_of
        self.dir.mkdir(parents=True, exist_ok=True)
        self.paths: dict[int, Path] = {}  # id of a held request's tuple -> its file
        self.next = 0

    def read(self, path: Path) -> tuple[int, tuple[int, ...]]:
        """(order, tokens) of a verified file; `Refused` says why not."""
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                meta, tensors = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:  # noqa: BLE001 - a file's bytes are untrusted: nothing in them may stop start-up
            raise Refused(f"unreadable ({type(exc).__name__}: {exc})") from exc
        if (meta.get("format"), meta.get("version")) != (REQUESTS_FORMAT, REQUESTS_VERSION):
            raise Refused(
                f"format {meta.get('format')!r} version {meta.get('version')!r}, this engine reads "
                f"{REQUESTS_FORMAT!r} version {REQUESTS_VERSION!r} only"
            )
        if meta.get("checksum") != checksum(meta, tensors):
            raise Refused("damaged: its checksum does not match its contents")
        if meta.get("vocab") != self.vocab:
            raise Refused(f"vocab {meta.get('vocab')!r} (this engine: {self.vocab!r})", damaged=False)
        tokens, order = tensors.get("tokens"), meta.get("order", "")
        if set(tensors) != {"tokens"} or tokens.dtype != torch.int32 or tokens.dim() != 1 or not len(tokens):
            raise Refused("inconsistent: it must hold one tensor, tokens, int32 [n] with n > 0")
        if not order.isdigit() or int(tokens.min()) < 0:
            raise Refused("inconsistent: metadata 'order' is not a count, or a token id is negative")
        return int(order), tuple(tokens.tolist())

    def load(self) -> int:
        """Put every usable file's request into the cache, oldest first (refused ones get one warning line each,
        a damaged one moved aside); files of requests the budget drops are deleted. The number taken in."""
        cache, found = self.cache_of(), []
        paths = sorted(self.dir.glob("*.safetensors"))
        self.next = 1 + max((int(p.stem) for p in paths if p.stem.isdigit()), default=0)
        for path in paths:
            try:
                found.append((*self.read(path), path))
            except Refused as exc:
                _refuse_request(path, exc)
        cache.on_drop = self.drop
        for _, seq, path in sorted(found, key=lambda x: x[0]):
            cache.on_add = lambda held, path=path: self.paths.__setitem__(id(held), path)  # its file is there
            cache.add(seq)
        cache.on_add = self.add
        return len(self.paths)

    def add(self, seq: tuple) -> None:
        meta = {"format": REQUESTS_FORMAT, "version": REQUESTS_VERSION, "vocab": self.vocab, "order": str(self.next)}
        path = self.dir / f"{self.next:012d}.safetensors"
        self.next += 1
        self.paths[id(seq)] = write(path, {"tokens": torch.tensor(seq, dtype=torch.int32)}, meta)

    def drop(self, seq: tuple) -> None:
        path = self.paths.pop(id(seq), None)
        if path is not None:
            path.unlink(missing_ok=True)


def _refuse_request(path: Path, exc: Refused) -> None:
    """One warning line; a file no engine can use moved aside (`<name>.bad`), another tokenizer's left alone."""
    if exc.damaged:
        try:
            path.replace(path.with_name(path.name + BAD))
        except OSError as err:
            log.warning("suffix cache file %s refused: %s; could not move it aside (%s)", path, exc, err.strerror)
            return
        log.warning("suffix cache file %s refused and moved aside to %s: %s", path, path.name + BAD, exc)
        return
    log.warning("suffix cache file %s refused: %s", path, exc)
