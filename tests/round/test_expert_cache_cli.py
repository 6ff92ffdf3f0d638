"""`--expert-cache MB` on the commands that run a model: `generate --json` reports the cache's counters in its
summary (absent without a cache), the tokens are those of all experts resident, and bad budgets exit 2 naming
the flag before a model loads."""

import json
import shutil

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from speclane.pipeline.cli import build_parser, main
from tests.models.target_artifacts import artifacts, with_words  # noqa: F401  (fixtures)

ONE_EXPERT_MB = 3 * 48 * 24 * 4 / (1 << 20)  # one routed expert of the tiny Qwen3-Next in float32


@pytest.fixture(scope="module")
def models_dir(artifacts, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-models")
    return {name: with_words(artifacts[name][0], root / name) for name in ("qwen3_next", "llama")}


def _generate(capsys, model, *flags):
    code = main(
        [
            "generate",
            "--model",
            str(model),
            "--prompt-ids",
            "5,9,14,5,9",
            "--max-tokens",
            "8",
            "--json",
            "--dtype",
            "float32",
            "--threads",
            "1",
            "--checkpoint-memory",
            "0",
            *flags,
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.splitlines()[0])["tokens"], json.loads(err.strip().splitlines()[-1])["summary"]


@pytest.mark.parametrize("backend", ["none", "ngram"])
def test_generate_json_reports_the_experts_and_the_same_tokens(capsys, models_dir, backend):
    spec = ("--spec-backend", backend)
    want, summary = _generate(capsys, models_dir["qwen3_next"], *spec)
    assert "experts" not in summary  # every expert resident: no cache, nothing to count
    got, summary = _generate(capsys, models_dir["qwen3_next"], *spec, "--expert-cache", f"{2.5 * ONE_EXPERT_MB}")
    assert got == want and len(want) >= 4
    experts = summary["experts"]
    assert set(experts) == {"hits", "misses", "bytes_copied", "slots", "resident_bytes"}
    one = round(ONE_EXPERT_MB * (1 << 20))
    assert experts["slots"] == 2 and experts["resident_bytes"] == 2 * one  # 2.5 experts' MB: 2 whole slots
    assert experts["misses"] > 0 and experts["bytes_copied"] == experts["misses"] * one
    assert experts["hits"] == 0  # 2 slots hold less than a layer chooses for one row (top-3)


def test_a_dense_model_with_the_flag_is_refused(capsys, models_dir):
    code = main(
        [
            "generate",
            "--model",
            str(models_dir["llama"]),
            "--prompt-ids",
            "5,9",
            "--max-tokens",
            "2",
            "--dtype",
            "float32",
            "--expert-cache",
            "64",
        ]
    )
    _, err = capsys.readouterr()
    assert code == 2
    assert (
        "--expert-cache: this model (llama) is dense, it has no routed experts to cache; leave --expert-cache "
        "unset" in err
    )


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_a_budget_that_is_not_a_positive_number_is_refused(capsys, value):
    code = main(["generate", "--prompt-ids", "5,9", "--expert-cache", value])
    _, err = capsys.readouterr()
    assert code == 2 and f"--expert-cache must be > 0 MB (unset: every expert resident), got {float(value)}" in err


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["serve"], ["chat"]])
def test_the_flag_is_on_every_command_that_runs_a_model(command):
    assert build_parser().parse_args([*command, "--expert-cache", "1.5"]).expert_cache == 1.5
    assert build_parser().parse_args(command).expert_cache is None
