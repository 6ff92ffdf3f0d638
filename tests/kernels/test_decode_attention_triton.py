"""decode_attention_triton: each row over its own slot's keys in place, against the twin (float32 rounding) and
against the row alone (bit for bit)."""

from __future__ import annotations

import pytest
import torch
from interpreted import require_interpreted_triton

from speclane.kernels import decode_attention_triton as dat
from speclane.kernels.decode_attention import decode_attention_ref


def _inputs(dtype, rows=5, heads=4, kvh=2, cap=48, hd=24, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, hd, generator=gen)
    k = torch.randn(3, kvh, cap, hd, generator=gen).to(dtype)
    v = torch.randn(3, kvh, cap, hd, generator=gen).to(dtype)
    slot = torch.tensor([2, 0, 2, 1, 0][:rows])
    keys = torch.tensor([7, 1, 40, 33, 32][:rows])  # across blocks of 8 and 32, one with a single key
    return (x.to(device) for x in (q, k, v, slot, keys))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_n", [8, 32])
def test_rows_agree_with_the_twin_and_with_themselves_alone(dtype, block_n):
    require_interpreted_triton(dat)
    q, k, v, slot, keys = _inputs(dtype)
    got = dat.decode_attention_triton(q, k, v, slot, keys, 0.2, torch.float32, block_n=block_n)
    want = decode_attention_ref(q, k, v, slot, keys, 0.2, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for r in range(5):
        alone = dat.decode_attention_triton(
            q[r : r + 1], k, v, slot[r : r + 1], keys[r : r + 1], 0.2, torch.float32, block_n=block_n
        )
        assert torch.equal(alone, got[r : r + 1]), r
    rounded = dat.decode_attention_triton(q, k, v, slot, keys, 0.2, block_n=block_n)  # the cache's dtype
    assert rounded.dtype == dtype


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the kernel compiled for a GPU")
def test_on_a_gpu_rows_agree_with_the_twin_and_with_themselves_alone():
    q, k, v, slot, keys = _inputs(torch.bfloat16, hd=128, cap=256, device="cuda")
    keys = torch.tensor([7, 1, 200, 133, 32], device="cuda")
    got = dat.decode_attention_triton(q, k, v, slot, keys, 0.1, torch.float32)
    torch.testing.assert_close(got, decode_attention_ref(q, k, v, slot, keys, 0.1, torch.float32), rtol=1e-4, atol=1e-4)
    for r in range(5):
        alone = dat.decode_attention_triton(q[r : r + 1], k, v, slot[r : r + 1], keys[r : r + 1], 0.1, torch.float32)
        assert torch.equal(alone, got[r : r + 1]), r
