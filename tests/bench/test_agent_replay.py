"""speclane.bench.agent_replay: its tool results are the compiler's own verdicts, its tasks share the repository's
files, its plot is an SVG drawn with no plotting package, bad settings are refused naming the flag, and it runs end
to end on the embedded model with tiny settings (no timing assertions)."""

import json
import sys

import pytest

from speclane.bench import agent_plot, agent_replay


def test_the_run_result_is_the_compilers_verdict():
    assert "it compiles" in agent_replay.run_result("```python\nx = 1\n```", "a.py")
    bad = agent_replay.run_result("```python\ndef f(:\n```", "a.py")
    assert bad.startswith("$ python -m py_compile a.py\n") and "SyntaxError" in bad


def test_tasks_share_the_repositorys_files():
    work = agent_replay.tasks(4, 2)
    names = [t["file"][0] for t in work]
    assert len(set(names)) == 2 and names[0] == names[2] and names[1] == names[3]
    assert all(t["edit"] and len(t["file"][1]) >= 200 for t in work)
    first = agent_replay.first_turn(work[0])
    later = agent_replay.next_turn(work[0], 3, "```python\nx = (\n```")
    assert names[0] in first and "read_file" in first and "SyntaxError" in later and "Apply the same edit" in later


def test_the_plot_is_svg_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    turn = {"decoded": 10, "rounds": 4}
    rows = [{"backend": b, "lanes": n, "agents": {"per_turn": [turn] * 8}} for b in ("none", "suffix") for n in (1, 4)]
    agent_replay.svg_plot(rows, str(tmp_path / "p.svg"))
    text = (tmp_path / "p.svg").read_text()
    assert text.startswith("<svg") and text.count("<polyline") == 4 and "suffix, 4 lane(s)" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--turns", "7"], "--turns must be from 8 to 20"),
        (["--lanes", "0"], ">= 1"),
        (["--backends", "suffix:max_drafts=x"], "'max_drafts=x' must be OPTION=NUMBER"),
        (["--backends", "sufix"], "unknown backend 'sufix'"),
    ],
)
def test_bad_settings_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        agent_replay.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_backends_options_go_to_its_spec_table():
    assert agent_replay.backend_options("suffix:max_drafts=15,min_prob=0.2") == (
        "suffix",
        {"max_drafts": 15, "min_prob": 0.2},
    )
    assert agent_replay.backend_options("ngram") == ("ngram", {})
    assert agent_replay.backend_options("oracle:max_drafts=15") == ("oracle", {"max_drafts": 15})


def test_it_runs_end_to_end(tmp_path):
    out = tmp_path / "r.json"
    argv = ["--agents", "1", "--turns", "8", "--max-tokens", "2", "--lanes", "1", "--backends", "suffix"]
    assert agent_replay.main([*argv, "--prose", "1", "--json", str(out), "--plot", str(tmp_path / "p.svg")]) == 0
    res = json.loads(out.read_text())
    assert [(r["backend"], r["lanes"]) for r in res["rows"]] == [("suffix", 1)]
    assert all(len(r["agents"]["per_turn"]) == 8 and r["prose"]["decoded"] > 0 for r in res["rows"])
    assert len(res["conversations"][0]) == 1 + 2 * 8  # system, then a user and an assistant message a turn


def test_each_group_runs_on_every_engine_in_an_order_reversed_from_group_to_group(monkeypatch):
    calls = []

    def measure(engine, group, lanes, max_tokens):
        calls.append(engine)
        return {"decoded": 10 * len(group), "rounds": 5, "drafting": 4, "seconds": 1.0 if engine == "a" else 0.5}

    monkeypatch.setattr(agent_replay, "_measure", measure)
    convs = [
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "x"}]
    ]
    out = agent_replay.replay({"a": "a", "b": "b"}, convs * 3, 1, 8)
    assert calls == ["a", "b", "b", "a", "a", "b"]  # one turn, three groups of one lane
    assert [len(out[b]["groups"]) for b in "ab"] == [3, 3] and out["a"]["tokens_per_round"] == 2.0
    rows = [{"backend": b, "lanes": 1, "agents": out[b]} for b in "ab"]
    total, each = agent_plot.ratios(rows, "b", "a", 1, "agents")
    assert total == 2.0 and each == [2.0, 2.0, 2.0]


def test_the_oracle_drafts_the_recorded_answers(tmp_path):
    out = tmp_path / "r.json"
    argv = ["--agents", "1", "--turns", "8", "--max-tokens", "12", "--lanes", "1", "--prose", "0"]
    assert agent_replay.main([*argv, "--backends", "none", "oracle:max_drafts=15", "--json", str(out)]) == 0
    none, oracle = (r["agents"] for r in json.loads(out.read_text())["rows"])
    assert [t["decoded"] for t in oracle["per_turn"]] == [t["decoded"] for t in none["per_turn"]]
    assert oracle["drafting"] > 0 and oracle["tokens_per_round"] > 1.5  # its drafts name the answers' tokens


def test_a_drafters_share_of_the_oracles_gain_is_read_from_the_totals(capsys):
    def row(backend, tok_s):
        turn = {"decoded": 60, "rounds": 10, "drafting": 5, "seconds": 60 / tok_s}
        return {
            "backend": backend,
            "lanes": 1,
            "agents": {**turn, "tokens_per_round": 6.0, "tokens_per_s": tok_s, "per_turn": [turn], "groups": [turn]},
        }

    rows = [row("ngram", 100.0), row("suffix", 130.0), row("oracle:max_drafts=15", 160.0)]
    assert agent_plot.ceiling_share(rows, "suffix", "oracle:max_drafts=15", 1, "agents") == pytest.approx(0.5)
    assert agent_plot.ceiling_share(rows, "suffix", "ngram", 1, "agents") is None  # no gain to share
    args = type("Args", (), {"lanes": [1], "prose": 0, "backends": ["ngram", "suffix", "oracle:max_drafts=15"]})
    agent_plot.report(rows, args)
    out = capsys.readouterr().out
    assert "1.30x ngram" in out and "50% of the oracle's gain over ngram" in out
    assert out.count("of the oracle's gain") == 1  # neither ngram nor the oracle itself
