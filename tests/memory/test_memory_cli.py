"""`speclane plan --model/--memory` prints the memory plan (JSON: its lines under "bytes", and "fits"), sizes are
parsed strictly, and --memory on the commands that run a model refuses what does not fit before a weight loads,
naming what to change; what fits runs with the expert cache's slots the plan counted."""

import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from speclane.pipeline.cli import main, memory
from speclane.pipeline.cli.memory import parse_size
from speclane.pipeline.cli.memory import runtime_bytes as measured_runtime
from speclane.pipeline.runtime.memory_plan import LINES, Model, Setting, lay_out
from speclane.pipeline.runtime.model_bytes import Build
from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.target import Target
from tests.models.target_artifacts import VOCAB, artifacts, with_words  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def no_runtime(monkeypatch):
    """These tests hold the allocations: the process's own bytes (pytest's here) are left out of the plan."""
    monkeypatch.setattr(memory, "runtime_bytes", lambda directory: 0)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def moe(artifacts, tmp_path_factory):  # noqa: F811
    """The tiny Qwen3-Next with a word-level tokenizer."""
    return with_words(artifacts["qwen3_next"][0], tmp_path_factory.mktemp("cli-plan") / "qwen3_next")


@pytest.mark.parametrize(
    "text, size",
    [
        ("24GiB", 24 << 30),
        ("512MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("3KB", 3000),
        ("2.5KiB", 2560),
        ("7B", 7),
        ("1TiB", 1 << 40),
    ],
)
def test_sizes_are_a_number_and_a_unit(text, size):
    assert parse_size(text, "--memory") == size


@pytest.mark.parametrize("text", ["24", "24 GiB", "24gib", "24G", "-1GiB", "1e3MB", "GiB", "1.5.2GB", ""])
def test_anything_else_is_refused_naming_the_flag(text):
    with pytest.raises(ConfigError, match=r"^--host-memory: '.*' is not a size; write a number and a unit"):
        parse_size(text, "--host-memory")
    with pytest.raises(ConfigError, match="less than one byte"):
        parse_size("0.5B", "--memory")


def test_plan_json_lays_out_the_bytes(capsys, moe):
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        str(moe),
        "--memory",
        "64MiB",
        "--lanes",
        "2",
        "--context",
        "300",
        "--spec-backend",
        "ngram",
        "--spec-draft-tokens",
        "3",
        "--dtype",
        "float32",
        "--checkpoint-memory",
        "1",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    assert (got["backend"], got["drafts_per_lane"], got["rows"]) == ("ngram", 3, 8)  # the round plan, as before
    want = lay_out(
        Model(moe),
        Setting(
            build=Build(torch.float32, torch.device("cpu")),
            lanes=2,
            max_len=300,
            backend="ngram",
            draft_tokens=3,
            checkpoint_bytes=1 << 20,
            checkpoint_every=1024,
        ),
        memory=64 << 20,
    )
    free = (64 << 20) - want.bound
    assert got["bytes"] == {**want.lines, "total": want.total, "rss": want.rss, "bound": want.bound, "free": free}
    assert set(got["bytes"]) == {*LINES, "total", "rss", "bound", "free"} and got["fits"] is True
    assert want.rss == want.total  # every expert resident: no mapped expert pages
    assert got["checkpoint_budget"] == 1 << 20 and got["bytes"]["drafter"] == 0


def test_plan_text_says_what_to_change(capsys, moe):
    code, out, _ = run(
        capsys,
        "plan",
        "--model",
        str(moe),
        "--memory",
        "4MiB",
        "--lanes",
        "4",
        "--context",
        "4096",
        "--checkpoint-memory",
        "0",
        "--spec-backend",
        "none",
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "backend          none"  # the round plan first, unchanged
    assert any(line.split()[:1] == ["kv"] for line in lines)
    assert "fits             no: fast memory: it needs" in out
    fix = next(line for line in lines if line.startswith("to fit"))
    assert "any one of: --lanes " in fix and "; --context " in fix


def test_plan_without_model_or_memory_prints_the_round_plan_only(capsys):
    _, out, _ = run(capsys, "plan", "--spec-backend", "mtp", "--spec-draft-tokens", "3", "--lanes", "2")
    assert [line.split()[0] for line in out.splitlines()] == [
        "backend",
        "draft_tokens",
        "row_budget",
        "lanes",
        "plan",
        "drafts_per_lane",
        "rows",
    ]


def test_host_memory_on_a_cpu_is_refused(capsys, moe):
    code, _, err = run(capsys, "plan", "--model", str(moe), "--memory", "1GiB", "--host-memory", "8GiB")
    assert code == 2 and "--host-memory: with --device cpu the model's memory is host memory" in err


def test_generate_refuses_what_does_not_fit_before_loading(capsys, moe, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded for a configuration that does not fit")

    monkeypatch.setattr(Target, "load", no_load)
    code, _, err = run(
        capsys,
        "generate",
        "--model",
        str(moe),
        "--prompt-ids",
        "5,9",
        "--memory",
        "2MiB",
        "--max-lanes",
        "4",
        "--max-len",
        "4096",
        "--checkpoint-memory",
        "0",
    )
    assert code == 2
    assert "speclane generate: error: --memory: this configuration does not fit (fast memory: it needs" in err
    assert "any one of these fits: --max-lanes " in err and "--max-len " in err
    code, _, err = run(capsys, "generate", "--model", str(moe), "--prompt-ids", "5,9", "--memory", "2 MiB")
    assert code == 2 and "--memory: '2 MiB' is not a size" in err


def test_generate_runs_the_expert_slots_the_plan_counted(capsys, moe):
    """8 lanes of ngram at 7 drafts: rounds of 64 rows, whose reserve past a prefill chunk's comes out of the
    cache."""
    flags = [
        "--model",
        str(moe),
        "--dtype",
        "float32",
        "--expert-cache",
        "0.3",
        "--max-len",
        "128",
        "--checkpoint-memory",
        "0",
        "--spec-backend",
        "ngram",
        "--memory",
        "64MiB",
    ]
    _, out, _ = run(capsys, "plan", *flags, "--lanes", "8", "--json")
    plan = json.loads(out)
    assert plan["fits"] and plan["taken_from_expert_cache"] > 0
    code, out, err = run(
        capsys,
        "generate",
        *flags,
        "--max-lanes",
        "8",
        "--prompt-ids",
        "5,9,14,5,9",
        "--max-tokens",
        "4",
        "--json",
        "--threads",
        "1",
    )
    assert code == 0, err
    experts = json.loads(err.strip().splitlines()[-1])["summary"]["experts"]
    one = 3 * 48 * 24 * 4  # a routed expert of the tiny Qwen3-Next in float32
    assert experts["slots"] == plan["expert_slots"] == (int(0.3 * (1 << 20)) - plan["taken_from_expert_cache"]) // one
    assert experts["resident_bytes"] == plan["bytes"]["experts_fast"]


def test_the_runtime_is_measured_once_a_process_and_model(monkeypatch, moe):
    """A profile's probes load the model before the plan is laid out: the plan's `runtime` must be what the process
    held before, so the first measurement is the one every later call gets."""
    monkeypatch.setattr(memory, "_RUNTIME", {})
    held = []
    monkeypatch.setattr(memory, "_measure_runtime", lambda directory: 1000 + len(held))
    first = measured_runtime(moe)
    held.append(torch.ones(1 << 20))  # the weights loading meanwhile
    assert measured_runtime(moe) == first == 1000 and measured_runtime(moe.parent / moe.name) == first


def test_an_artifact_without_a_tokenizer_is_measured_without_one(monkeypatch, artifacts, tmp_path):
    """Random weights for a bench (bench.random_weights --moe) have no tokenizer: `plan --model` on them still lays
    its memory out (with --routing, a GPU profile's figures for a MoE no tokenizer reaches)."""
    monkeypatch.setattr(memory, "_RUNTIME", {})
    bare = artifacts["qwen3_next"][0]
    assert not (bare / "tokenizer.json").exists() and measured_runtime(bare) > 0
