"""Checkpoint file verification: whether a file written by snapshots.py may be used by this engine, and what is
done with one that may not.

Owns the format's name and version, the checksum (the SHA-256 of the metadata but `checksum` and of every tensor's
name, dtype, shape and bytes), the checks a file passes before any of it is used (readable, this format and
version, its checksum, then its identities, then every tensor's shape and dtype against the engine's slots:
`Layout`), `Refused` saying why one fails, and refusing it: one warning line naming it and why, and a file no
engine can use (damaged, foreign, another version) moved aside (`<name>.bad`), while one of another model or
drafter is left for its own engine. Nothing in a file may stop start-up. Not here: writing files, building a
checkpoint from a verified one, and the directory kept in step with a store (snapshots.py); when checkpoints are
taken or matched (checkpoints.py, keeper.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import attrs
import torch
from safetensors import safe_open

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models.state import AttnCache

log = logging.getLogger("speclane.snapshots")  # one logger for checkpoint files, read, written or refused

FORMAT, VERSION = "speclane-checkpoint", "2"
BAD = ".bad"  # the suffix a refused file is moved aside under


class Refused(ArtifactError):
    """Why a checkpoint file is not loaded. `damaged`: no engine can use it (moved aside); else another's."""

    def __init__(self, why: str, damaged: bool = True):
        super().__init__(" ".join(why.split()))  # one line, whatever a library's message held
        self.damaged = damaged


@attrs.frozen
class Layout:
    """The tensors a file must hold to restore into an engine's slots: per layer the (shape, dtype) of its pair,
    None in a shape standing for the checkpoint's length; the longest length; a model drafter's window
    (layers, size, kv, dtype) and carried vector (shape, dtype), None where its drafter keeps nothing in a file."""

    layers: tuple
    max_len: int
    window: tuple | None = None
    carry: tuple | None = None

    @classmethod
    def of(cls, state, drafter_state=None) -> Layout:
        """From an engine's target state (stages/models/state.py) and its drafter's state."""
        layers = []
        for c in state.layers:
            if isinstance(c, AttnCache):
                layers.append((((c.k.shape[1], None, c.k.shape[3]), c.k.dtype),) * 2)
            else:
                layers.append(
                    ((tuple(c.conv.shape[1:]), c.conv.dtype), (tuple(c.recurrent.shape[1:]), c.recurrent.dtype))
                )
        ring = getattr(drafter_state, "window", None)
        if ring is None:
            return cls(tuple(layers), state.max_len)
        carry = drafter_state.carry
        return cls(
            tuple(layers),
            state.max_len,
            (ring.k.shape[1], ring.size, ring.kv_dim, ring.k.dtype),
            (tuple(carry.shape[1:]), carry.dtype),
        )


def checksum(meta: dict[str, str], tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the metadata but `checksum` and each tensor's name, dtype, shape and bytes, in name order: a
    flipped byte, a swapped pair of layers or an edited field all change it."""
    h = hashlib.sha256(json.dumps({k: v for k, v in sorted(meta.items()) if k != "checksum"}).encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _read(path: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Metadata and tensors (in host memory) of a readable file of this format and version whose checksum holds."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise Refused(f"not a checkpoint file (format {meta.get('format')!r}, expected {FORMAT!r})")
            if meta.get("version") != VERSION:
                raise Refused(
                    f"format version {meta.get('version')!r}, this engine reads version {VERSION!r} only "
                    "(checkpoints are taken again as requests come)"
                )
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        if meta.get("checksum") != checksum(meta, tensors):
            raise Refused("damaged: its checksum does not match its contents")
        return meta, tensors
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - a file's bytes are untrusted: nothing in them may stop start-up
        raise Refused(f"unreadable ({type(exc).__name__}: {exc})") from exc


def _tokens(meta: dict[str, str]) -> tuple[int, ...]:
    try:
        tokens = json.loads(meta["tokens"])
    except (KeyError, ValueError) as exc:
        raise Refused(f"metadata 'tokens' is not a JSON list ({exc})") from exc
    if not isinstance(tokens, list) or not tokens or any(type(t) is not int or t < 0 for t in tokens):
        raise Refused("metadata 'tokens' is not a non-empty list of token ids")
    return tuple(tokens)


def _wrong(name: str, t: torch.Tensor | None, shape: tuple, dtype: torch.dtype) -> str | None:
    if t is None:
        return f"{name} is missing"
    if tuple(t.shape) != shape or t.dtype != dtype:
        return f"{name} is {str(t.dtype)[6:]} {list(t.shape)} (this engine: {str(dtype)[6:]} {list(shape)})"
    return None


def _check(meta: dict[str, str], tensors: dict[str, torch.Tensor], tokens: tuple, layout: Layout) -> None:
    """Every tensor as the engine's slots hold it, and no other (Refused naming the first few that are not)."""
    n, problems = len(tokens), []
    if meta.get("layers") != str(len(layout.layers)):
        problems.append(f"{meta.get('layers')} layers (this model: {len(layout.layers)})")
    if n > layout.max_len:
        problems.append(f"{n} tokens (this engine's max length: {layout.max_len})")
    want = {}
    for i, pair in enumerate(layout.layers):
        for j, (shape, dtype) in enumerate(pair):
            want[f"target.{i}.{j}"] = (tuple(n if d is None else d for d in shape), dtype)
    if ("drafter_count" in meta) != (layout.window is not None):
        problems.append(
            "a drafter window this engine's drafter does not keep"
            if layout.window is None
            else "no drafter window, which this engine's drafter keeps"
        )
    elif layout.window is not None:
        layers, size, kv, dtype = layout.window
        count = meta["drafter_count"]
        if not count.isdigit() or int(count) < 1:
            raise Refused(f"metadata 'drafter_count' {count!r} is not a count of positions")
        want.update({f"drafter.{x}": ((layers, min(int(count), size), kv), dtype) for x in "kv"})
        want["drafter.carry"] = layout.carry
    problems += [p for name, (shape, dtype) in want.items() if (p := _wrong(name, tensors.get(name), shape, dtype))]
    problems += [f"{name} is not a tensor of this format" for name in sorted(set(tensors) - set(want))]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise Refused("does not fit this model: " + "; ".join(problems[:3]) + more)


def verified(path: Path, model: str, drafter: str, layout: Layout | None = None) -> tuple[dict, dict, tuple]:
    """The metadata, tensors (in host memory) and tokens of `path`, verified: its checksum, its identities, then
    with `layout` every shape and dtype; `Refused` says why not."""
    meta, tensors = _read(path)
    want = {"model": model, "drafter": drafter}
    wrong = [f"{k} {meta.get(k)!r} (this engine: {v!r})" for k, v in want.items() if meta.get(k) != v]
    if wrong:
        raise Refused("; ".join(wrong), damaged=False)
    tokens = _tokens(meta)
    if layout is not None:
        _check(meta, tensors, tokens, layout)
    return meta, tensors, tokens


def refuse(path: Path, exc: Refused) -> None:
    """One warning line saying why `path` is refused; a file no engine can use is also moved aside (`<name>.bad`)."""
    if not exc.damaged:
        log.warning("checkpoint file %s refused: %s", path, exc)
        return
    aside = path.with_name(path.name + BAD)
    try:
        path.replace(aside)
    except OSError as err:
        log.warning("checkpoint file %s refused: %s; could not move it aside (%s), delete it", path, exc, err.strerror)
        return
    log.warning("checkpoint file %s refused and moved aside to %s: %s", path, aside.name, exc)
