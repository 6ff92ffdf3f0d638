"""The wide prefill's dtype route is measured once per machine and kept: a second process reads the choice back
instead of timing again, so back-to-back runs take (and report) the same route."""

from __future__ import annotations

import json

import torch

from speclane.kernels import wide_linear


def test_the_choice_is_measured_once_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLANE_CACHE", str(tmp_path))
    monkeypatch.setattr(wide_linear, "_WIDEN", {})
    first = wide_linear.widens(torch.bfloat16)
    files = list((tmp_path / "kernels" / "wide_linear").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["widen"] == first
    files[0].write_text(json.dumps({"widen": not first}))  # what another run measured: it is what counts now
    monkeypatch.setattr(wide_linear, "_WIDEN", {})
    timed = []
    monkeypatch.setattr(wide_linear, "_best_of", lambda fn, reps=3: timed.append(fn) or 1.0)
    assert wide_linear.widens(torch.bfloat16) is (not first) and not timed
    files[0].write_text("not json")  # a damaged cache only means measuring again
    monkeypatch.setattr(wide_linear, "_WIDEN", {})
    wide_linear.widens(torch.bfloat16)
    assert timed
