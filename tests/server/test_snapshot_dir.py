"""`speclane serve --snapshot-dir`: whatever lies in the directory, the server starts. Each damaged, foreign or
old-version file is moved aside with one warning line and never loaded (a well-formed file of the wrong shapes
included, which would otherwise fail inside a round); the sound files are served from, and a request the damaged
checkpoint would have served gets the tokens it got before."""

from __future__ import annotations

import json

from safetensors import safe_open
from safetensors.torch import save_file

from speclane.pipeline.cli.serve import stop as stop_server
from speclane.pipeline.net.client import Client
from speclane.pipeline.runtime.snapshot_checks import BAD
from speclane.pipeline.runtime.snapshots import write
from tests.server.conftest import start_server

IDS = list(range(1000, 1030))  # a prompt of 30 ids: its end is checkpointed (16 or more), then its answer's
MORE = [2000, 2001, 2002]


def _answer(endpoint: str, ids: list[int]) -> tuple[list[int], dict]:
    with Client(endpoint, timeout=120) as client:
        tokens = client.generate(prompt_ids=ids, max_tokens=6, ignore_eos=True).wait().token_ids
        return tokens, client.stats().checkpoints


def _parts(path):
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}


def _narrowed(path) -> None:
    """Rewritten well formed (a valid checksum) with layer 0's keys one dimension short."""
    meta, tensors = _parts(path)
    del meta["checksum"]
    tensors["target.0.0"] = tensors["target.0.0"][..., :-1].contiguous()
    write(path, tensors, meta)


def _old(source, path) -> None:
    meta, tensors = _parts(source)
    del meta["checksum"]
    save_file(tensors, str(path), metadata={**meta, "version": "1"})


def _flipped(source, path) -> None:
    data = bytearray(source.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damaged_files_are_moved_aside_and_the_server_serves(tmp_path):
    snaps = tmp_path / "snaps"
    proc, endpoint = start_server(tmp_path / "first.log", "--snapshot-dir", str(snaps))
    try:
        _answer(endpoint, IDS)
        want, stats = _answer(endpoint, IDS + MORE)  # from the checkpoint of IDS
        assert stats["hits"] == 1
    finally:
        stop_server(proc)
    by_tokens = {tuple(json.loads(_parts(p)[0]["tokens"])): p for p in snaps.glob("*.safetensors")}
    prefix = by_tokens.pop(tuple(IDS))
    sound = min(by_tokens.values())
    _narrowed(prefix)
    damaged = {
        prefix.name: "does not fit this model",
        "old.safetensors": "format version '1'",
        "flipped.safetensors": "checksum does not match",
        "truncated.safetensors": "unreadable",
        "zeroed.safetensors": "unreadable",
        "empty.safetensors": "unreadable",
        "foreign.safetensors": "not a checkpoint file",
    }
    _old(sound, snaps / "old.safetensors")
    _flipped(sound, snaps / "flipped.safetensors")
    (snaps / "truncated.safetensors").write_bytes(sound.read_bytes()[:1000])
    (snaps / "zeroed.safetensors").write_bytes(bytes(sound.stat().st_size))
    (snaps / "empty.safetensors").write_bytes(b"")
    save_file(_parts(sound)[1], str(snaps / "foreign.safetensors"), metadata={"format": "gguf-export"})

    log = tmp_path / "second.log"
    proc, endpoint = start_server(log, "--snapshot-dir", str(snaps))
    try:
        got, stats = _answer(endpoint, IDS + MORE)
    finally:
        stop_server(proc)
    assert got == want and stats["hits"] == 0
    kept = sorted(p.name for p in snaps.glob("*.safetensors"))
    assert stats["entries"] == len(kept) == 3 and prefix.name not in kept  # the sound ones, no damaged one
    warnings = [line for line in log.read_text().splitlines() if "speclane.snapshots WARNING" in line]
    assert len(warnings) == len(damaged), warnings
    for name, why in damaged.items():
        assert (snaps / (name + BAD)).exists() and not (snaps / name).exists(), name
        [line] = [w for w in warnings if f"/{name} refused and moved aside to {name}{BAD}: " in w]
        assert why in line, line
