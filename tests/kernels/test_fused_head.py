"""The fused output head (kernels/fused_head.py): tokens without written logits, against the twin that writes them.

Greedy tokens are compared bit for bit (the kernel makes each logit with the calls the head's linear makes, so the
argmax is the written logits' argmax, ties to the first index included). Sampled tokens follow the same inverse-CDF
rule with another summation (float64 sums of the kernel's float32 exps per block of columns, where the twin
normalises torch's float32 exps and takes their float32 cumulative sum); a token may differ from the twin's only
where the CDF boundary between the two tokens lies within `NEAR` of u * total, and on at most `RATE` of the draws.
A float32 cumulative sum near 1 has a resolution of 2^-24 = 6e-8 and each exp is within about one ulp, so a few
1e-7 covers the twin's own rounding; a draw at a wrong temperature or a wrong uniform moves tokens by far more.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from speclane.kernels import cpu_build
from speclane.kernels.accept import accept, accept_tokens, accept_tokens_ref
from speclane.kernels.fused_head import head_logits, head_tokens, head_tokens_cpu, head_tokens_ref, tokens_from_logits
from speclane.kernels.packed import pack_bf16, pack_int8
from speclane.kernels.quant import quantize_int8
from speclane.kernels.sampling import process_logits_ref

NEAR = 5e-7  # CDF distance within which the two summations may disagree (see the module docstring)
RATE = 2e-3  # at most this share of draws may differ at all


@pytest.fixture(autouse=True, params=cpu_build.isas() or ["none"])
def built(request, monkeypatch):
    """Every build this CPU runs (avx2; avx512bf16 and amx where the CPU has them), each test once per build."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or shutil.which("cc") is None:
        pytest.skip(f"no AVX2 or no C compiler here: {cpu_build.unavailable()}")
    assert cpu_build.library() is not None, cpu_build.unavailable()
    monkeypatch.setattr(cpu_build, "_LIB", cpu_build.variant(request.param))
    monkeypatch.setattr(cpu_build, "_ISA", request.param)
    return request.param


FORMS = ["fp32", "bf16", "int8-fp32-rows", "int8-bf16-rows", "packed-bf16", "packed-int8"]


def _head(form: str, vocab: int, k: int, rows: int, seed: int = 0):
    """(x [rows, k], the head weight in `form`, float32 reference weight) at about unit logit scale."""
    g = torch.Generator().manual_seed(seed * 7919 + vocab + k)
    w = torch.randn(vocab, k, generator=g) * (2.0 / k**0.5)
    x = torch.randn(rows, k, generator=g)
    if form.startswith("packed") and not cpu_build.bf16_kernels():
        pytest.skip("packed weights are read by the AVX512-BF16 build only")
    dtype = torch.float32 if form in ("fp32", "int8-fp32-rows") else torch.bfloat16
    if form.startswith("int8") or form == "packed-int8":
        weight = quantize_int8(w)
        weight = pack_int8(weight) if form == "packed-int8" else weight
    else:
        weight = w.to(dtype)
        weight = pack_bf16(weight) if form == "packed-bf16" else weight
    return x.to(dtype), weight


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("vocab,k", [(4099, 64), (101, 42), (1001, 70), (40, 1544)])
def test_greedy_tokens_are_the_written_logits_argmax(form, vocab, k):
    if k % 2 and form.startswith("packed"):
        pytest.skip("packing needs an even reduction")
    x, w = _head(form, vocab, k, 16)
    want = head_tokens_ref(x, w, torch.zeros(16), torch.zeros(16))
    for rows in range(1, 17):  # every row count of a verify pass up to 16, each its own call
        got = head_tokens_cpu(x[:rows], w, torch.zeros(rows), torch.zeros(rows), threads=1)
        assert torch.equal(got, want[:rows]), rows
    assert torch.equal(head_tokens_cpu(x, w, torch.zeros(16), torch.zeros(16), threads=2), want)


@pytest.mark.parametrize("form", ["fp32", "bf16", "packed-bf16"])
def test_an_exact_tie_goes_to_the_first_index_across_blocks(form):
    x, w = _head(form, 1001, 64, 3)
    base = w.unpack() if hasattr(w, "unpack") else w
    base = base.clone()
    base[700] = base[12] = x[0].to(base.dtype) * 4  # the largest logit of row 0, twice, in two blocks of columns
    base[900] = base[5] = x[1].to(base.dtype) * 4
    w = pack_bf16(base) if form == "packed-bf16" else base
    got = head_tokens_cpu(x, w, torch.zeros(3), torch.zeros(3))
    assert got[:2].tolist() == [12, 5]
    assert torch.equal(got, head_tokens_ref(x, w, torch.zeros(3), torch.zeros(3)))


@pytest.mark.parametrize("form", ["fp32", "bf16", "packed-bf16"])
def test_a_nan_logit_wins_as_torch_argmax_counts_it(form):
    x, w = _head(form, 1001, 64, 4)
    base = (w.unpack() if hasattr(w, "unpack") else w).clone()
    base[700] = base[300] = float("nan")  # two NaN columns: the first one is every greedy row's token
    w = pack_bf16(base) if form == "packed-bf16" else base
    got = head_tokens_cpu(x, w, torch.zeros(4), torch.zeros(4))
    assert got.tolist() == [300] * 4
    assert torch.equal(got, head_tokens_ref(x, w, torch.zeros(4), torch.zeros(4)))


