"""Checkpoint files are verified before use: each kind of damage is refused with one warning line and the file
moved aside, never loaded and never raised; a file of another model is refused and left for it; a sound file
restores exactly. On hand-made slot states (two attention layers around a Gated DeltaNet one, a drafter window of
8), so no model loads."""

from __future__ import annotations

import json
import logging
import types

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from speclane.pipeline.runtime.checkpoints import Checkpoint, CheckpointStore
from speclane.pipeline.runtime.snapshot_checks import BAD, Layout, checksum
from speclane.pipeline.runtime.snapshots import CheckpointFiles, read, write
from speclane.stages.models.checkpoint import restore_slot, snapshot_slot
from speclane.stages.models.drafter_window import Window
from speclane.stages.models.state import AttnCache, GdnCache, TargetState
from speclane.stages.models.window_snapshot import WindowSnapshot

MAX_LEN, LENGTH, WINDOW = 64, 20, 8
TOKENS = tuple(range(100, 100 + LENGTH))


def _state(seed: int) -> TargetState:
    g = torch.Generator().manual_seed(seed)

    def attention():
        return AttnCache(torch.randn(1, 2, MAX_LEN, 4, generator=g), torch.randn(1, 2, MAX_LEN, 4, generator=g))

    gdn = GdnCache(torch.randn(1, 6, 3, generator=g), torch.randn(1, 2, 4, 4, generator=g))
    return TargetState((attention(), gdn, attention()), MAX_LEN)


def _drafter_state():
    return types.SimpleNamespace(window=Window(1, WINDOW, 2, 4, torch.float32, "cpu"), carry=torch.zeros(1, 5))


def _checkpoint(state: TargetState) -> Checkpoint:
    g = torch.Generator().manual_seed(7)
    window = WindowSnapshot.from_ring(
        torch.randn(2, WINDOW, 4, generator=g),
        torch.randn(2, WINDOW, 4, generator=g),
        LENGTH,
        torch.randn(5, generator=g),
    )
    return Checkpoint(TOKENS, snapshot_slot(state, 0, LENGTH), window)


@pytest.fixture
def sound(tmp_path):
    """(files, path) of one sound file written by the engine's own path."""
    files = CheckpointFiles(tmp_path, "model-a", "drafter-a", Layout.of(_state(0), _drafter_state()))
    files.write(_checkpoint(_state(0)))
    (path,) = tmp_path.glob("*.safetensors")
    return files, path


def _parts(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: v for k, v in f.metadata().items() if k != "checksum"}, {k: f.get_tensor(k) for k in f.keys()}


def _load(files) -> tuple[int, CheckpointStore]:
    store = CheckpointStore(1 << 30)
    return files.load_into(store, "cpu"), store


def test_a_sound_file_restores_the_slot_exactly(sound):
    files, path = sound
    loaded, store = _load(files)
    assert loaded == 1 and path.exists()
    back = store.match(list(TOKENS) + [1])
    fresh = _state(1)
    restore_slot(fresh, 0, back.target)
    for want, got in zip(snapshot_slot(_state(0), 0, LENGTH).layers, snapshot_slot(fresh, 0, LENGTH).layers):
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert back.drafter.count == LENGTH
    assert torch.equal(back.drafter.ring()[0], _checkpoint(_state(0)).drafter.ring()[0])


def _flip(at, bits=0xFF):
    def damage(path):
        data = bytearray(path.read_bytes())
        data[at(data)] ^= bits
        path.write_bytes(bytes(data))

    return damage


def _rewrite(change, seal=True):
    """Rewrite the file with `change(meta, tensors)` applied: sealed with a fresh checksum (a well-formed file), or
    keeping the old one (what a tool that edits tensors in place leaves)."""

    def damage(path):
        meta, tensors = _parts(path)
        old = {**meta, "checksum": checksum(meta, tensors)}
        change(meta, tensors)
        if seal:
            write(path, tensors, meta)
        else:
            save_file(tensors, str(path), metadata={**meta, "checksum": old["checksum"]})

    return damage


def _swap_layers(meta, tensors):
    for j in "01":  # layers 0 and 2 are both attention: the same shapes
        tensors[f"target.0.{j}"], tensors[f"target.2.{j}"] = tensors[f"target.2.{j}"], tensors[f"target.0.{j}"]


def _drop_last_layer(meta, tensors):
    del tensors["target.2.0"], tensors["target.2.1"]
    meta["layers"] = "2"


