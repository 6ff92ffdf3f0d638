"""moe_experts: the grouped-expert triton kernels against the torch twin, their layout, and no host copy."""

from __future__ import annotations

import pytest
import torch
from interpreted import require_interpreted_triton

from speclane.kernels import moe as moe_mod
from speclane.kernels import moe_triton as moe_triton_mod
from speclane.kernels.moe import moe_experts, moe_experts_ref
from speclane.kernels.moe_triton import moe_align


def _layer(experts=7, hidden=40, inter=24, rows=11, k=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=g) * 0.2).to(dtype)
    top_w, top_i = torch.rand(rows, experts, generator=g).softmax(-1).topk(k, dim=-1)
    return x, gate_up, down, top_i, top_w.to(dtype)


def test_twin_is_the_routed_sum():
    x, gate_up, down, top_i, top_w = _layer()
    got = moe_experts(x, gate_up, down, top_i, top_w)
    want = torch.zeros_like(x)
    for r in range(x.shape[0]):
        for j in range(top_i.shape[1]):
            gate, up = (gate_up[top_i[r, j]] @ x[r]).chunk(2)
            want[r] += top_w[r, j] * (down[top_i[r, j]] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,k,experts,block_m", [(11, 3, 7, 4), (1, 1, 5, 16), (6, 2, 40, 4), (0, 2, 3, 4)])
def test_align_places_every_pair_once_in_a_block_of_its_expert(rows, k, experts, block_m):
    g = torch.Generator().manual_seed(rows + k)
    top_i = (
        torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(rows)])
        if rows
        else torch.zeros(0, k, dtype=torch.long)
    )
    ids, block_expert = moe_align(top_i, experts, block_m)
    pairs = rows * k
    assert ids.shape == (block_expert.shape[0] * block_m,)
    real = ids[ids < pairs].long()
    assert sorted(real.tolist()) == list(range(pairs))  # every pair exactly once
    blocks = ids.view(-1, block_m)
    flat = top_i.reshape(-1)
    for b in range(blocks.shape[0]):
        inside = blocks[b][blocks[b] < pairs].long()
        if block_expert[b] == experts:  # idle block: only the sentinel
            assert len(inside) == 0
        else:
            assert len(inside) > 0 and bool((flat[inside] == block_expert[b]).all())
            assert torch.equal(inside, inside.sort().values)  # stable: a row's pairs in row order
    live = block_expert[block_expert < experts]
    assert torch.equal(live, live.sort().values)  # experts in increasing index


