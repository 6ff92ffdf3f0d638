"""The fused row-wise ops' triton kernels against their torch twins (the residual add bit for bit, the rest to
float32 rounding) and each row against itself alone, bit for bit."""

from __future__ import annotations

import pytest
import torch
from interpreted import require_interpreted_triton

from speclane.kernels import rowwise_triton
from speclane.kernels.rowwise import add_rms_norm_ref, qk_rope_write_ref, silu_mul_ref
from speclane.kernels.rowwise_triton import add_rms_norm_triton, qk_rope_write_triton, silu_mul_triton

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_h", [True, False])
def test_add_rms_norm(dtype, with_h):
    require_interpreted_triton(rowwise_triton)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 40, generator=gen).to(dtype)
    h = torch.randn(5, 40, generator=gen).to(dtype) if with_h else None
    scale = torch.rand(40, generator=gen) + 0.5
    xa, xb = x.clone(), x.clone()
    got, want = add_rms_norm_triton(xa, h, scale, 1e-6), add_rms_norm_ref(xb, h, scale, 1e-6)
    if dtype == torch.float32:
        assert torch.equal(xa, xb)  # the residual stream: the same float32 sum
    else:  # the interpreter rounds float32 to bf16 toward zero (triton on a GPU to nearest even): one bf16 step
        torch.testing.assert_close(xa.float(), xb.float(), rtol=2**-7, atol=0)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
    alone = add_rms_norm_triton(x[2:3].clone(), None if h is None else h[2:3], scale, 1e-6)
    assert torch.equal(alone, got[2:3])
    assert add_rms_norm_triton(x.clone(), h, None, 1e-6) is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    require_interpreted_triton(rowwise_triton)
    gu = torch.randn(3, 2 * 70, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = silu_mul_triton(gu, block=32)
    torch.testing.assert_close(
        got.float(), silu_mul_ref(gu).float(), rtol=1e-2 if dtype != torch.float32 else 1e-6, atol=1e-6
    )
    assert torch.equal(silu_mul_triton(gu[1:2], block=32), got[1:2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norms,rot", [(False, 16), (True, 8)])
def test_qk_rope_write(dtype, norms, rot):
    # 4 query heads and 2 key/value heads of 16 after 7 columns of something else; partial rotary where rot < 16
    require_interpreted_triton(rowwise_triton)
    gen = torch.Generator().manual_seed(2)
    rows, nh, kvh, hd = 3, 4, 2, 16
    width = 7 + (nh + 2 * kvh) * hd
    qkv = torch.randn(rows, width, generator=gen).to(dtype)
    offsets = (7, 7 + nh * hd, 7 + (nh + kvh) * hd)
    angles = torch.rand(rows, rot, generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    q_norm = torch.rand(hd, generator=gen) + 0.5 if norms else None
    k_norm = torch.rand(hd, generator=gen) + 0.5 if norms else None
    slot, pos = torch.tensor([1, 0, 1]), torch.tensor([5, 2, 6])
    caches = [torch.zeros(2, kvh, 8, hd, dtype=dtype) for _ in range(4)]
    got = qk_rope_write_triton(qkv, offsets, (nh, kvh, hd), cos, sin, q_norm, k_norm, 1e-6, *caches[:2], slot, pos)
    want = qk_rope_write_ref(qkv, offsets, (nh, kvh, hd), cos, sin, q_norm, k_norm, 1e-6, *caches[2:], slot, pos)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        caches[0].float(), caches[2].float(), rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=1e-5
    )
    assert torch.equal(caches[1], caches[3])  # values are copied, not computed
    assert caches[0][1, :, 5].abs().sum() > 0 and caches[0][0, :, 5].abs().sum() == 0
    alone = qk_rope_write_triton(
        qkv[1:2], offsets, (nh, kvh, hd), cos[1:2], sin[1:2], q_norm, k_norm, 1e-6, *caches[:2], slot[1:2], pos[1:2]
    )
    assert torch.equal(alone, got[1:2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the kernels compiled for a GPU")
def test_on_a_gpu_the_kernels_agree_with_the_twins():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 576, generator=gen).to(torch.bfloat16).cuda()
    h = torch.randn(6, 576, generator=gen).to(torch.bfloat16).cuda()
    scale = (torch.rand(576, generator=gen) + 0.5).cuda()
    xa, xb = x.clone(), x.clone()
    got, want = add_rms_norm_triton(xa, h, scale, 1e-6), add_rms_norm_ref(xb, h, scale, 1e-6)
    assert torch.equal(xa, xb)  # round to nearest even on a GPU, as torch does
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-5)
    gu = torch.randn(6, 2 * 1536, generator=gen).to(torch.bfloat16).cuda()
    torch.testing.assert_close(silu_mul_triton(gu).float(), silu_mul_ref(gu).float(), rtol=2**-7, atol=1e-6)
