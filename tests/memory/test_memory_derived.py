"""--memory with --profile: the configuration checked is the one that runs, after the profile's derivation. A derived
setting that does not fit is not run: the best-rated candidate that fits is, and the derived line says what memory
left out; a setting the flags give that does not fit is refused before a weight loads."""

import json

import pytest
import torch

from speclane.pipeline.cli import derive, main, memory
from speclane.pipeline.runtime import plan_figures
from speclane.pipeline.runtime.memory_plan import Model, Setting, lay_out
from speclane.pipeline.runtime.model_bytes import Build
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.target import Target
from tests.models.target_artifacts import VOCAB, artifacts, with_words  # noqa: F401  (fixtures)
from tests.pipeline.test_profiles import round_probe

ACCEPT = [0.95, 0.9, 0.86, 0.82, 0.78, 0.75, 0.72]  # mtp's stated held-out acceptance: drafting pays
F32 = Build(torch.float32, torch.device("cpu"))


def _with_mtp(where):
    """Random mtp drafter files beside the artifact at `where`, stating `ACCEPT` as their held-out acceptance."""
    target = Target.load(where, dtype=torch.float32)
    torch.manual_seed(0)
    net = dw.new_net("mtp", target.cfg)
    ranks = {"shortlist.ranks": torch.arange(target.cfg.vocab_size, dtype=torch.int32)}
    dw.export("mtp", net, where, {"heldout": {"all": {"accept": ACCEPT}}}, ranks)
    return where


@pytest.fixture(scope="module")
def dense(artifacts, tmp_path_factory):  # noqa: F811
    return _with_mtp(with_words(artifacts["llama"][0], tmp_path_factory.mktemp("derived") / "llama"))


@pytest.fixture(scope="module")
def moe(artifacts, tmp_path_factory):  # noqa: F811
    return _with_mtp(with_words(artifacts["qwen3_next"][0], tmp_path_factory.mktemp("derived") / "qwen3_next"))


@pytest.fixture(autouse=True)
def probed(monkeypatch, tmp_path):
    """No process bytes in the plan, and the probes' tables made up (a pass of 8 rows costs 1.15x one)."""
    monkeypatch.setattr(memory, "runtime_bytes", lambda directory: 0)
    rows = (1, 2, 4, 8, 16, 32, 64)
    seconds = (0.010, 0.0102, 0.0105, 0.0115, 0.0160, 0.0260, 0.0460)
    monkeypatch.setattr(derive, "pass_costs", lambda target, costs, most: costs.set_probe(rows, seconds, "test"))
    proposals = ((1, 1, 0.0001), (1, 7, 0.0004), (4, 1, 0.0002), (4, 7, 0.0008))
    monkeypatch.setattr(derive.drafter_probe, "probe", round_probe(proposals))
    monkeypatch.setattr(plan_figures, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(plan_figures, "ROUTING_TOKENS", 24)


def _card(tmp_path) -> str:
    """A profile that states a CPU's figures (derived before the weights load)."""
    path = tmp_path / "card.toml"
    path.write_text(
        'device = "cpu"\nmax_lanes = 1\n[fast_memory]\ngb = 64\nsource = "test"\n'
        '[fast_bandwidth]\ngb_per_s = 50\nsource = "test"\n[compute]\ntflops = 1\nsource = "test"\n'
    )
    return str(path)


def _generate(capsys, model, *flags):
    argv = ["generate", "--model", str(model), "--dtype", "float32", "--prompt-ids", "5,9,14,5,9", "--max-tokens"]
    argv += ["4", "--max-len", "64", "--checkpoint-memory", "0", "--threads", "1", "--json", *flags]
    code = main(argv)
    _, err = capsys.readouterr()
    return code, err


def _bound(model, backend: str, **more) -> int:
    k = 7 if backend != "none" else 0
    s = Setting(F32, lanes=1, max_len=64, backend=backend, draft_tokens=k, head="shortlist", **more)  # the spec's head
    return lay_out(Model(model), s).bound


def _derived(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("profile "))


def test_a_derived_drafter_that_does_not_fit_is_left_out_saying_so(dense, capsys):
    """The cpu profile derives after the weights load (its probe needs them), from the configuration that runs."""
    profile = "cpu"
    off, mtp = _bound(dense, "none"), _bound(dense, "mtp")
    assert mtp > 2 * off  # the drafter is most of the bytes
    code, err = _generate(capsys, dense, "--profile", profile, "--memory", f"{mtp}B")
    assert code == 0, err
    assert _derived(err).startswith(f"profile {profile}: mtp")  # room for it: derived and run
    code, err = _generate(capsys, dense, "--profile", profile, "--memory", f"{(off + mtp) // 2}B")
    assert code == 0, err
    line = _derived(err)
    assert not line.startswith(f"profile {profile}: mtp") and "speculation off, does not fit --memory" in line
    assert "; mtp at 7 draft tokens" in line


def test_a_drafter_the_flags_give_that_does_not_fit_is_refused_before_loading(dense, capsys, tmp_path, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded for a configuration that does not fit")

    monkeypatch.setattr(Target, "load", no_load)
    half = (_bound(dense, "none") + _bound(dense, "mtp")) // 2
    for profile in ("cpu", _card(tmp_path)):
        code, err = _generate(capsys, dense, "--profile", profile, "--spec-backend", "mtp", "--memory", f"{half}B")
        assert code == 2 and "--memory: this configuration does not fit" in err
        assert "--spec-backend none" in err


def test_the_expert_slots_loaded_before_a_probe_derivation_leave_the_drafter_room(moe, capsys):
    """The cpu profile derives after the weights load, with the expert cache sized for the flags' configuration
    (ngram: every expert a slot): a derived mtp then holds its head beside those slots, not out of them as the
    derivation's own plan counts it, so it runs only where --memory has room for both."""
    one = 3 * 48 * 24 * 4  # a routed expert of the tiny Qwen3-Next in float32; 4 MoE layers of 7
    head = _bound(moe, "mtp") - _bound(moe, "ngram")  # the drafter's bytes, every expert resident in both
    cache = head + 10 * one  # mtp out of this budget leaves 10 slots, ngram takes all 28
    planned, held = _bound(moe, "mtp", expert_cache_bytes=cache), _bound(moe, "mtp")
    assert planned < held
    flags = ("--profile", "cpu", "--expert-cache", f"{(cache + 1) / (1 << 20):.9f}")
    code, err = _generate(capsys, moe, *flags, "--memory", f"{(planned + held) // 2}B")
    assert code == 0, err
    line = _derived(err)
    assert not line.startswith("profile cpu: mtp")
    assert "; mtp at 7 draft tokens, 8 rows does not fit --memory as it runs here (fast memory: it needs" in line
    assert json.loads(err.strip().splitlines()[-1])["summary"]["experts"]["slots"] == 28
    code, err = _generate(capsys, moe, *flags, "--memory", f"{held}B")
    assert code == 0, err
    assert _derived(err).startswith("profile cpu: mtp")
    assert json.loads(err.strip().splitlines()[-1])["summary"]["experts"]["slots"] == 28