def _old_version(path):
    meta, tensors = _parts(path)
    save_file(tensors, str(path), metadata={**meta, "version": "1"})  # version 1 had no checksum


# (case, damage, what the warning says). One defect each; every one moved aside.
DAMAGE = [
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "unreadable"),
    ("zeroed", lambda p: p.write_bytes(bytes(p.stat().st_size)), "unreadable"),
    ("empty", lambda p: p.write_bytes(b""), "unreadable"),
    ("foreign: not safetensors", lambda p: p.write_text("model weights, honest"), "unreadable"),
    (
        "foreign: another format",
        lambda p: save_file({"weight": torch.ones(3)}, str(p), metadata={"format": "pt"}),
        "not a checkpoint file (format 'pt'",
    ),
    ("flipped data byte", _flip(lambda data: len(data) - 3), "checksum does not match"),
    # one bit of the model's identity: still valid JSON, the header reads, the identity is another's
    ("flipped header byte", _flip(lambda data: data.index(b'"model-a"') + 3, bits=0x01), "checksum does not match"),
    ("swapped layers", _rewrite(_swap_layers, seal=False), "checksum does not match"),
    (
        "wrong shapes",
        _rewrite(lambda m, t: t.update({"target.0.0": torch.zeros(2, LENGTH, 8)})),
        "target.0.0 is float32 [2, 20, 8] (this engine: float32 [2, 20, 4])",
    ),
    (
        "wrong dtype",
        _rewrite(lambda m, t: t.update({"target.1.1": t["target.1.1"].half()})),
        "target.1.1 is float16 [2, 4, 4] (this engine: float32 [2, 4, 4])",
    ),
    ("wrong layer count", _rewrite(_drop_last_layer), "2 layers (this model: 3)"),
    (
        "window of another size",
        _rewrite(lambda m, t: t.update({"drafter.k": t["drafter.k"][:, :4]})),
        "drafter.k is float32 [2, 4, 4] (this engine: float32 [2, 8, 4])",
    ),
    (
        "longer than the engine",
        _rewrite(lambda m, t: m.update({"tokens": json.dumps(list(range(MAX_LEN + 1)))})),
        "65 tokens (this engine's max length: 64)",
    ),
    ("tokens not ids", _rewrite(lambda m, t: m.update({"tokens": '["a"]'})), "not a non-empty list of token ids"),
    ("old version", _old_version, "format version '1', this engine reads version '2' only"),
]


@pytest.mark.parametrize("case, damage, says", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_a_damaged_file_is_moved_aside_with_one_warning(sound, caplog, case, damage, says):
    files, path = sound
    damage(path)
    with caplog.at_level(logging.WARNING, logger="speclane.snapshots"):
        loaded, store = _load(files)
    assert (loaded, store.stats()["entries"]) == (0, 0), case
    assert not path.exists() and path.with_name(path.name + BAD).exists(), case
    [line] = [r.getMessage() for r in caplog.records]
    assert f"{path} refused and moved aside to {path.name}{BAD}: " in line and says in line, line
    assert "\n" not in line
    again, _ = _load(files)  # moved aside: never read again, never warned about again
    assert again == 0 and len(caplog.records) == 1


@pytest.mark.parametrize("who", ["model", "drafter"])
def test_a_file_of_another_model_or_drafter_is_refused_and_left_in_place(sound, caplog, who):
    files, path = sound
    setattr(files, who, "someone-else")
    with caplog.at_level(logging.WARNING, logger="speclane.snapshots"):
        assert _load(files)[0] == 0
    [line] = [r.getMessage() for r in caplog.records]
    assert f"{path} refused: {who} '{who}-a' (this engine: 'someone-else')" in line
    assert path.exists()


def test_a_file_without_the_drafters_window_does_not_fit_a_drafter_that_keeps_one(tmp_path):
    plain = CheckpointFiles(tmp_path, "model-a", "none", Layout.of(_state(0)))
    ck = _checkpoint(_state(0))
    plain.write(Checkpoint(ck.tokens, ck.target))
    (path,) = tmp_path.glob("*.safetensors")
    with pytest.raises(Exception, match="no drafter window, which this engine's drafter keeps"):
        read(path, "model-a", "none", "cpu", Layout.of(_state(0), _drafter_state()))
    assert _load(plain)[0] == 1
