"""gated_delta_rows_triton: the per-row gated delta rule in one launch, against the torch twin (float32 rounding),
row by row bit for bit against one-row calls of itself, and the dispatch (the twin off CUDA)."""

from __future__ import annotations

import pytest
import torch
from interpreted import require_interpreted_triton

from speclane.kernels import gated_delta_triton
from speclane.kernels.gated_delta import gated_delta_rows, gated_delta_rows_ref
from speclane.kernels.gated_delta_triton import gated_delta_rows_triton


def _inputs(b=2, t=3, nk=2, nv=4, dk=12, dv=20, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, nk, dk, generator=gen).to(dtype)
    k = torch.randn(b, t, nk, dk, generator=gen).to(dtype)
    v = torch.randn(b, t, nv, dv, generator=gen).to(dtype)
    g = -torch.rand(b, t, nv, generator=gen)  # log decay <= 0
    beta = torch.rand(b, t, nv, generator=gen)
    state = torch.randn(b, nv, dk, dv, generator=gen) * 0.1
    return q, k, v, g, beta, state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_v", [8, 32])
def test_rows_agree_with_the_twin(dtype, block_v):
    require_interpreted_triton(gated_delta_triton)
    args = _inputs(dtype=dtype)
    state = args[-1].clone()
    out, states = gated_delta_rows_triton(*args, block_v=block_v)
    want_out, want_states = gated_delta_rows_ref(*args)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states, want_states, rtol=1e-5, atol=1e-5)
    assert torch.equal(args[-1], state)  # the input state is not modified


def test_a_row_of_a_wide_call_equals_that_row_alone():
    # what a verify pass needs: row t of a T-row call is the t-th single-token step, bit for bit
    require_interpreted_triton(gated_delta_triton)
    q, k, v, g, beta, state = _inputs(t=4, seed=1)
    out, states = gated_delta_rows_triton(q, k, v, g, beta, state)
    s = state
    for t in range(4):
        row = (x[:, t : t + 1] for x in (q, k, v, g, beta))
        o, st = gated_delta_rows_triton(*row, s)
        assert torch.equal(o[:, 0], out[:, t]) and torch.equal(st[:, 0], states[:, t]), t
        s = st[:, 0]
    one = gated_delta_rows_triton(*(x[:1] for x in (q, k, v, g, beta, state)))  # a lane alone: the same bits
    assert torch.equal(one[0][0], out[0]) and torch.equal(one[1][0], states[0])


def test_shapes_that_do_not_agree_are_refused_by_name():
    q, k, v, g, beta, state = _inputs()
    with pytest.raises(ValueError, match="gated_delta_rows_triton: g"):
        gated_delta_rows_triton(q, k, v, g[:, :2], beta, state)
    with pytest.raises(ValueError, match="do not agree"):
        gated_delta_rows_triton(q, k[:, :2], v, g, beta, state)


def test_off_cuda_the_dispatch_runs_the_twin():
    args = _inputs()
    got, want = gated_delta_rows(*args), gated_delta_rows_ref(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the kernel compiled for a GPU")
def test_on_a_gpu_the_rows_agree_with_the_twin_and_with_themselves_alone():
    q, k, v, g, beta, state = (x.cuda() for x in _inputs(b=2, t=8, nk=4, nv=8, dk=128, dv=128, seed=4))
    out, states = gated_delta_rows_triton(q, k, v, g, beta, state)
    want_out, want_states = gated_delta_rows_ref(q, k, v, g, beta, state)
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states, want_states, rtol=1e-4, atol=1e-4)
    o, st = gated_delta_rows_triton(*(x[:, 3:4] for x in (q, k, v, g, beta)), states[:, 2])
    assert torch.equal(o[:, 0], out[:, 3]) and torch.equal(st[:, 0], states[:, 3])
