"""A wide prefill chunk's attention (past the decode route's 64 rows): one fused product a lane, causal from each
lane's own start, equal (to float32 rounding) to every row attending on its own (the per-row C kernel, the route
before), for one lane and for several lanes of different lengths and starts in one pass."""

import pytest
import torch

from speclane.bench.prefill import _rows_attention
from speclane.kernels import cpu_build
from speclane.stages.models import attention
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts, family, prefill, prompt  # noqa: F401

pytestmark = pytest.mark.skipif(cpu_build.library() is None, reason="the per-row route is the C kernel")


def _pass(target, lanes, monkeypatch, rows_route: bool):
    if rows_route:  # the C kernel, whichever route this build takes for wide chunks
        monkeypatch.setattr(attention, "wide_attention", _rows_attention)
    else:  # the fused product, even where the C kernel serves wide chunks too (kernels/decode_attention.py)
        monkeypatch.setattr(attention, "serves_wide", lambda head_dim: False)
    state = target.new_state(slots=2, max_len=256)
    for slot, (start, _) in enumerate(lanes):
        if start:
            prefill(target, state, slot, prompt(start, seed=slot))
    batch = RowBatch.build([(slot, start, prompt(n, seed=10 + slot)) for slot, (start, n) in enumerate(lanes)])
    out = target.forward(batch, state)
    monkeypatch.undo()
    return out.logits


@pytest.mark.parametrize("lanes", [[(0, 100)], [(0, 70)], [(30, 40), (5, 50)]])
def test_wide_chunks_attend_as_every_row_alone(family, lanes, monkeypatch):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    assert sum(n for _, n in lanes) > 64  # past the decode route: the wide path runs
    fused = _pass(target, lanes, monkeypatch, rows_route=False)
    rows = _pass(target, lanes, monkeypatch, rows_route=True)
    torch.testing.assert_close(fused, rows, rtol=1e-4, atol=1e-4, msg=name)
