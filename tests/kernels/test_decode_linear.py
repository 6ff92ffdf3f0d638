"""decode_linear: every row up to 8 (and beyond, in 8-row chunks) bit-identical to single-token decode.

These are exactness tests on this project's CPU kernels (oneDNN bf16, MKL fp32); the timings that justify the
scheme live in bench/linear_rows.py and docs/decode-route.md.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from interpreted import require_interpreted_triton

from speclane.kernels import decode_linear as dl_mod
from speclane.kernels.decode_linear import decode_linear, decode_linear_ref

SHAPES = [(576, 1536), (1536, 576), (576, 49152)]  # SmolLM2-135M's projections and LM head


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def dtype(request):
    return request.param


@pytest.mark.parametrize("k,n", SHAPES)
def test_every_row_matches_single_token_decode(dtype, k, n):
    g = torch.Generator().manual_seed(k + n)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if n != 49152 else None
    x = torch.randn(24, k, generator=g).to(dtype)
    single = torch.cat([decode_linear(x[i : i + 1], w, b) for i in range(24)])  # what 1-token decode produces
    for rows in (2, 3, 5, 7, 8, 9, 13, 16, 24):
        for start in (0, 24 - rows):  # the same rows at another position in the pass
            assert torch.equal(decode_linear(x[start : start + rows], w, b), single[start : start + rows]), (
                rows,
                start,
            )


def test_plain_linear_is_not_row_count_independent_in_fp32():
    # why the route exists: on this CPU a 1-row fp32 F.linear (gemv) rounds unlike a multi-row one (gemm).
    # If this starts failing, torch changed its CPU kernels: re-run bench/linear_rows.py and update the doc.
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(1536, 576, generator=g) * 0.05, torch.randn(8, 576, generator=g)
    assert not torch.equal(F.linear(x[:1], w), F.linear(x, w)[:1])
    assert torch.equal(decode_linear(x[:1], w), decode_linear(x, w)[:1])


def test_leading_dims_and_empty_rows():
    w = torch.randn(10, 6)
    x = torch.randn(2, 3, 6)
    assert decode_linear(x, w).shape == (2, 3, 10)
    assert decode_linear(torch.randn(0, 6), w).shape == (0, 10)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="weight dtype"):
        decode_linear_ref(torch.randn(1, 6), torch.randn(4, 6).bfloat16())
    with pytest.raises(ValueError, match="x has 5 features, weight expects 6"):
        decode_linear_ref(torch.randn(1, 5), torch.randn(4, 6))


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_triton_kernel_rows_independent_and_close_to_ref(dt):
    require_interpreted_triton(dl_mod)
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(100, 70, generator=g) * 0.1).to(dt)  # 100, 70: ragged against the 32-wide blocks
    b = torch.randn(100, generator=g).to(dt)
    x = torch.randn(37, 70, generator=g).to(dt)
    alone = torch.cat([dl_mod.decode_linear_triton(x[i : i + 1], w, b, block_n=32, block_k=32) for i in range(37)])
    for rows, start in ((5, 0), (5, 9), (16, 3), (17, 0), (37, 0)):  # within one 16-row tile, across tiles
        got = dl_mod.decode_linear_triton(x[start : start + rows], w, b, block_n=32, block_k=32)
        assert torch.equal(got, alone[start : start + rows]), (rows, start)  # a row sums alike wherever it sits
    got = alone[:5]
    ref = F.linear(x[:5].float(), w.float(), b.float())
    # fp32 accumulation in another order: ~1e-6 relative in fp32; bf16 output rounding: 2^-8 relative
    tol = dict(rtol=1e-5, atol=1e-5) if dt == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(got.float(), ref, **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the kernel compiled for a GPU")
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_on_a_gpu_every_row_matches_the_row_alone(dt):
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(1536, 576, generator=g) * 0.05).to(dt).cuda()
    x = torch.randn(40, 576, generator=g).to(dt).cuda()
    alone = torch.cat([dl_mod.decode_linear_triton(x[i : i + 1], w) for i in range(40)])
    for rows in (2, 3, 8, 15, 16, 17, 33, 40):
        for start in (0, 40 - rows):
            assert torch.equal(dl_mod.decode_linear_triton(x[start : start + rows], w), alone[start : start + rows])
    tol = dict(rtol=1e-5, atol=1e-5) if dt == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(alone.float(), (x.float() @ w.float().T), **tol)
