"""A MoEfied model is a qwen2_moe directory `--model` loads: written by `python -m speclane.stages.fitting.moefy`,
read by transformers to the same logits as ours, and run by `generate` with an expert cache smaller than every
expert to the same greedy tokens as with every expert resident."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from speclane.pipeline.cli import main
from speclane.stages.fitting import moefy
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from tests.models.target_artifacts import VOCAB, _rescale

transformers = pytest.importorskip("transformers")

# 4 routed experts of (72 - 8) / 4 = 16 neurons a layer, top 2, a shared expert of 8 neurons; hidden 48 keeps
# transformers' grouped expert kernel on its 16-byte strides.
SETTINGS = moefy.MoefySettings(experts=4, top_k=2, shared=8, sequences=4, length=32, feature_tokens=128, iterations=3)
ONE_EXPERT_MB = 3 * 48 * 16 * 4 / (1 << 20)  # one routed expert in a float32 slot
# As in test_family_oracle.py: float32 against transformers' other summation orders, a few ulp per op.
TOL = 2e-4


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A tiny dense llama at about unit activation scale, with a word-level tokenizer ('t3' ends a generation)."""
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e5},
        eos_token_id=3,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    _rescale(model, seed=7)
    path = tmp_path_factory.mktemp("dense")
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t3"}))
    return path


@pytest.fixture(scope="module")
def moe_dir(dense, tmp_path_factory):
    out = tmp_path_factory.mktemp("moefied") / "model"
    ids = torch.randint(0, VOCAB, (SETTINGS.sequences, SETTINGS.length), generator=torch.Generator().manual_seed(1))
    record = moefy.moefy(dense, out, SETTINGS, ids)
    assert record["num_experts"] == 4 and record["moe_intermediate_size"] == 16
    return out


def test_the_directory_is_a_qwen2_moe_model_with_the_fit_beside_it(dense, moe_dir):
    cfg = ModelConfig.load(moe_dir)
    assert cfg.model_type == "qwen2_moe" and cfg.moe_layers == (True, True, True)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.moe_intermediate_size) == (4, 2, 16)
    assert cfg.shared_expert_intermediate_size == 8 and cfg.norm_topk_prob and not cfg.attention_bias
    assert not cfg.qk_norm and not cfg.norm_zero_centred and cfg.rotary_dim == cfg.head_dim
    assert (moe_dir / "tokenizer.json").read_bytes() == (dense / "tokenizer.json").read_bytes()
    assert json.loads((moe_dir / "moe.json").read_text())["settings"]["experts"] == 4
    assert not moe_dir.with_name("model.partial").exists()


def test_transformers_reads_the_same_model(moe_dir):
    tokens = [5, 9, 14, 20, 33, 7, 2, 88, 41, 17, 60]
    ref = transformers.AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0]
    assert type(ref).__name__ == "Qwen2MoeForCausalLM"
    assert want.std() > 0.5, "logits must not be ~0, or the tolerance below proves nothing"
    target = Target.load(moe_dir, dtype=torch.float32)
    got = target.forward(RowBatch.build([(0, 0, tokens)]), target.new_state(1, 32)).logits
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def _generate(capsys, model, *flags) -> tuple[list[int], dict]:
    argv = ["generate", "--model", str(model), "--prompt-ids", "5,9,14,5,9,22", "--max-tokens", "10", "--json"]
    code = main([*argv, "--dtype", "float32", "--threads", "1", "--checkpoint-memory", "0", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.splitlines()[0])["tokens"], json.loads(err.strip().splitlines()[-1])["summary"]


@pytest.mark.parametrize("backend", ["none", "ngram"])
def test_generate_runs_it_and_a_small_cache_gives_the_resident_tokens(capsys, moe_dir, backend):
    want, summary = _generate(capsys, moe_dir, "--spec-backend", backend)
    assert "experts" not in summary and len(want) >= 4
    # 5 slots of the model's 12 experts: every pass's lookups evict others
    got, summary = _generate(capsys, moe_dir, "--spec-backend", backend, "--expert-cache", f"{5.5 * ONE_EXPERT_MB}")
    assert got == want
    assert summary["experts"]["slots"] == 5 and summary["experts"]["misses"] > 5


def test_the_command_writes_a_loadable_directory(dense, tmp_path, capsys):
    out = tmp_path / "cli-moe"
    shape = ["--experts", "4", "--top-k", "2", "--shared", "8", "--sequences", "2", "--length", "16"]
    assert moefy.main(["--out", str(out), "--model", str(dense), *shape]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert ModelConfig.load(out).num_experts == 4
    shutil.rmtree(out)


def test_a_base_that_is_not_llama_is_refused(tmp_path):
    from speclane.stages.contract.errors import ArtifactError
    from speclane.stages.fitting.moe_dir import moe_dir_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "rope_theta": 1e4}))
    with pytest.raises(ArtifactError, match=r"config.json: a MoEfied model's base must be llama, got qwen3"):
        moe_dir_config(tmp_path, {})
