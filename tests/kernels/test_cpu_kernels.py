"""The C kernels of the decode route (kernels/cpu/rows.c): each against its torch twin, and each row's bits
independent of the other rows, of the row count, of the row's place and of the thread count.

Tolerances: float32 results are sums of up to ~1,500 products reduced in another order than the twin's:
a few 1e-6 relative; bfloat16 outputs are rounded to 8 bits of mantissa: one bf16 ulp (2^-8 relative).
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from speclane.kernels import cpu_build
from speclane.kernels.decode_attention import decode_attention_cpu, decode_attention_ref
from speclane.kernels.decode_linear import decode_linear, decode_linear_cpu, decode_linear_ref, dequantize_cpu
from speclane.kernels.dense_layer import DenseLayer, dense_layer, dense_layer_ref
from speclane.kernels.quant import quantize_int8
from speclane.kernels.rowwise import (
    add_rms_norm,
    add_rms_norm_ref,
    qk_rope_write,
    qk_rope_write_ref,
    silu_mul,
    silu_mul_ref,
)
from speclane.kernels.sampling import row_argmax


@pytest.fixture(autouse=True, params=cpu_build.isas() or ["none"])
def built(request, monkeypatch):
    """Every build this CPU runs (avx2; avx512bf16 and amx where the CPU has them), each test once per build."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or shutil.which("cc") is None:
        pytest.skip(f"no AVX2 or no C compiler here: {cpu_build.unavailable()}")
    assert cpu_build.library() is not None, cpu_build.unavailable()  # a compiler and AVX2: the build must work
    try:
        lib = cpu_build.variant(request.param)
    except RuntimeError as exc:  # an older compiler without that build's flags: the best build it can make runs
        pytest.skip(f"the {request.param} build cannot be made here: {exc}")
    monkeypatch.setattr(cpu_build, "_LIB", lib)
    monkeypatch.setattr(cpu_build, "_ISA", request.param)


def _tol(dtype):
    return dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)


F32 = torch.float32  # attention outputs: every low bit of the sums shows, where a bf16 output would round most away
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize("k,n", [(576, 1536), (70, 100), (1544, 40), (8, 3)])  # K: %16, %8 only, ragged, tiny
def test_linear_rows_are_independent_and_close_to_torch(dtype, k, n):
    g = torch.Generator().manual_seed(k * n)
    w = (torch.randn(n, k, generator=g) * 0.05).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    x = torch.randn(24, k, generator=g).to(dtype)
    alone = torch.cat([decode_linear_cpu(x[i : i + 1], w, b, threads=1) for i in range(24)])
    for rows in (2, 3, 4, 5, 7, 8, 9, 13, 16, 24):
        for start in (0, 24 - rows):
            for threads in (1, 2):
                got = decode_linear_cpu(x[start : start + rows], w, b, threads=threads)
                assert torch.equal(got, alone[start : start + rows]), (rows, start, threads)
    want = F.linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(alone.double(), want, **{k_: v * 4 for k_, v in _tol(dtype).items()})
    assert torch.equal(decode_linear(x, w, b), alone)  # the dispatcher takes the kernel here


@pytest.mark.parametrize("k", [576, 70, 40, 90])  # K: whole 32-steps, ragged tails (90: 26 past 64), under one step
def test_int8_weights_rows_are_independent_and_match_the_dequantized_weight(k):
    g = torch.Generator().manual_seed(k)
    w = torch.randn(50, k, generator=g) * 0.05
    w[3] = 0.0  # an all-zero row: scale 1, output the bias
    q, b = quantize_int8(w), torch.randn(50, generator=g)
    assert q.q.dtype == torch.int8 and q.q.abs().max() <= 127
    torch.testing.assert_close(q.dequantize(torch.float32), w, rtol=0, atol=float(w.abs().max()) / 254 + 1e-7)
    x = torch.randn(11, k, generator=g)
    alone = torch.cat([decode_linear(x[i : i + 1], q, b) for i in range(11)])
    for rows in (2, 4, 5, 8, 11):
        assert torch.equal(decode_linear(x[:rows], q, b), alone[:rows]), rows
    torch.testing.assert_close(alone, F.linear(x, q.dequantize(torch.float32), b), rtol=2e-5, atol=2e-5)
    assert torch.equal(alone[:, 3], b[None, :].expand(11, -1)[:, 3])


