"""qwen3, qwen2, mistral, qwen3_moe and mixtral from GGUF: a file written from each tiny artifact converts into that
family's Hugging Face directory, and the target loaded from it equals transformers on the original (float32
tensors in the file: bit-exact weights) and transformers on the converted directory (a Q8_0 file)."""

from __future__ import annotations

import json

import attrs
import gguf
import pytest
import torch
from family_artifacts import FAMILY_NAMES, WINDOW, family_artifacts, hf_greedy, prompt  # noqa: F401  (fixtures)
from family_gguf import EOS, write_gguf
from target_artifacts import decode_one, prefill

from speclane.stages.contract.errors import ArtifactError
from speclane.stages.models import artifact
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.gguf_families import build_config
from speclane.stages.models.loading import load_model
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from speclane.stages.models.tokenizer import Tokenizer

TOL = 2e-4  # as in test_family_oracle.py: float32 summation order only


@pytest.fixture(params=FAMILY_NAMES)
def converted(request, family_artifacts, tmp_path):
    name = request.param
    path, ref = family_artifacts[name]
    file = write_gguf(path, name, tmp_path / f"{name}.gguf")
    return name, artifact.resolve(file, cache=tmp_path / "cache"), path, ref


def test_the_gguf_converts_into_the_family_with_its_quirks(converted):
    name, directory, original, _ = converted
    raw = json.loads((directory / "config.json").read_text())
    assert raw["model_type"] == name
    ours, theirs = ModelConfig.load(directory), ModelConfig.load(original)
    assert ours.eos_token_ids == (EOS,), "the file's own EOS id"
    assert attrs.evolve(ours, eos_token_ids=theirs.eos_token_ids) == theirs, "every other field is the original's"
    tok = Tokenizer.load(directory)
    assert tok.eos_token_ids == (EOS,) and tok.encode("ab ab") == [96, 97]


def test_logits_and_greedy_tokens_equal_transformers(converted):
    name, directory, _, ref = converted
    tokens = prompt(WINDOW - 8, seed=4)
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0]
    target = Target.load(directory, dtype=torch.float32)
    state = target.new_state(slots=1, max_len=WINDOW)
    out = target.forward(RowBatch.build([(0, 0, tokens)]), state, record="last")
    torch.testing.assert_close(out.logits, want, atol=TOL, rtol=0)
    short, new = tokens[:9], 20
    state = target.new_state(slots=1, max_len=WINDOW)
    got = [int(prefill(target, state, 0, short)[-1].argmax())]
    while len(got) < new:
        got.append(int(decode_one(target, state, [(0, len(short) + len(got) - 1, got[-1])])[0].argmax()))
    assert got == hf_greedy(ref, short, new)


def test_a_q8_0_file_equals_transformers_on_the_converted_directory(family_artifacts, tmp_path):
    """Quantized blocks become their float32 values: transformers reads the converted directory, and our target
    from it gives the same logits; the quantization moved them away from the original's, but only a little."""
    from transformers import AutoModelForCausalLM

    path, original = family_artifacts["qwen3_moe"]
    file = write_gguf(path, "qwen3_moe", tmp_path / "q8.gguf", qtype=gguf.GGMLQuantizationType.Q8_0)
    directory = artifact.resolve(file, cache=tmp_path / "cache")
    ref = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    tokens = prompt(30, seed=5)
    with torch.no_grad():
        want, before = ref(torch.tensor([tokens])).logits[0], original(torch.tensor([tokens])).logits[0]
    target = Target.load(directory, dtype=torch.float32)
    out = target.forward(RowBatch.build([(0, 0, tokens)]), target.new_state(1, 32), record="last")
    torch.testing.assert_close(out.logits, want, atol=TOL, rtol=0)
    drift = ((want - before).norm() / before.norm()).item()
    # 8-bit blocks keep each weight to about 0.4 % of its block's largest; over 3 layers (and a router that may
    # pick another expert) the logits move by a few percent, a layout error by their whole size
    assert 0 < drift < 0.05, f"Q8_0 moved the logits by {drift:.1%} of their norm"


def test_a_mistral_file_without_its_window_loads_as_llama(family_artifacts, tmp_path):
    """Older converters drop `sliding_window`: the file is then a plain llama, which is Mistral within the window."""
    path, ref = family_artifacts["mistral"]
    directory = artifact.resolve(write_gguf(path, "mistral", tmp_path / "m.gguf", window=False), cache=tmp_path)
    assert json.loads((directory / "config.json").read_text())["model_type"] == "llama"
    tokens = prompt(20, seed=6)
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0]
    target = Target.load(directory, dtype=torch.float32)
    out = target.forward(RowBatch.build([(0, 0, tokens)]), target.new_state(1, 32), record="last")
    torch.testing.assert_close(out.logits, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["mistral", "mixtral"])
def test_a_sentencepiece_file_loads_with_its_vocabulary(family_artifacts, tmp_path, monkeypatch, name):
    """Mistral and Mixtral files carry a sentencepiece vocabulary: `--model FILE.gguf` loads it, BOS and all."""
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path / "cache"))
    path, ref = family_artifacts[name]
    target, tokenizer = load_model(str(write_gguf(path, name, tmp_path / "spm.gguf", spm=True)), "float32")
    assert target.cfg.model_type == name and tokenizer.eos_token_ids == (2,)
    ids = tokenizer.encode("ab ab", add_special=True)
    assert ids == [1, 100, 100] and tokenizer.decode(ids, skip_special=True) == "ab ab"
    out = target.forward(RowBatch.build([(0, 0, ids)]), target.new_state(1, 8), record="last")
    with torch.no_grad():
        torch.testing.assert_close(out.logits, ref(torch.tensor([ids])).logits[0], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_a_converted_moe_file_runs_its_experts_from_a_cache(family_artifacts, tmp_path, name):
    """The converted directory's experts (float32, the family's own names) are read in place by an expert cache of
    one slot, and the pass is bit-identical to every expert resident."""
    directory = artifact.resolve(write_gguf(family_artifacts[name][0], name, tmp_path / "moe.gguf"), cache=tmp_path)
    resident = Target.load(directory, dtype=torch.float32)
    cfg = resident.cfg
    cached = Target.load(
        directory, dtype=torch.float32, expert_cache_bytes=3 * cfg.hidden_size * cfg.moe_intermediate_size * 4
    )
    tokens = prompt(20, seed=7)
    want = resident.forward(RowBatch.build([(0, 0, tokens)]), resident.new_state(1, 24), record="last").logits
    got = cached.forward(RowBatch.build([(0, 0, tokens)]), cached.new_state(1, 24), record="last").logits
    assert torch.equal(got, want) and cached.expert_stats().slots == 1


def test_metadata_problems_are_named():
    base = {"general.architecture": "qwen3moe"}
    with pytest.raises(ArtifactError, match=r"x.gguf: metadata keys missing: qwen3moe.block_count, qwen3moe.emb"):
        build_config(base, set(), "x.gguf")
    meta = {
        **base,
        "qwen3moe.block_count": 1,
        "qwen3moe.embedding_length": 8,
        "qwen3moe.attention.head_count": 2,
        "qwen3moe.attention.layer_norm_rms_epsilon": 1e-6,
    }
    with pytest.raises(ArtifactError, match=r"routes to experts but qwen3moe.expert_count is missing"):
        build_config(meta, {"blk.0.ffn_gate_inp.weight"}, "x.gguf")
