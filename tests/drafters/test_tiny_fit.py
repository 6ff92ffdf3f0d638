"""Fitting works: a few seconds of fitting on the tiny target's greedy continuations raise held-out first-draft
acceptance well above what the untrained drafter gets (a random drafter hits about 1 token in VOCAB = 101).
The thresholds are loose on purpose: 32 training sequences of a random model teach mtp (which reads the trunk's
last state directly) much more than dflash2's five layers, which mostly memorise them (measured: 0.13 held-out
for dflash2, 0.38 for mtp)."""
import pytest


@pytest.mark.parametrize("name", ["dflash2", "mtp"])
def test_fitting_raises_held_out_acceptance(tiny_fitted, name):
    before, after = tiny_fitted[1][name]
    print(f"{name}: first-draft acceptance {before:.3f} -> {after:.3f}")
    floor = 0.08 if name == "dflash2" else 0.25
    assert after > floor and after > before + floor