@pytest.mark.parametrize("form", ["fp32", "packed-bf16"])
def test_a_bias_is_added_as_the_linear_adds_it(form):
    x, w = _head(form, 1001, 64, 8)
    b = (torch.randn(1001, generator=torch.Generator().manual_seed(3)) * 3).to(x.dtype)
    t, u = torch.tensor([0.0, 0.7] * 4), torch.rand(8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(head_tokens_cpu(x, w, t, u, bias=b), head_tokens_ref(x, w, t, u, bias=b))


def _near_tie(logits, temperature, u, a: int, b: int) -> float:
    """The CDF distance between u * total and the nearest boundary separating tokens a and b (the twin's weights
    in float64): 0 when the two draws are the same token."""
    if a == b:
        return 0.0
    p = process_logits_ref(logits[None], temperature[None], torch.zeros(1, dtype=torch.int64), torch.ones(1))[0]
    c = torch.cumsum(p.double(), 0)
    target = float(u) * float(c[-1])
    lo, hi = min(a, b), max(a, b)
    # every boundary from the end of token lo to the start of token hi lies between the two draws
    return max(abs(float(c[lo]) - target), abs(float(c[hi - 1]) - target))


def _compare_draws(form, temperatures, reps, seed=0, skew=None):
    """(draws, differing draws, largest CDF distance of a differing draw)."""
    vocab, rows = 2053, 16
    x, w = _head(form, vocab, 64, rows, seed)
    logits = head_logits(x, w)
    g = torch.Generator().manual_seed(seed + 1)
    draws = differ = 0
    worst = 0.0
    for temp in temperatures:
        t = torch.full((rows,), temp)
        for _ in range(reps):
            u = torch.rand(rows, generator=g)
            fused = head_tokens_cpu(x, w, t if skew is None else t * skew, u)
            twin = tokens_from_logits(logits, t, u)
            draws += rows
            for r in torch.nonzero(fused != twin).flatten().tolist():
                differ += 1
                worst = max(worst, _near_tie(logits[r], t[r], u[r], int(fused[r]), int(twin[r])))
    return draws, differ, worst


@pytest.mark.parametrize("form", ["fp32", "bf16", "packed-bf16", "int8-bf16-rows"])
def test_sampled_tokens_are_the_twins_but_at_near_ties(form):
    draws, differ, worst = _compare_draws(form, (0.3, 0.7, 1.0, 1.6), reps=12)
    assert differ <= RATE * draws and worst <= NEAR, (differ, draws, worst)


def test_a_draw_at_the_wrong_temperature_fails_the_comparison():
    draws, differ, worst = _compare_draws("fp32", (0.7, 1.0), reps=4, skew=1.01)
    assert differ > RATE * draws or worst > NEAR, (differ, draws, worst)


def test_the_twin_draws_the_accept_rule_token():
    """tokens_from_logits is the token accept's sample-and-compare commits at a row (a lane of no drafts)."""
    g = torch.Generator().manual_seed(5)
    rows, vocab = 12, 333
    logits = torch.randn(rows, vocab, generator=g) * 3
    t = torch.tensor([0.0, 0.5, 1.0, 1.7] * 3)
    u = torch.rand(rows, generator=g)
    no_drafts = torch.zeros(rows, 0, dtype=torch.int64)
    committed, _, _ = accept(
        logits,
        torch.arange(rows + 1),
        no_drafts,
        torch.zeros(rows, dtype=torch.int64),
        None,
        t,
        torch.zeros(rows, dtype=torch.int64),
        torch.ones(rows),
        None,
        u[:, None].contiguous(),
    )
    assert torch.equal(tokens_from_logits(logits, t, u), committed[:, 0])


def test_without_the_kernels_the_twin_runs(no_cpu_kernels):
    x, w = _head("fp32", 1001, 64, 5)
    t, u = torch.tensor([0.0, 1.0, 0.0, 0.4, 2.0]), torch.rand(5, generator=torch.Generator().manual_seed(2))
    assert torch.equal(head_tokens(x, w, t, u), head_tokens_ref(x, w, t, u))


def test_bad_arguments_name_the_field():
    x, w = _head("fp32", 101, 42, 4)
    with pytest.raises(ValueError, match=r"temperature must be float32 \[rows=4\]"):
        head_tokens(x, w, torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"u must be in \[0, 1\)"):
        head_tokens(x, w, torch.ones(4), torch.full((4,), 1.0))


# per lane: (drafts, the target's token at the anchor and after each draft) -> committed run
TOKEN_CASES = [
    [([1, 2, 3], [1, 2, 3, 4])],
    [([1, 2, 3], [5, 2, 3, 4])],
    [([1, 2], [1, 2, 9]), ([3, 4, 5], [3, 6, 5, 1]), ([], [7])],
    [([], [8]), ([3, 4], [3, 4, 2])],
]


@pytest.mark.parametrize("case", range(len(TOKEN_CASES)))
def test_accept_from_tokens_commits_what_accept_from_logits_commits(case):
    lanes = TOKEN_CASES[case]
    k = max(len(d) for d, _ in lanes)
    drafts = torch.tensor([d + [-1] * (k - len(d)) for d, _ in lanes], dtype=torch.int64).reshape(len(lanes), k)
    tokens = torch.tensor([t for _, toks in lanes for t in toks], dtype=torch.int64)
    cu = torch.tensor([0] + torch.tensor([len(t) for _, t in lanes]).cumsum(0).tolist(), dtype=torch.int64)
    lens = torch.tensor([len(d) for d, _ in lanes], dtype=torch.int64)
    logits = torch.zeros(len(tokens), 16)
    logits[torch.arange(len(tokens)), tokens] = 1.0
    n = len(lanes)
    want = accept(
        logits, cu, drafts, lens, None, torch.zeros(n), torch.zeros(n, dtype=torch.int64), torch.ones(n), None,
        torch.zeros(n, k + 1),
    )  # fmt: skip
    for got in (accept_tokens(tokens, cu, drafts, lens), accept_tokens_ref(tokens, cu, drafts, lens)):
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
