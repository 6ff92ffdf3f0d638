"""Profiles state figures with their sources; bad ones are refused naming every bad field; `plan --profile` prints
the candidates' predictions and the choice, and a flag given wins over the derived setting."""

import argparse
import json

import pytest

from speclane.pipeline.cli import derive, main
from speclane.pipeline.runtime.profiles import PROFILE_DIR, known_profiles, load_profile, merge
from speclane.pipeline.runtime.request import SpecKnobs
from speclane.stages.contract.errors import ConfigError


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_shipped_profile_states_figures_with_sources():
    assert {"cpu", "rtx5090", "rtxpro6000"} <= set(known_profiles())
    for name in known_profiles():
        p = load_profile(name)
        for figure in ("fast_memory", "fast_bandwidth", "link", "compute", "probe"):
            f = getattr(p, figure)
            assert f is None or f.source.strip(), (name, figure)
        if p.device == "cuda":
            assert set(p.figures()) == {
                "fast_memory_bytes",
                "fast_bandwidth_bytes_per_s",
                "link_bytes_per_s",
                "compute_flop_per_s",
            }
            assert all(f["source"] for f in p.figures().values())
        else:
            assert p.probe is not None  # a CPU's figures are measured where it runs


def test_pcie_figures_follow_the_generation_and_lanes():
    p = load_profile("rtx5090")
    assert p.link.bytes_per_s == pytest.approx(32e9 * 128 / 130 / 8 * 16)  # 63.0 GB/s a direction
    assert p.figures()["fast_bandwidth_bytes_per_s"]["value"] == 1792e9


@pytest.mark.parametrize(
    "text, message",
    [
        ('device = "cuda"\n[fast_memory]\ngb = 32\n[fast_bandwidth]\ngb_per_s = 1000\n', "'fast_memory.source': Field"),
        (
            'device = "cuda"\n[fast_memory]\ngb = 32\nsource = "x"\n',
            "[fast_bandwidth] missing: a profile without [probe] states the fast memory's size and bandwidth",
        ),
        (
            'device = "cpu"\n[probe]\nsource = "p"\n[link]\npcie_generation = 5\npcie_lanes = 16\ngb_per_s = 9\n'
            'source = "s"\n',
            "'link': give pcie_generation and pcie_lanes, or gb_per_s, not both",
        ),
        (
            'device = "cpu"\n[probe]\nsource = "p"\n[link]\npcie_generation = 6\npcie_lanes = 16\nsource = "s"\n',
            "'link.pcie_generation'",
        ),
        ('device = "cuda"\n[probe]\nsource = "p"\n', "[probe]: the probe measures the CPU it runs on"),
        ('device = "tpu"\n[probe]\nsource = "p"\n', "'device': Input should be 'cpu' or 'cuda'"),
        ("[spec]\ndraft_tokens = 3\n", "'spec': a profile states a machine's figures, not flags"),
        ('device = "cpu"\nmax_lanes = 0\nwat = 1\n[probe]\nsource = "p"\n', "'max_lanes': Input should be greater"),
    ],
)
def test_bad_profiles_name_the_field(tmp_path, capsys, text, message):
    bad = tmp_path / "p.toml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_profile(bad)
    assert message in str(exc.value) and str(bad) in str(exc.value)
    code, _, err = run(capsys, "plan", "--profile", str(bad))
    assert code == 2 and message in err


