"""`--model ORG/NAME`: a repo id is found in the local Hugging Face cache (a fake one built here, in
huggingface_hub's layout: refs, snapshots linking into blobs), through each environment variable that places it;
anything missing is a clear error, and nothing is downloaded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from family_artifacts import family_artifacts  # noqa: F401  (fixtures)
from family_gguf import write_gguf

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models import artifact
from speclane.stages.models.hub_cache import find_in_cache, hub_cache_dir, is_repo_id
from speclane.stages.models.loading import load_model
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(hub: Path, repo: str, files: dict[str, Path], commit: str = COMMIT, ref: str = "main") -> Path:
    """A snapshot of `repo` in huggingface_hub's layout: each file a link from snapshots/COMMIT into blobs/."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, source in files.items():
        blob = folder / "blobs" / f"blob-{len(list((folder / 'blobs').iterdir()))}"
        shutil.copy(source, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    return snapshot


def _artifact_files(path: Path) -> dict[str, Path]:
    return {f.name: f for f in path.iterdir() if f.is_file()}


def test_repo_ids_are_told_from_paths():
    assert is_repo_id("Qwen/Qwen3-30B-A3B") and is_repo_id("mistralai/Mixtral-8x7B-v0.1@refs/pr/1")
    assert not any(is_repo_id(p) for p in ("/models/qwen", "./a/b", "~/a/b", "a", "a/b/c", "model.gguf"))


def test_the_cache_location_follows_huggingface_hub(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_cache_dir() == tmp_path / "hub"


def test_a_cached_repo_loads_as_its_directory(family_artifacts, tmp_path, monkeypatch):
    path, ref = family_artifacts["qwen3"]
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    snapshot = fake_cache(tmp_path / "hf" / "hub", "Org/Tiny-Qwen3", _artifact_files(path))
    assert artifact.resolve("Org/Tiny-Qwen3") == snapshot.resolve()
    assert artifact.resolve(f"Org/Tiny-Qwen3@{COMMIT}") == snapshot.resolve()
    target = Target.load(artifact.resolve("Org/Tiny-Qwen3"), dtype=torch.float32)
    tokens = [5, 17, 3, 99, 42]
    out = target.forward(RowBatch.build([(0, 0, tokens)]), target.new_state(1, 8), record="last")
    with torch.no_grad():
        torch.testing.assert_close(out.logits, ref(torch.tensor([tokens])).logits[0], atol=2e-4, rtol=0)


def test_a_gguf_only_snapshot_loads_its_one_file(family_artifacts, tmp_path, monkeypatch):
    path, _ = family_artifacts["qwen2"]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    gguf = write_gguf(path, "qwen2", tmp_path / "tiny-q.gguf")
    fake_cache(tmp_path / "hub", "Org/Tiny-GGUF", {"tiny-q.gguf": gguf, "README.md": gguf})
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path / "speclane"))
    target, tokenizer = load_model("Org/Tiny-GGUF", "float32")  # what `--model Org/Tiny-GGUF` loads
    assert target.artifact_dir.parent.parent == tmp_path / "speclane"  # converted once, into speclane's cache
    assert target.cfg.model_type == "qwen2" and tokenizer.encode("ab") == [96]


def test_what_is_not_cached_is_named_with_how_to_fetch_it(family_artifacts, tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with pytest.raises(ArtifactError, match=r"Org/Absent: no such file or directory, and not in the local Hugging "):
        artifact.resolve("Org/Absent")
    with pytest.raises(ArtifactError, match=r"speclane never downloads: fetch it first with `hf download Org/Absent`"):
        artifact.resolve("Org/Absent")
    path, _ = family_artifacts["qwen3"]
    snapshot = fake_cache(hub, "Org/Tiny", _artifact_files(path))
    with pytest.raises(ArtifactError, match=rf"revision 'v2' is not in the local .* \(snapshots held: {COMMIT}\)"):
        find_in_cache("Org/Tiny@v2")
    next(snapshot.glob("*.safetensors")).resolve().unlink()  # an interrupted download: a link to no blob
    with pytest.raises(ArtifactError, match=r"the cached download of Org/Tiny is incomplete \(model.safetensors"):
        artifact.resolve("Org/Tiny")
    two = fake_cache(hub, "Org/Two", {"a.gguf": path / "config.json", "b.gguf": path / "config.json"})
    with pytest.raises(
        ArtifactError, match=rf"holds 2 GGUF files \(a.gguf, b.gguf\); pass the one to load as --model {two}/"
    ):
        artifact.resolve("Org/Two")
