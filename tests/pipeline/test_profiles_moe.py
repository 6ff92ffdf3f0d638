"""`plan --profile` on a MoE target: the routing is recorded once and cached, the expert slots are what the profile's
fast memory leaves the experts, and a model without drafter files has those backends skipped, saying why."""

import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from speclane.pipeline.cli import main, memory
from speclane.pipeline.runtime import plan_figures
from speclane.pipeline.runtime.memory_plan import Model, Setting, lay_out
from speclane.pipeline.runtime.model_bytes import Build
from tests.models.target_artifacts import VOCAB, artifacts, with_words  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def moe(artifacts, tmp_path_factory):  # noqa: F811
    """The tiny Qwen3-Next with a word-level tokenizer."""
    return with_words(artifacts["qwen3_next"][0], tmp_path_factory.mktemp("profile-moe") / "qwen3_next")


def _profile(tmp_path, gb: float) -> str:
    path = tmp_path / "card.toml"
    path.write_text(
        f'device = "cuda"\nmax_lanes = 2\n[fast_memory]\ngb = {gb!r}\nsource = "test"\n'
        '[fast_bandwidth]\ngb_per_s = 1000\nsource = "test"\n'
        '[link]\npcie_generation = 3\npcie_lanes = 16\nsource = "test"\n'
    )
    return str(path)


def test_the_fast_tier_gets_what_the_plan_leaves(moe, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plan_figures, "cache_root", lambda: tmp_path / "cache")  # the routing cache only
    monkeypatch.setattr(plan_figures, "ROUTING_TOKENS", 24)
    monkeypatch.setattr(memory, "runtime_bytes", lambda directory: 0)
    model = Model(moe)
    every = sum(model.cfg.moe_layers) * model.cfg.num_experts
    setting = Setting(Build(torch.bfloat16, torch.device("cuda")), lanes=2, max_len=4096, checkpoint_bytes=512 << 20)
    plan = lay_out(model, setting)
    rest = plan.bound - plan.lines["experts_fast"]
    third = (rest + every // 3 * plan.one_expert) / 1e9  # everything else, and a third of the experts
    code = main(["plan", "--profile", _profile(tmp_path, third), "--model", str(moe), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert set(got["skipped"]) == {"mtp", "dflash2"}  # no drafter files beside this artifact
    off = got["candidates"][0]
    assert off["backend"] == "none" and abs(off["expert_slots"] - every // 3) <= 1
    assert off["by_lanes"]["1"]["round_seconds"]["copies"] > 0  # a third of the experts: some are copied in
    assert any("expert tier is not built" in n for n in got["notes"])
    assert len(list((tmp_path / "cache" / "routing").glob("*.json"))) == 1  # recorded once, cached
    code = main(["plan", "--profile", _profile(tmp_path, 1000.0), "--model", str(moe), "--json"])
    got = json.loads(capsys.readouterr().out)
    off = got["candidates"][0]
    assert off["expert_slots"] == every and off["by_lanes"]["1"]["round_seconds"]["copies"] == 0


def test_a_routing_trace_recorded_elsewhere_is_planned_with_instead_of_recording(moe, tmp_path, monkeypatch, capsys):
    """`plan --routing TRACE`: the round model reads the trace (nothing recorded, nothing cached): a trace that keeps
    to the same experts copies less than one that walks every expert; a trace the model cannot take, or --routing
    without --profile, is refused naming the flag."""
    from speclane.stages.models.routing_trace import RowRouting

    monkeypatch.setattr(plan_figures, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(memory, "runtime_bytes", lambda directory: 0)
    model = Model(moe)
    cfg = model.cfg
    n, e, k = sum(cfg.moe_layers), cfg.num_experts, cfg.experts_per_token
    setting = Setting(Build(torch.bfloat16, torch.device("cuda")), lanes=2, max_len=4096, checkpoint_bytes=512 << 20)
    plan = lay_out(model, setting)
    half = (plan.bound - plan.lines["experts_fast"] + n * e // 2 * plan.one_expert) / 1e9  # half the experts fast
    same = torch.tensor([list(range(k))] * 64)
    walk = torch.tensor([[(t * k + j) % e for j in range(k)] for t in range(64)])
    copies = {}
    for name, ids in (("same", same), ("walk", walk)):
        RowRouting(e, k, (ids,) * n, name).save(tmp_path / name)
        argv = ["plan", "--profile", _profile(tmp_path, half), "--model", str(moe), "--routing", str(tmp_path / name)]
        code = main([*argv, "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        copies[name] = json.loads(out)["candidates"][0]["by_lanes"]["1"]["round_seconds"]["copies"]
    assert copies["same"] == 0 < copies["walk"]  # the model's own routing would plan both alike
    assert not (tmp_path / "cache" / "routing").exists()  # nothing recorded
    RowRouting(e, k + 1, (torch.zeros(2, k + 1, dtype=torch.long),) * n).save(tmp_path / "wide")
    code = main(
        ["plan", "--profile", _profile(tmp_path, 1e-3), "--model", str(moe), "--routing", str(tmp_path / "wide")]
    )
    assert code != 0 and "--routing: the trace routes to" in capsys.readouterr().err
    code = main(["plan", "--model", str(moe), "--routing", str(tmp_path / "same")])
    assert code != 0 and "--routing feeds the round model of a --profile plan" in capsys.readouterr().err
