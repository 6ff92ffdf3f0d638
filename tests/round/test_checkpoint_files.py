"""Checkpoint files (`serve --snapshot-dir`): a restarted engine serves from the checkpoints its predecessor
wrote, decoding as a fresh prefill would; a file of another model, drafter or format version is refused with a
warning and never used; an evicted checkpoint's file goes with it."""

import logging

from safetensors import safe_open
from safetensors.torch import save_file

from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.snapshot_checks import FORMAT, VERSION
from tests.round.conftest import IdTokenizer, engine, prompt, requests


def _engine(target, directory, budget=64 << 20):
    base = engine(target, backend="ngram", k=3, max_lanes=1)
    return Engine(
        target, IdTokenizer(), spec=base.spec, max_lanes=1, max_len=512, checkpoint_bytes=budget, snapshot_dir=directory
    )


def test_a_restarted_engine_serves_from_the_files(targets, tmp_path):
    target = targets["qwen3_5_text"]
    first = prompt(40, seed=31)
    (answer,) = _engine(target, tmp_path).generate(requests([first], max_tokens=8))
    assert len(list(tmp_path.glob("*.safetensors"))) == 2  # the prompt's end and the answer's
    follow = first + list(answer.tokens) + prompt(6, seed=32)
    restarted = _engine(target, tmp_path)
    assert restarted.checkpoints.stats()["entries"] == 2
    got = restarted.generate(requests([follow], max_tokens=10))[0].tokens
    assert restarted.checkpoints.hits == 1 and restarted.checkpoints.tokens_reused >= len(first)
    want = _engine(target, tmp_path / "empty", budget=0).generate(requests([follow], max_tokens=10))[0].tokens
    assert got == want


def test_files_of_another_model_or_version_are_refused(targets, tmp_path, caplog):
    _engine(targets["llama"], tmp_path).generate(requests([prompt(40, seed=33)], max_tokens=4))
    (path,) = sorted(tmp_path.glob("*.safetensors"))[:1]
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata={**meta, "version": "0"})
    with caplog.at_level(logging.WARNING, logger="speclane.snapshots"):
        other = _engine(targets["qwen3_next"], tmp_path)  # another model: none of them
        assert other.checkpoints.stats()["entries"] == 0
        same = _engine(targets["llama"], tmp_path)  # its own model: all of them, the old version set aside
        assert same.checkpoints.stats()["entries"] == len(list(tmp_path.glob("*.safetensors")))
    refused = [r.getMessage() for r in caplog.records]
    assert any(
        f"old.safetensors refused and moved aside to old.safetensors.bad: format version '0', this engine "
        f"reads version '{VERSION}' only" in m
        for m in refused
    )
    assert any("refused: model" in m for m in refused) and meta["format"] == FORMAT
    assert (tmp_path / "old.safetensors.bad").exists()


def test_an_evicted_checkpoint_takes_its_file(targets, tmp_path):
    eng = _engine(targets["llama"], tmp_path, budget=1)  # nothing fits: nothing is written
    eng.generate(requests([prompt(40, seed=34)], max_tokens=4))
    assert not list(tmp_path.glob("*.safetensors"))
    eng = _engine(targets["llama"], tmp_path)
    eng.generate(requests([prompt(40, seed=35)], max_tokens=4))
    kept = {p.name for p in tmp_path.glob("*.safetensors")}
    eng.checkpoints.budget_bytes = eng.checkpoints.bytes_held  # the next one evicts the oldest
    eng.generate(requests([prompt(40, seed=36)], max_tokens=4))
    now = {p.name for p in tmp_path.glob("*.safetensors")}
    assert len(now) == eng.checkpoints.stats()["entries"] and not kept <= now
