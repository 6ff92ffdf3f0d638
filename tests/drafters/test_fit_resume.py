"""Growing a fit: a larger `--forced` reuses the teacher-forced shards already built (prefilling only the new
items, the same sequences in the same order), and `--init` warm-starts from a drafter file, keeping its record."""

from __future__ import annotations

import attrs
import pytest
import torch

from speclane.stages.contract.errors import ArtifactError, ConfigError
from speclane.stages.fitting import data as fit_data
from speclane.stages.fitting import datasets, fit
from speclane.stages.models import drafter_weights as dw
from tests.drafters.conftest import write_drafter
from tests.models.target_artifacts import prompt


@pytest.fixture
def forced_items(monkeypatch, tiny):
    """make_forced / encode_forced over token ids (the tiny target has no tokenizer), counting prefill calls."""
    items = [("code" if i % 5 else "prose", i) for i in range(200)]
    monkeypatch.setattr(fit_data, "read_corpus", lambda paths: [])
    monkeypatch.setattr(fit_data, "make_forced", lambda docs, count, seed, heldout: items[:count])
    monkeypatch.setattr(
        fit_data,
        "encode_forced",
        lambda tok, group, mp, ml: [
            (kind, prompt(6, seed=i), prompt(6, seed=i) + prompt(10, seed=500 + i)) for kind, i in group
        ],
    )
    calls = []
    real = fit_data.forced
    monkeypatch.setattr(fit_data, "forced", lambda target, seqs, **kw: calls.append(len(seqs)) or real(target, seqs))
    saved = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    yield calls
    tiny.hidden_taps = saved


def _settings(tmp_path, forced: int) -> fit.FitSettings:
    return fit.FitSettings(backend="mtp", corpus=["unused"], out=str(tmp_path / "out"), forced=forced)


def test_a_larger_forced_set_prefills_only_the_new_shards(tiny, tmp_path, forced_items):
    first = datasets.build_forced(_settings(tmp_path, 40), tiny, None, tmp_path)
    assert forced_items == [32, 8] and len(first) == 40
    forced_items.clear()
    grown = datasets.build_forced(_settings(tmp_path, 96), tiny, None, tmp_path)
    # shard 0 (items 0-31) is reused; shard 1 held only items 32-39, so it is built again whole, then shard 2
    assert forced_items == [32, 32] and len(grown) == 96
    assert [q["kind"] for q in grown] == ["code" if i % 5 else "prose" for i in range(96)]
    for a, b in zip(first[:32], grown[:32]):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["taps"], b["taps"])


def test_keep_taps_trims_to_the_last_layer(tiny, tmp_path, forced_items):
    full = datasets.build_forced(_settings(tmp_path, 8), tiny, None, tmp_path)
    last = datasets.build_forced(_settings(tmp_path, 8), tiny, None, tmp_path, slice(-1, None))
    assert full[0]["taps"].shape[1] == len(dw.fit_taps(tiny.cfg)) and last[0]["taps"].shape[1] == 1
    assert torch.equal(last[0]["taps"][:, 0], full[0]["taps"][:, -1])


def test_warm_start_loads_the_file_trainable_and_keeps_its_record(tiny, tmp_path):
    net = write_drafter("mtp", tiny, tmp_path / "a", seed=3)
    warm, record = fit.warm_start("mtp", tmp_path / "a", tiny.cfg)
    for (name, p), q in zip(warm.named_parameters(), net.state_dict().values()):
        assert p.requires_grad and p.dtype == torch.float32, name
        torch.testing.assert_close(p.detach(), q.to(torch.bfloat16).float())
    assert record["fit"] == {"test": True} and len(record["sha256"]) == 16 and record["path"] == str(tmp_path / "a")


def test_warm_start_from_a_missing_or_misshapen_file_names_it(tiny, tmp_path):
    with pytest.raises(ArtifactError, match="mtp.json: missing"):
        fit.warm_start("mtp", tmp_path / "nowhere", tiny.cfg)
    write_drafter("mtp", tiny, tmp_path / "b")
    cfg = attrs.evolve(tiny.cfg, hidden_size=tiny.cfg.hidden_size * 2)
    with pytest.raises(ArtifactError, match="hidden_size"):
        fit.warm_start("mtp", tmp_path / "b", cfg)


def test_a_checkpoint_of_another_fit_is_refused_naming_the_difference(tmp_path):
    base = fit.FitSettings(backend="mtp", corpus=["c"], out="o", forced=1200, loss="kl", steps=3000)
    warm = base.model_copy(update={"init": "assets", "lr": 5e-4, "steps": 2600})
    with pytest.raises(ConfigError, match=r"differs in init \(None there, 'assets' now\), lr .*steps \(3000"):
        fit.check_resumable(tmp_path / "mtp-ckpt.pt", fit.run_identity(base), fit.run_identity(warm))
    # what may change between a run and its resumption
    later = base.model_copy(update={"time_limit_s": 0.0, "stop_at": 2100, "threads": 2, "out": "elsewhere"})
    fit.check_resumable(tmp_path / "mtp-ckpt.pt", fit.run_identity(base), fit.run_identity(later))
    fit.check_resumable(tmp_path / "mtp-ckpt.pt", None, fit.run_identity(warm))  # an older checkpoint