def test_linear_without_bias_and_with_leading_dims():
    w, x = torch.randn(10, 16), torch.randn(2, 3, 16)
    got = decode_linear_cpu(x, w)
    assert got.shape == (2, 3, 10)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


def _caches(dtype, slots=3, kvh=2, cap=80, hd=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(slots, kvh, cap, hd, generator=g).to(dtype),
        torch.randn(slots, kvh, cap, hd, generator=g).to(dtype),
    )


@DTYPES
@pytest.mark.parametrize("hd", [16, 64])  # 64: whole 32-wide pairs of tiles, where the amx build takes them
def test_attention_matches_twin_and_rows_are_independent(dtype, hd):
    kc, vc = _caches(dtype, hd=hd)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(7, 6, hd, generator=g)  # 6 heads over 2 kv heads
    slot = torch.tensor([0, 0, 0, 2, 1, 1, 2])
    keys = torch.tensor([1, 2, 3, 65, 9, 10, 66])  # 1 key, short, past a 64 block
    got = decode_attention_cpu(q, kc, vc, slot, keys, 0.25, F32)
    torch.testing.assert_close(got.float(), decode_attention_ref(q, kc, vc, slot, keys, 0.25).float(), **_tol(dtype))
    for r in range(7):
        alone = decode_attention_cpu(q[r : r + 1], kc, vc, slot[r : r + 1], keys[r : r + 1], 0.25, F32, threads=1)
        assert torch.equal(alone, got[r : r + 1]), r
    assert torch.equal(decode_attention_cpu(q, kc, vc, slot, keys, 0.25, F32, threads=2), got)


def test_the_amx_build_attends_on_tiles_where_head_dim_allows():
    """The tiles round otherwise than VDPBF16PS: over a bf16 cache the amx build's attention parts from the
    avx512bf16 build's in some low bit at head_dim 64 (the tiles take it) and equals it at 16 (they do not)."""
    if "amx" not in cpu_build.isas():
        pytest.skip("this CPU has no AMX-BF16")
    try:
        amx, plain = cpu_build.variant("amx"), cpu_build.variant("avx512bf16")
    except RuntimeError as exc:
        pytest.skip(f"no amx build here: {exc}")

    def on(lib, hd):
        kc, vc = _caches(torch.bfloat16, hd=hd)
        q = torch.randn(7, 6, hd, generator=torch.Generator().manual_seed(3))
        slot, keys = torch.tensor([0, 0, 0, 2, 1, 1, 2]), torch.tensor([1, 2, 3, 65, 9, 10, 66])
        cpu_build._LIB, cpu_build._ISA = lib, None
        return decode_attention_cpu(q, kc, vc, slot, keys, 0.25, out_dtype=torch.float32)  # every low bit shows

    tiles, vdp = on(amx, 64), on(plain, 64)
    assert not torch.equal(tiles, vdp)
    torch.testing.assert_close(tiles, vdp, rtol=2e-3, atol=2e-3)  # the probabilities rounded to bf16 either way
    assert torch.equal(on(amx, 16), on(plain, 16))


def test_attention_reads_no_key_past_the_row():
    kc, vc = _caches(torch.float32)
    q = torch.randn(1, 2, 16)
    before = decode_attention_cpu(q, kc, vc, torch.tensor([1]), torch.tensor([5]), 0.5)
    kc[1, :, 5:], vc[1, :, 5:] = float("nan"), float("nan")  # a later key must not be seen
    assert torch.equal(decode_attention_cpu(q, kc, vc, torch.tensor([1]), torch.tensor([5]), 0.5), before)


# (rows, heads, kv heads): a job's queries are its rows times the heads it takes of a GQA group (at most ATT_HEADS,
# 4); their counts here leave every remainder of the groups of six (scores) and of four (values) the 16-lane build
# takes them in: 44 and 11 (groups of 5 split 4 + 1), 48 (SmolLM2's 9 over 3 at 16 rows), 21, 13, 6, 16
LANES = [(11, 10, 2), (16, 9, 3), (7, 3, 1), (13, 2, 2), (6, 3, 3), (4, 4, 1)]


