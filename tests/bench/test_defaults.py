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


def test_a_chain_is_paired_against_each_part_run_beside_it(monkeypatch):
    """A chain's row carries its ratio to each of its parts measured in the same alternating runs (the goal is a
    chain at least its better part), and the table prints it; a part not run beside it has no ratio."""
    from types import SimpleNamespace

    from speclane.bench import sweeps

    speed = {"off": 10.0, "suffix": 20.0, "suffix+mtp": 19.0, "mtp+x": 30.0}
    monkeypatch.setattr(sweeps, "forget", lambda e: e)
    monkeypatch.setattr(
        sweeps, "run_batch", lambda eng, items, *a, **k: [SimpleNamespace(tps=speed[eng], decode_tps=speed[eng])]
    )
    monkeypatch.setattr(sweeps, "aggregate", lambda runs: runs[0].tps)
    monkeypatch.setattr(sweeps, "speculation", lambda runs, k: {"tokens_per_round": 1.0, "drafted": 0})
    engines = {name: name for name in speed}
    rows = sweeps.lanes_against_off(engines, [{"id": "p", "ids": [1]}], 1, 7, 8, 2)
    by = {r["config"]: r for r in rows}
    assert by["suffix+mtp"]["against_parts"]["suffix"]["median"] == 0.95
    assert list(by["suffix+mtp"]["against_parts"]) == ["suffix"]  # mtp was not run beside it
    assert by["mtp+x"]["against_parts"] == {}
    assert "against_parts" not in by["suffix"]
    out = lines({"defaults": {"workload": "prose", "skipped": {}, "rows": rows}})
    assert "    suffix+mtp / suffix 0.950 (0.950-0.950), paired" in out
