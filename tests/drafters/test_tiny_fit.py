"""Fitting works: a few seconds of fitting on the tiny target's greedy continuations raise held-out first-draft
acceptance well above what the untrained drafter gets (a random drafter hits about 1 token in VOCAB = 101).
Measured: dflash2 0.007 -> 0.86, mtp 0.024 -> 0.90 on 40 held-out continuations after 200 steps."""
import pytest


@pytest.mark.parametrize("name", ["dflash2", "mtp"])
def test_fitting_raises_held_out_acceptance(tiny_fitted, name):
    before, after = tiny_fitted[1][name]
    print(f"{name}: first-draft acceptance {before:.3f} -> {after:.3f}")
    assert after > 0.5 and after > before + 0.4
