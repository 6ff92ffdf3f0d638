"""The pass is ready for CUDA graph capture per row bucket (issue 14; bench/cuda_graphs.py captures it on a GPU).

What a graph needs, checked here without a GPU: (1) a layout built outside the pass, with every shape fixed (the key
length too), gives the same pass as the layout the pass builds itself; (2) a captured layout takes another pass's
positions in place; (3) the device route (the one a GPU runs: torch ops, no C kernels) reads no device value on
the host, which on the meta device is an error (a tensor there has no values to read). One exception, by design:
the MoE experts' torch twin groups rows by expert on the host (free on a CPU); a GPU runs the triton kernel
(kernels/moe_triton.py), so here the twin is replaced by an all-experts product of the same shape.
"""

from __future__ import annotations

import pytest
import torch

from speclane.bench.pass_ops import _all_experts
from speclane.bench.pass_ops import to_meta as _to_meta
from speclane.stages.contract.errors import ContractError
from speclane.stages.models.layout import PassLayout
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts, family, prefill, prompt  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _verify_batch(slot_pos: list[tuple[int, int]], rows: int, seed: int = 1) -> RowBatch:
    return RowBatch.build([(slot, pos, prompt(rows, seed + slot)) for slot, pos in slot_pos])


def test_fixed_key_layout_gives_the_same_pass(family):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32, hidden_taps=(0,))
    outs = []
    for fixed in (False, True):
        state = target.new_state(slots=2, max_len=96)
        for slot in (0, 1):
            prefill(target, state, slot, prompt(20 + 7 * slot, seed=slot))
        batch = _verify_batch([(0, 20), (1, 27)], rows=4)
        lay = (
            PassLayout.build(batch, state.max_len, Target.key_capacity(state), keys=Target.key_capacity(state))
            if fixed
            else None
        )
        outs.append(target.forward(batch, state, layout=lay))
    assert torch.equal(outs[0].logits, outs[1].logits), name
    assert torch.equal(outs[0].taps, outs[1].taps), name


def test_refill_takes_another_pass_in_place_and_refuses_other_shapes():
    capacity = 128
    first = PassLayout.build(_verify_batch([(0, 5), (1, 9)], rows=3), 128, capacity, keys=capacity)
    second = PassLayout.build(_verify_batch([(1, 40), (0, 17)], rows=3), 128, capacity, keys=capacity)
    kept = first.write_pos
    first.refill_(second)
    assert first.write_pos is kept
    for name in ("write_pos", "row_keys", "write_slot", "mask", "pad_index"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    with pytest.raises(ContractError, match="keys"):
        PassLayout.build(_verify_batch([(0, 120)], rows=3), 128, capacity, keys=64)
    with pytest.raises(ContractError, match="do not match"):
        first.refill_(PassLayout.build(_verify_batch([(0, 5)], rows=2), 128, capacity, keys=capacity))


@pytest.mark.parametrize("rows", [1, 4, 8])
def test_device_route_reads_nothing_on_the_host(family, rows, monkeypatch):
    import speclane.kernels.moe

    monkeypatch.setattr(speclane.kernels.moe, "moe_experts_ref", _all_experts)
    name, path, _ = family
    real = Target.load(path, dtype=torch.float32, hidden_taps=(0,))
    target = Target(real.cfg, _to_meta(real.weights), torch.float32, "meta", real.hidden_taps)
    state = target.new_state(slots=2, max_len=64)
    batch = _verify_batch([(0, 10), (1, 30)], rows=rows)
    batch = RowBatch(
        tokens=batch.tokens.to("meta"),
        positions=batch.positions.to("meta"),
        cu_rows=batch.cu_rows.to("meta"),
        slots=batch.slots.to("meta"),
        lane_rows=batch.lane_rows,
        lane_start=batch.lane_start,
    )
    lay = PassLayout.build(batch, state.max_len, Target.key_capacity(state), keys=Target.key_capacity(state))
    out = target.forward(batch, state, layout=lay)  # any .item(), .tolist() or bool(tensor) inside raises here
    target.commit(state, batch, torch.ones(2, dtype=torch.int64, device="meta"), out)
    assert out.logits.shape == (2 * rows, real.cfg.vocab_size) and out.logits.device.type == "meta", name