def test_what_runs_around_the_kernels_needs_no_host_value():
    """The set-up and the final sum run on the device with no value read back (a read would stall a GPU every MoE
    layer and cannot be captured in a CUDA graph). Meta tensors carry shapes and no data, so any op that needs a
    value (item, bincount, nonzero, a boolean mask) fails on them."""
    top_i = torch.zeros(11, 3, dtype=torch.long, device="meta")
    top_w, ids, block_expert = moe_triton_mod.route_layout(top_i, torch.zeros(11, 3, device="meta"), 7, 4)
    assert ids.shape == (block_expert.shape[0] * 4,) and top_w.shape == (11, 3)
    assert moe_triton_mod.add_slots(torch.zeros(11, 3, 40, device="meta")).shape == (11, 40)
    with pytest.raises(NotImplementedError):  # the check can fail: bincount reads its max on the host
        torch.bincount(top_i.reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_matches_twin_and_rows_do_not_see_each_other(dtype):
    require_interpreted_triton(moe_triton_mod)
    x, gate_up, down, top_i, top_w = _layer(dtype=dtype)
    kw = dict(block_m=16, block_n=16, block_k=16)  # 40, 24: ragged against the tiles
    got = moe_triton_mod.moe_experts_triton(x, gate_up, down, top_i, top_w, **kw)
    # A row's bits must not depend on its neighbours' values: give every other row new values and the same
    # routing, so each pair keeps its place in its block, and the row must not move by one bit. (Comparing with
    # the row run alone would also compare tile positions: the interpreter's tl.dot is numpy's BLAS, whose
    # rounding of a tile row depends on the row's place in the tile on some CPUs, e.g. AVX2 EPYCs. That is
    # the BLAS, not this kernel; alone, a row is checked to float rounding below.)
    g = torch.Generator().manual_seed(7)
    for r in (0, 5, x.shape[0] - 1):
        other = torch.randn(x.shape, generator=g).to(dtype)
        other[r] = x[r]
        assert torch.equal(moe_triton_mod.moe_experts_triton(other, gate_up, down, top_i, top_w, **kw)[r], got[r]), r
    alone = torch.cat(
        [
            moe_triton_mod.moe_experts_triton(x[r : r + 1], gate_up, down, top_i[r : r + 1], top_w[r : r + 1], **kw)
            for r in range(x.shape[0])
        ]
    )
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(got, alone, **tol)
    # the slots in another order: the terms are still added in increasing expert index
    flip = torch.flip(torch.arange(top_i.shape[1]), [0])
    assert torch.equal(moe_triton_mod.moe_experts_triton(x, gate_up, down, top_i[:, flip], top_w[:, flip], **kw), got)
    want = moe_experts_ref(x, gate_up, down, top_i, top_w)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_triton_leaves_no_pair_unwritten_with_many_idle_blocks():
    require_interpreted_triton(moe_triton_mod)
    # 40 experts for 2 rows: most blocks are idle; an output it forgot would read as NaN (torch.empty is poisoned)
    x, gate_up, down, top_i, top_w = _layer(experts=40, rows=2, k=4, seed=3)
    got = moe_triton_mod.moe_experts_triton(x, gate_up, down, top_i, top_w, block_m=16, block_n=16, block_k=16)
    assert not got.isnan().any()
    torch.testing.assert_close(got, moe_experts_ref(x, gate_up, down, top_i, top_w), rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_named():
    x, gate_up, down, top_i, top_w = _layer()
    with pytest.raises(ValueError, match=r"down must be \[7, 40, 24\]"):
        moe_experts_ref(x, gate_up, down[:, :, :5], top_i, top_w)
    with pytest.raises(ValueError, match="top_i and top_w must both be"):
        moe_experts_ref(x, gate_up, down, top_i[:3], top_w)
    with pytest.raises(ValueError, match="share a dtype"):
        moe_experts_ref(x, gate_up, down, top_i, top_w.double())


def test_the_moe_layer_takes_the_kernels_where_triton_runs(monkeypatch):
    """stages/models/moe.py through the triton route (as on CUDA; here on the interpreter) against its CPU route."""
    require_interpreted_triton(moe_triton_mod)
    from types import SimpleNamespace

    from speclane.stages.models import moe as layer
    from speclane.stages.models.weights import MlpWeights, MoeWeights

    x, gate_up, down, _, _ = _layer(experts=6, rows=9)
    g = torch.Generator().manual_seed(5)
    w = MoeWeights(
        router=torch.randn(6, 40, generator=g),
        gate_up=gate_up,
        down=down,
        shared=MlpWeights(torch.randn(48, 40, generator=g) * 0.2, torch.randn(40, 24, generator=g) * 0.2),
        shared_gate=torch.randn(1, 40, generator=g),
    )
    cfg = SimpleNamespace(experts_per_token=2, norm_topk_prob=True)
    cpu = layer.moe(x, w, cfg)
    calls = []
    monkeypatch.setattr(moe_mod, "use_triton", lambda t: True)
    monkeypatch.setattr(
        moe_mod, "moe_experts_triton", lambda *a, _run=moe_mod.moe_experts_triton: calls.append(1) or _run(*a)
    )
    torch.testing.assert_close(layer.moe(x, w, cfg), cpu, rtol=1e-5, atol=1e-5)
    assert calls
