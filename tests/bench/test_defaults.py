"""The defaults section's verdict: a drafter below 0.97x off is a broken promise only when it is further below than
the run's noise, which the control (the speculative path with no drafter: the same work as off) measures beside it."""

from speclane.bench.defaults import CONTROL, lines


def _row(config, lanes, median):
    return {
        "lanes": lanes,
        "config": config,
        "aggregate_tps": {"median": 100.0 * median},
        "speedup": {"median": median, "min": median - 0.1, "max": median + 0.1},
        "tokens_per_round": 1.0,
        "drafted": 0,
    }


def _verdict(rows):
    return lines({"defaults": {"workload": "prose", "skipped": {}, "rows": rows}})


def test_a_drafter_below_the_control_band_is_below_the_promise():
    out = _verdict([_row(CONTROL, 4, 1.02), _row("dflash2", 4, 0.93), _row("ngram", 4, 1.10)])
    assert "  BELOW 0.97x off: dflash2 at 4 lanes" in out
    assert not any("within this run's noise" in line for line in out)


def test_a_drafter_within_the_controls_distance_from_one_is_reported_as_noise():
    out = _verdict([_row(CONTROL, 8, 1.054), _row("mtp", 8, 0.951), _row(CONTROL, 4, 1.0), _row("mtp", 4, 0.96)])
    assert "  BELOW 0.97x off: mtp at 4 lanes" in out  # a control at 1.0: no noise to hide in
    noisy = next(line for line in out if "within this run's noise" in line)
    assert "mtp at 8 lanes (0.951; control 0.946-1.054)" in noisy


def test_every_default_at_or_above_the_promise():
    out = _verdict([_row(CONTROL, 2, 0.9), _row("ngram", 2, 0.99)])
    assert "  every default at or above 0.97x off" in out


def _fake_runs(monkeypatch, spans):
    """lanes_against_off over fake engines: `spans[engine][prompt]` is (decode tokens, decode seconds) of that
    prompt's one-lane batch."""
    from types import SimpleNamespace

    from speclane.bench import sweeps

    def run(eng, items, *a, **k):
        tokens, seconds = spans[eng][items[0][1][0]]
        lane = SimpleNamespace(t_first=0.0, t_done=seconds)
        return [SimpleNamespace(lane=lane, tokens=[0] * (tokens + 1), first_tokens=1, decode_tps=tokens / seconds)]

    monkeypatch.setattr(sweeps, "forget", lambda e: e)
    monkeypatch.setattr(sweeps, "run_batch", run)
    monkeypatch.setattr(sweeps, "speculation", lambda runs, k: {"tokens_per_round": 1.0, "drafted": 0})
    prompts = [{"id": f"p{i}", "ids": [i]} for i in range(len(next(iter(spans.values()))))]
    return sweeps.lanes_against_off({name: name for name in spans}, prompts, 1, 7, 8, 2)


def test_a_chain_is_paired_against_each_part_run_beside_it(monkeypatch):
    """A chain's row carries its ratio to each of its parts measured in the same alternating runs (the goal is a
    chain at least its better part), and the table prints it; a part not run beside it has no ratio."""
    one = [(20, 1.0)]
    rows = _fake_runs(monkeypatch, {"off": [(10, 1.0)], "suffix": one, "suffix+mtp": [(19, 1.0)], "mtp+x": one})
    by = {r["config"]: r for r in rows}
    assert by["suffix+mtp"]["against_parts"]["suffix"]["median"] == 0.95
    assert list(by["suffix+mtp"]["against_parts"]) == ["suffix"]  # mtp was not run beside it
    assert by["mtp+x"]["against_parts"] == {}
    assert "against_parts" not in by["suffix"]
    out = lines({"defaults": {"workload": "prose", "skipped": {}, "rows": rows}})
    assert any(line.startswith("    suffix+mtp / suffix 0.950 (0.950-0.950), paired by batch") for line in out)


def test_the_workload_ratio_weighs_each_batch_by_its_tokens_and_time(monkeypatch):
    """The median of per-batch ratios weighs a short batch as much as a long one; the workload's ratio is its
    tokens over its time, as a user running the batches gets. A chain 25 % faster on the long batch and 9 % slower
    on two short ones is under its part by the first and over it by the second, and both are printed."""
    spans = {
        "off": [(40, 2.0), (10, 0.2), (10, 0.2)],
        "suffix": [(40, 1.0), (10, 0.1), (10, 0.1)],
        "suffix+mtp": [(40, 0.8), (10, 0.11), (10, 0.11)],
    }
    by = {r["config"]: r for r in _fake_runs(monkeypatch, spans)}
    assert round(by["suffix+mtp"]["against_parts"]["suffix"]["median"], 3) == 0.909
    assert round(by["suffix+mtp"]["against_parts_workload"]["suffix"]["median"], 3) == round((60 / 1.02) / 50, 3)
    out = lines({"defaults": {"workload": "prose", "skipped": {}, "rows": list(by.values())}})
    assert any("suffix+mtp / suffix 0.909" in line and "tokens over its time 1.176" in line for line in out)