def test_every_problem_is_named_at_once(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('device = "cpu"\nmax_lanes = 0\nwat = 1\n[probe]\nsource = "p"\n')
    with pytest.raises(ConfigError) as exc:
        load_profile(bad)
    assert "'max_lanes'" in str(exc.value) and "'wat': Extra inputs are not permitted" in str(exc.value)


def test_flags_win_over_the_derived_settings():
    derived = SpecKnobs(backend="mtp", draft_tokens=3, draft_rows=8)
    flags = SpecKnobs.from_flags(backend="ngram", draft_tokens=None, draft_rows=None, draft_head=None, draft_plan=None)
    assert merge(derived, flags).model_dump(exclude_none=True) == {
        "backend": "ngram",
        "draft_tokens": 3,
        "draft_rows": 8,
    }
    assert merge(None, flags) == flags


def test_plan_profile_json_has_candidates_and_choice(capsys):
    code, out, _ = run(capsys, "plan", "--profile", "rtx5090", "--json")
    assert code == 0
    got = json.loads(out)
    assert {"candidates", "choice", "figures", "acceptance", "lanes_weighed"} <= set(got)
    assert got["lanes_weighed"] == [1, 2, 4]
    assert all(f["source"] for f in got["figures"].values())
    off = got["candidates"][0]
    assert (off["backend"], off["score"]) == ("none", 1.0)
    for c in got["candidates"]:
        assert set(c["by_lanes"]) == {"1", "2", "4"}
        for n, r in c["by_lanes"].items():
            assert r["tokens_per_s"] == pytest.approx(r["tokens_per_round"] / sum(r["round_seconds"].values()))
            assert 1 <= r["tokens_per_round"] / int(n) <= 1 + r["drafts_per_lane"]
    choice = got["choice"]
    assert any(
        (c["backend"], c["draft_tokens"], c["row_budget"])
        == (choice["backend"], choice["draft_tokens"], choice["row_budget"])
        and c["score"] == choice["score"]
        for c in got["candidates"]
    )
    assert choice["score"] == max(c["score"] for c in got["candidates"] if c["score"] is not None)
    # the round plan beside it follows the choice, and a flag given wins over it
    assert got["backend"] == choice["backend"]
    code, out, _ = run(capsys, "plan", "--profile", "rtx5090", "--spec-backend", "ngram", "--json")
    assert json.loads(out)["backend"] == "ngram" and json.loads(out)["choice"] == choice


def round_probe(proposals, accept=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)):
    """A stand-in for the round probe: rounds of a pass-like cost a lane and a row, `accept` for mtp, less for the
    other drafters, `proposals` for the model drafters."""

    def probe(target, tok, backend, lanes, prompts=None, tokens=0):
        widths = derive.drafter_probe.widths(backend)
        rounds = tuple((n, w, 0.010 + 0.0011 * n + 0.0004 * n * w) for n in lanes for w in widths)
        if backend == "none":
            return derive.drafter_probe.Probed(rounds, where="test")
        acc = accept if backend == "mtp" else tuple(a / 3 for a in accept)
        return derive.drafter_probe.Probed(rounds, proposals if backend != "ngram" else (), acc, "test")

    return probe


def test_the_cpu_profile_derives_from_the_probe(monkeypatch, capsys):
    rows = (1, 2, 4, 8, 16, 32, 64)
    seconds = (0.010, 0.0102, 0.0105, 0.0115, 0.0160, 0.0260, 0.0460)  # 8 rows cost 1.15x one: drafting pays

    def fake_probe(target, costs, max_rows):
        costs.set_probe(rows, seconds, "test table")

    monkeypatch.setattr(derive, "pass_costs", fake_probe)
    proposals = ((1, 1, 0.001), (1, 7, 0.004), (4, 1, 0.002), (4, 7, 0.008))
    monkeypatch.setattr(derive.drafter_probe, "probe", round_probe(proposals))
    code, out, _ = run(capsys, "plan", "--profile", "cpu", "--json")
    assert code == 0
    got = json.loads(out)
    assert got["figures"]["pass_seconds"]["value"] == {str(r): s for r, s in zip(rows, seconds)}
    assert "test table" in got["figures"]["pass_seconds"]["source"]
    assert got["choice"]["backend"] != "none"
    assert got["figures"]["mtp_proposal_seconds"]["value"]["4 lane(s), 7 draft(s)"] == 0.008
    assert got["figures"]["none_round_seconds"]["value"]["2 lane(s), 0 draft(s)"] == pytest.approx(0.0122)
    assert "round probe" in got["acceptance"]["ngram"] and "round probe" in got["acceptance"]["mtp"]
    # at a measured setting the prediction is the measured round: off at 2 lanes commits 2 tokens in 12.2 ms
    off = got["candidates"][0]["by_lanes"]["2"]
    assert off["tokens_per_s"] == pytest.approx(2 / 0.0122) and "rest" in off["round_seconds"]
    # the fitted figures: a pass of r rows about a + b r
    bw = got["figures"]["fast_bandwidth_bytes_per_s"]["value"]
    assert 1e9 < bw < 1e12


def test_commands_derive_once_and_say_so(capsys):
    args = argparse.Namespace(profile="rtx5090", model=None, spec="verify", max_lanes=None)
    knobs = derive.derived_knobs(args, 4)
    first = capsys.readouterr().err
    assert first.startswith("profile rtx5090: ") and knobs == args._derivation.knobs
    assert derive.derived_knobs(args, 4) == knobs and capsys.readouterr().err == ""
    cpu = argparse.Namespace(profile=str(PROFILE_DIR / "cpu.toml"), model=None, spec="verify")
    assert derive.derived_knobs(cpu, 4) is None  # the probe needs the loaded model: derived after the load
