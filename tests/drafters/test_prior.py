"""A fitted drafter's prior for the measured draft plan: its own held-out first-draft acceptance from its fit
record, clamped; none without one (the plan's default then)."""

import json
from pathlib import Path

import pytest

from tests.drafters.conftest import write_drafter
from tests.drafters.test_loading import backend


@pytest.mark.parametrize("name", ["mtp", "dflash2"])
def test_the_prior_is_the_fit_records_held_out_first_draft(tiny, tmp_path, name):
    write_drafter(name, tiny, tmp_path)
    assert backend(name, tiny, tmp_path).prior_acceptance() is None  # {"test": true}: no held-out figure
    config = tmp_path / f"{name}.json"
    data = json.loads(config.read_text())
    data["fit"] = {"heldout": {"all": {"rounds": 10, "accept": [0.28, 0.05], "tau": [1.28, 1.33]}}}
    config.write_text(json.dumps(data))
    assert backend(name, tiny, tmp_path).prior_acceptance() == pytest.approx(0.28)
    data["fit"]["heldout"]["all"]["accept"] = [0.0]
    config.write_text(json.dumps(data))
    assert backend(name, tiny, tmp_path).prior_acceptance() == pytest.approx(0.05)  # never stuck at zero


def test_the_shipped_drafters_carry_theirs():
    assets = Path(__file__).parents[2] / "stages" / "models" / "assets"
    for name in ("mtp", "dflash2"):
        record = json.loads((assets / f"{name}.json").read_text())["fit"]
        assert 0 < record["heldout"]["all"]["accept"][0] < 1
