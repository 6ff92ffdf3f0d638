"""The suffix drafter's cache of finished requests survives a restart through the snapshot files (`serve
--snapshot-dir`): a restarted engine's tree holds the same requests and drafts the same, within its budget; a
damaged or old file is refused with one warning and moved aside, one of another vocabulary left alone, and the
start goes on either way. A chain (suffix+mtp) keeps both its cache and its network's checkpoints."""

import logging

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.snapshots import REQUESTS_DIR
from tests.drafters.conftest import write_drafter
from tests.round.conftest import IdTokenizer, engine, prompt, requests, targets  # noqa: F401  (fixture)


def _engine(target, directory, backend="suffix", **options):
    base = engine(target, backend, k=4, max_lanes=1, options=options)
    return Engine(
        target,
        IdTokenizer(),
        spec=base.spec,
        max_lanes=1,
        max_len=512,
        checkpoint_bytes=64 << 20,
        snapshot_dir=directory,
    )


def _files(directory):
    return sorted((directory / REQUESTS_DIR).glob("*.safetensors"))


def test_a_restarted_engine_drafts_from_the_requests_its_predecessor_saw(targets, tmp_path):  # noqa: F811
    # qwen3_5_text's greedy answer to a random prompt repeats nothing: only the cache can draft its repeat
    target = targets["qwen3_5_text"]
    asks = [prompt(15, seed=3), prompt(11, seed=4)]
    first = _engine(target, tmp_path)
    answers = [r.tokens for r in first.generate(requests(asks, 24))]
    held = list(first.drafter.request_cache(first.drafter_state).held)
    assert len(held) == 2 and len(_files(tmp_path)) == 2  # one file a finished request
    again = _engine(target, tmp_path)
    cache = again.drafter_state.cache
    assert list(cache.held) == held and cache.tokens == cache.tree.held() == sum(map(len, held))
    for seq in held:  # the restored tree drafts what the first one drafts, from every context
        for end in range(2, len(seq)):
            context = seq[max(0, end - 10) : end]
            old = first.drafter_state.cache.tree.speculate(context, 7, 0.1, 1.0)
            assert cache.tree.speculate(context, 7, 0.1, 1.0) == old
    (got,) = again.generate(requests(asks[:1], 24))
    assert got.tokens == answers[0] and got.spec["accepted"] >= 16  # drafted from the restored cache
    fresh = _engine(target, tmp_path / "empty")
    assert fresh.generate(requests(asks[:1], 24))[0].spec["accepted"] == 0
    again.drafter.request_cache(again.drafter_state)  # its answer's checkpoint was held already: taken in now
    assert len(_files(tmp_path)) == 3


def test_a_smaller_budget_keeps_the_newest_and_deletes_the_others_files(targets, tmp_path):  # noqa: F811
    target = targets["llama"]
    eng = _engine(target, tmp_path)
    eng.generate(requests([prompt(10 + i, seed=i) for i in range(5)], 6))
    eng.drafter.request_cache(eng.drafter_state)
    held = list(eng.drafter_state.cache.held)
    assert len(_files(tmp_path)) == 5
    small = _engine(target, tmp_path, cache_tokens=len(held[-1]) + len(held[-2]))
    assert list(small.drafter_state.cache.held) == held[-2:] and len(_files(tmp_path)) == 2


def test_damaged_old_and_foreign_files_are_refused_and_the_rest_load(targets, tmp_path, caplog):  # noqa: F811
    target = targets["llama"]
    eng = _engine(target, tmp_path)
    eng.generate(requests([prompt(12 + i, seed=40 + i) for i in range(4)], 6))
    eng.drafter.request_cache(eng.drafter_state)
    held = list(eng.drafter_state.cache.held)
    damaged, old, foreign, good = _files(tmp_path)
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 0xFF  # the last byte of the tokens tensor
    damaged.write_bytes(bytes(raw))
    for path, field, value in ((old, "version", "0"), (foreign, "vocab", "another")):
        with safe_open(str(path), framework="pt") as f:
            meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        if field == "vocab":  # a well-formed file of another tokenizer: its checksum holds
            from speclane.pipeline.runtime.snapshot_checks import checksum

            meta = {**meta, field: value}
            meta["checksum"] = checksum(meta, tensors)
        else:
            meta = {**meta, field: value}
        save_file(tensors, str(path), metadata=meta)
    with caplog.at_level(logging.WARNING, logger="speclane.snapshots"):
        again = _engine(target, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 3, lines
    assert any(damaged.name in x and "checksum does not match" in x and "moved aside" in x for x in lines)
    assert any(old.name in x and "version '0'" in x and "moved aside" in x for x in lines)
    assert any(foreign.name in x and "vocab 'another'" in x and "moved aside" not in x for x in lines)
    assert list(again.drafter_state.cache.held) == [held[3]]
    assert (tmp_path / REQUESTS_DIR / (damaged.name + ".bad")).exists() and foreign.exists() and good.exists()
    assert [r.tokens for r in again.generate(requests([prompt(9, seed=1)], 4))]  # serving goes on


def test_a_chain_keeps_its_cache_and_its_networks_checkpoints(targets, tmp_path):  # noqa: F811
    target = targets["llama"]
    write_drafter("mtp", target, tmp_path / "mtp")
    options = {"path": str(tmp_path / "mtp")}
    snaps = tmp_path / "snaps"
    eng = _engine(target, snaps, "suffix+mtp", **options)
    ask = prompt(30, seed=7)
    (answer,) = eng.generate(requests([ask], 8))
    eng.drafter.request_cache(eng.drafter_state)
    again = _engine(target, snaps, "suffix+mtp", **options)
    assert list(again.drafter_state.cache.held) == list(eng.drafter_state.cache.held)
    assert again.checkpoints.stats()["entries"] == eng.checkpoints.stats()["entries"] > 0  # windows fit its layout
    assert again.generate(requests([ask], 8))[0].tokens == answer.tokens
    assert torch.equal(again.drafter_state.window.count, again.drafter_state.model.window.count)