@DTYPES
@pytest.mark.parametrize("hd", [16, 64])
@pytest.mark.parametrize("rows,heads,kvh", LANES)
def test_a_lanes_rows_share_key_blocks_yet_each_row_stands_alone(dtype, hd, rows, heads, kvh):
    """A verify lane's rows (one slot, one more key each) run as one job per KV head, past ATT_ROWS (8) rows and
    past ATT_HEADS (4) heads of a GQA group; a row must still see only its own keys and equal itself alone."""
    kc, vc = _caches(dtype, kvh=kvh, cap=80, hd=hd)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(rows, heads, hd, generator=g)
    slot, keys = torch.full((rows,), 1), torch.arange(40, 40 + rows)
    got = decode_attention_cpu(q, kc, vc, slot, keys, 0.25, F32)
    torch.testing.assert_close(got.float(), decode_attention_ref(q, kc, vc, slot, keys, 0.25).float(), **_tol(dtype))
    for r in range(rows):
        kn, vn = kc.clone(), vc.clone()
        kn[1, :, int(keys[r]) :], vn[1, :, int(keys[r]) :] = float("nan"), float("nan")  # keys past the row: unseen
        alone = decode_attention_cpu(q[r : r + 1], kn, vn, slot[r : r + 1], keys[r : r + 1], 0.25, F32, threads=1)
        assert torch.equal(alone, got[r : r + 1]), r


@pytest.mark.parametrize("hd", [96, 128, 256])  # past one 64-wide set of value tiles: 64 + 32, twice 64, four times
def test_wide_heads_match_their_twin_and_each_row_stands_alone(hd):
    """Head dims of Qwen-class models over a bf16 cache, a verify lane of 21 rows (two tiles of queries a head) whose
    keys end inside a block, 3 heads over 1 KV head (63 queries a job: the 16-lane build's pairs of queries leave
    one): the twin's output, and each row the same alone, bit for bit."""
    kc, vc = _caches(torch.bfloat16, slots=2, kvh=1, cap=112, hd=hd)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(21, 3, hd, generator=g)
    slot, keys = torch.full((21,), 1), torch.arange(81, 102)
    got = decode_attention_cpu(q, kc, vc, slot, keys, hd**-0.5, F32)
    twin = decode_attention_ref(q, kc, vc, slot, keys, hd**-0.5, F32)
    torch.testing.assert_close(got, twin, **_tol(torch.bfloat16))
    for r in (0, 7, 19, 20):
        kn, vn = kc.clone(), vc.clone()
        kn[1, :, int(keys[r]) :], vn[1, :, int(keys[r]) :] = float("nan"), float("nan")
        alone = decode_attention_cpu(q[r : r + 1], kn, vn, slot[r : r + 1], keys[r : r + 1], hd**-0.5, F32, threads=1)
        assert torch.equal(alone, got[r : r + 1]), r


@DTYPES
def test_rowwise_ops_match_their_twins(dtype):
    g = torch.Generator().manual_seed(2)
    x, h = torch.randn(5, 40, generator=g).to(dtype), torch.randn(5, 40, generator=g).to(dtype)
    scale = torch.rand(40, generator=g) + 0.5
    x1, x2 = x.clone(), x.clone()
    y1, y2 = add_rms_norm(x1, h, scale, 1e-6), add_rms_norm_ref(x2, h, scale, 1e-6)
    assert torch.equal(x1, x2)  # the residual add rounds once, as torch does
    torch.testing.assert_close(y1.float(), y2.float(), **_tol(dtype))
    assert add_rms_norm(x1, h, None, 1e-6) is None  # the add alone
    add_rms_norm_ref(x2, h, None, 1e-6)
    assert torch.equal(x1, x2)
    gu = (torch.randn(5, 2 * 37, generator=g) * 4).to(dtype)  # 37: a ragged tail of 8-wide blocks
    torch.testing.assert_close(silu_mul(gu).float(), silu_mul_ref(gu).float(), **_tol(dtype))
    one = torch.cat([silu_mul(gu[i : i + 1]) for i in range(5)])
    assert torch.equal(one, silu_mul(gu))


