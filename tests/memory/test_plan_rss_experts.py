"""`speclane plan` against the measured peak resident memory of a MoE target whose experts are most of its bytes,
every expert resident and with an expert cache. With the cache, the experts stay in the mapped files and every
page a run reads counts in its RSS: the plan's `total` leaves them out (they are the page cache's) and its `rss`
counts them, and both are checked, so neither can drift from what the process holds."""

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.memory.test_plan_rss import speclane
from tests.models.target_artifacts import VOCAB, _rescale

transformers = pytest.importorskip("transformers")

PROMPT = ["--prompt", " ".join(f"t{i}" for i in range(8, 24)), "--dtype", "float32", "--spec-backend", "ngram"]
TOKENS = 96  # random routing of 8 of 64 experts a token: 96 tokens read nearly every expert's pages


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    """A qwen3_moe of 4 layers x 64 experts of 256 neurons at hidden 128: 100 MB of float32 experts, 1.5 MB else."""
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=64,
        num_experts_per_tok=8,
        moe_intermediate_size=256,
        norm_topk_prob=True,
        tie_word_embeddings=True,
        eos_token_id=3,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    _rescale(model, seed=11)
    path = tmp_path_factory.mktemp("moe_rss")
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t3"}))
    return path


def _plan(model, context: int, *flags: str) -> dict:
    argv = ["plan", "--model", str(model), "--dtype", "float32", "--spec-backend", "ngram", "--lanes", "1"]
    _, out = speclane(*argv, "--context", str(context), "--memory", "64GiB", *flags, "--json")
    return json.loads(out)["bytes"]


@pytest.mark.parametrize("cache", [None, "12"])
def test_a_moe_targets_peak_is_the_plans(moe_model, cache):
    flags = () if cache is None else ("--expert-cache", cache)
    run = ("generate", "--model", str(moe_model), *PROMPT, "--max-tokens", str(TOKENS))
    peak, out = speclane(*run, *flags, "--json")
    usage = json.loads(out.splitlines()[0])["usage"]
    assert usage["completion_tokens"] >= TOKENS // 2  # most of the experts read
    plan = _plan(moe_model, usage["prompt_tokens"] + TOKENS, *flags)
    assert plan["experts_fast"] + plan["experts_slow"] >= 100 * 10**6  # the experts are most of the bytes
    if cache is None:
        assert plan["rss"] == plan["total"] and plan["experts_slow"] == 0
    else:  # the mapped pages show in the peak: total alone would be over 10 % short of it
        assert plan["experts_fast"] <= 12 << 20 and plan["rss"] == plan["total"] + plan["experts_slow"]
        assert peak - plan["total"] > 0.1 * peak, (peak, plan)
    assert abs(peak - plan["rss"]) <= 0.1 * peak, (peak, plan)
