"""Packed bf16 weights (kernels/packed.py): the layout round-trips, each row of the C kernel is bit-identical
whatever the row count, its place or the thread count, and the result is the float32 product of the weight.

Tolerances: float32 outputs are sums of up to ~1,500 exact bf16 products, in pair order against torch's order:
a few 1e-6 relative; bf16 outputs round those to 8 bits of mantissa (one ulp, 2^-8 relative).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from speclane.kernels import cpu_build
from speclane.kernels.decode_linear import decode_linear_ref
from speclane.kernels.packed import PackedWeight, pack_bf16, packed_linear, packs

SHAPES = [(576, 1536), (1536, 576), (64, 100), (6, 33), (2, 7)]  # in, out: whole blocks, ragged, one pair
BF16_BUILDS = [isa for isa in cpu_build.isas() if isa in ("avx512bf16", "amx")]


@pytest.fixture(params=BF16_BUILDS or ["none"])
def build(request, monkeypatch):
    """Each build that reads packed weights (avx512bf16; amx, whose tiles take the bf16 blocks), one test a build."""
    if request.param == "none" or cpu_build.library() is None:
        pytest.skip("packed weights are read by the AVX512-BF16 builds only")
    try:
        lib = cpu_build.variant(request.param)
    except RuntimeError as exc:  # an older compiler without the flags, or a kernel that refuses the tiles
        pytest.skip(f"the {request.param} build cannot be had here: {exc}")
    monkeypatch.setattr(cpu_build, "_LIB", lib)
    monkeypatch.setattr(cpu_build, "_ISA", request.param)
    return request.param


needs_kernel = pytest.mark.usefixtures("build")


def _case(k, n, rows=80, seed=0):
    g = torch.Generator().manual_seed(seed + k * n)
    w = (torch.randn(n, k, generator=g) * 0.05).bfloat16()
    return w, torch.randn(rows, k, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()


@pytest.mark.parametrize("k,n", SHAPES)
def test_pack_round_trips_and_pads_with_zeros(k, n):
    w, _, _ = _case(k, n)
    pw = pack_bf16(w)
    assert torch.equal(pw.unpack(), w) and pw.shape == w.shape
    assert pw.data.data_ptr() % 64 == 0
    tail = pw.data.permute(0, 2, 1, 3).reshape(-1, k)[n:]
    assert tail.numel() == 0 or not tail.any()


def test_pack_refuses_an_odd_reduction():
    with pytest.raises(Exception, match="even"):
        pack_bf16(torch.zeros(4, 5, dtype=torch.bfloat16))


@needs_kernel
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=["fp32-out", "bf16-out"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_rows_are_independent_of_their_neighbours(k, n, bias, out):
    w, x, b = _case(k, n)
    b = b if bias else None
    pw = pack_bf16(w)
    alone = torch.cat([packed_linear(x[i : i + 1], pw, b, out) for i in range(x.shape[0])])
    for rows in (2, 3, 5, 8, 9, 15, 16, 17, 24, 33, 80):  # 80: a prefill chunk takes the same kernel
        for start in (0, 3):
            got = packed_linear(x[start : start + rows], pw, b, out)
            assert torch.equal(got, alone[start : start + rows]), (rows, start)
    assert torch.equal(packed_linear(x, pw, b, out, threads=2), alone)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    tol = dict(rtol=2e-5, atol=2e-5) if out == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(alone.float(), want if out == torch.float32 else want.bfloat16().float(), **tol)


@needs_kernel
def test_bf16_output_rounds_as_the_row_major_kernel_does():
    w, x, _ = _case(576, 1536)
    torch.testing.assert_close(
        packed_linear(x, pack_bf16(w), out_dtype=torch.bfloat16),
        packed_linear(x, pack_bf16(w), out_dtype=torch.float32).bfloat16(),
        rtol=0,
        atol=0,
    )


@pytest.mark.skipif("amx" not in BF16_BUILDS, reason="this CPU has no AMX-BF16")
def test_the_amx_build_sums_on_tiles_where_the_shape_allows():
    """The tiles round otherwise than VDPBF16PS, so the amx build's sums part from the avx512bf16 build's in some
    low bit where K is a multiple of 32 (the tiles take the block, bf16 or int8) and match it where it is not."""
    try:
        amx, plain = cpu_build.variant("amx"), cpu_build.variant("avx512bf16")
    except RuntimeError as exc:
        pytest.skip(f"no amx build here: {exc}")

    def on(lib, k, n, int8=False):
        from speclane.kernels.packed import pack_int8
        from speclane.kernels.quant import quantize_int8

        w, x, b = _case(k, n, rows=20)
        pw = pack_int8(quantize_int8(w)) if int8 else pack_bf16(w)
        saved = cpu_build._LIB, cpu_build._ISA
        cpu_build._LIB, cpu_build._ISA = lib, None
        try:
            return packed_linear(x, pw, b, torch.float32)
        finally:
            cpu_build._LIB, cpu_build._ISA = saved

    for int8 in (False, True):  # int8 weights widened to bf16 a tile at a time
        tiles, vdp = on(amx, 576, 256, int8), on(plain, 576, 256, int8)
        assert not torch.equal(tiles, vdp), int8
        torch.testing.assert_close(tiles, vdp, rtol=2e-5, atol=2e-5)
        assert torch.equal(on(amx, 70, 100, int8), on(plain, 70, 100, int8))  # K = 70: VDPBF16PS in both


def test_without_the_kernel_the_twin_runs_the_row_major_route(no_cpu_kernels):
    w, x, b = _case(64, 100)
    pw = PackedWeight(data=pack_bf16(w).data, out=100, inner=64)
    assert not packs(w)
    assert torch.equal(packed_linear(x[:5], pw, b), decode_linear_ref(x[:5], w, b))


@needs_kernel
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=["fp32-out", "bf16-out"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_int8_rows_are_independent_and_equal_the_row_major_int8_kernel(k, n, out):
    """Packed int8 weights: each row bit-identical whatever the row count, and equal to the int8 weight's
    product as its torch twin computes it (dequantized), to float32 rounding."""
    from speclane.kernels.packed import pack_int8
    from speclane.kernels.quant import quantize_int8

    w, x, b = _case(k, n)
    q = quantize_int8(w)
    pw = pack_int8(q)
    assert torch.equal(pw.unpack(), q.q) and torch.equal(pw.scale, q.scale) and pw.data.data_ptr() % 64 == 0
    alone = torch.cat([packed_linear(x[i : i + 1], pw, b, out) for i in range(x.shape[0])])
    for rows in (2, 5, 8, 9, 24, 80):
        assert torch.equal(packed_linear(x[3 : 3 + rows], pw, b, out), alone[3 : 3 + rows]), rows
    want = F.linear(x.float(), q.dequantize(torch.float32), b.float())
    tol = dict(rtol=2e-5, atol=2e-5) if out == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(alone.float(), want if out == torch.float32 else want.bfloat16().float(), **tol)


def test_int8_twin_without_the_kernel(no_cpu_kernels):
    from speclane.kernels.packed import pack_int8
    from speclane.kernels.quant import quantize_int8

    w, x, b = _case(64, 100)
    q = quantize_int8(w)
    assert torch.equal(packed_linear(x[:5], pack_int8(q), b), decode_linear_ref(x[:5], q.dequantize(x.dtype), b))