@DTYPES
@pytest.mark.parametrize("norms,rot", [(False, 16), (True, 8)], ids=["llama", "qk-norm-partial-rotary"])
def test_qk_rope_write_matches_twin(dtype, norms, rot):
    g = torch.Generator().manual_seed(3)
    nh, kvh, hd, rows = 4, 2, 16, 3
    qkv = torch.randn(rows, (nh + 2 * kvh) * hd, generator=g).to(dtype)
    cos, sin = torch.randn(rows, rot, generator=g), torch.randn(rows, rot, generator=g)
    qn, kn = (torch.rand(hd, generator=g) + 0.5, torch.rand(hd, generator=g) + 0.5) if norms else (None, None)
    slot, pos = torch.tensor([2, 0, 2]), torch.tensor([4, 0, 5])
    outs = []
    for fn in (qk_rope_write, qk_rope_write_ref):
        kc, vc = torch.zeros(3, kvh, 8, hd, dtype=dtype), torch.zeros(3, kvh, 8, hd, dtype=dtype)
        q = fn(qkv, (0, nh * hd, (nh + kvh) * hd), (nh, kvh, hd), cos, sin, qn, kn, 1e-6, kc, vc, slot, pos)
        outs.append((q, kc, vc))
    (q1, k1, v1), (q2, k2, v2) = outs
    torch.testing.assert_close(q1, q2, **_tol(dtype))
    torch.testing.assert_close(k1.float(), k2.float(), **_tol(dtype))
    assert torch.equal(v1, v2)  # values are copied, not computed
    written = torch.zeros(3, 8, dtype=torch.bool)
    written[slot, pos] = True
    assert (k1.abs().sum((1, 3)) > 0).eq(written).all()  # nothing written anywhere else


@DTYPES
def test_dense_layer_matches_twin(dtype):
    g = torch.Generator().manual_seed(4)
    hidden, nh, kvh, hd, inter = 48, 4, 2, 8, 40
    w = lambda *s: (torch.randn(*s, generator=g) * 0.2).to(dtype)  # noqa: E731
    layer = DenseLayer(
        in_norm=torch.rand(hidden, generator=g) + 0.5,
        post_norm=torch.rand(hidden, generator=g) + 0.5,
        qkv=w((nh + 2 * kvh) * hd, hidden),
        qkv_bias=w((nh + 2 * kvh) * hd),
        o=w(hidden, nh * hd),
        o_bias=None,
        gate_up=w(2 * inter, hidden),
        gate_up_bias=None,
        down=w(hidden, inter),
        down_bias=None,
        q_norm=None,
        k_norm=None,
        heads=(nh, kvh, hd),
        rot=hd,
        eps=1e-6,
    )
    x = torch.randn(3, hidden, generator=g).to(dtype)
    cos, sin = torch.randn(3, hd, generator=g).cos(), torch.randn(3, hd, generator=g).sin()
    slot, pos = torch.tensor([0, 1, 1]), torch.tensor([0, 3, 4])
    res = []
    for fn in (dense_layer, dense_layer_ref):
        kc, vc = torch.zeros(2, kvh, 8, hd, dtype=dtype), torch.zeros(2, kvh, 8, hd, dtype=dtype)
        kc[1, :, :3], vc[1, :, :3] = 0.5, -0.25  # keys already committed before this pass
        xi = x.clone()
        fn(layer, xi, cos, sin, kc, vc, slot, pos, pos + 1)
        res.append((xi, kc, vc))
    for a, b in zip(*res):
        torch.testing.assert_close(
            a.float(),
            b.float(),
            rtol=3e-2 if dtype == torch.bfloat16 else 1e-4,
            atol=3e-2 if dtype == torch.bfloat16 else 1e-4,
        )


@pytest.mark.parametrize("n", [1, 7, 8, 9, 100, 49152])  # widths under, at and past one 8-lane step
def test_row_argmax_is_torchs_argmax_ties_and_nans_included(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=g)
    x[1] = 3.0  # all tied: the first index
    x[2] = -float("inf")
    if n > 4:
        x[3, 4] = x[3, 1] = x[3].max() + 1  # a tie past the first step's lanes
        x[4, 3] = x[4, 2] = float("nan")  # a NaN is the largest: its first index
    x[5, -1] = 1e30  # the tail
    assert torch.equal(row_argmax(x), x.argmax(dim=1))
    assert torch.equal(row_argmax(x[:, : max(n - 1, 1)]), x[:, : max(n - 1, 1)].argmax(dim=1))  # a strided view


@DTYPES
@pytest.mark.parametrize("k", [576, 70, 13])  # whole 8-steps, a ragged tail, under one step
def test_int8_dequantize_in_c_is_torchs_bit_for_bit(dtype, k):
    g = torch.Generator().manual_seed(k)
    w = torch.randn(33, k, generator=g) * 0.05
    w[5] = 0.0
    q = quantize_int8(w)
    assert torch.equal(dequantize_cpu(q, dtype), q.dequantize(dtype))
