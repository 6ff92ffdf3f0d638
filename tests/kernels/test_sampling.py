"""process_logits and sample_from_uniform: triton vs torch twin, tie and edge semantics, reproducibility."""

from __future__ import annotations

import math

import pytest
import torch
from interpreted import require_interpreted_triton

from speclane.kernels import sampling
from speclane.kernels.sampling import process_logits_ref, sample_from_uniform_ref


def params(t, k, p):
    return (
        torch.tensor(t, dtype=torch.float32),
        torch.tensor(k, dtype=torch.int64),
        torch.tensor(p, dtype=torch.float32),
    )


@pytest.mark.parametrize("vocab", [1000, 4099])
def test_process_kernel_matches_ref(vocab):
    require_interpreted_triton(sampling)
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=g) * 3
    t, k, p = params([0.0, 1.0, 0.7, 1.3, 2.0, 0.5], [0, 7, 0, vocab, 50, vocab + 3], [1.0, 1.0, 0.9, 0.5, 0.95, 0.3])
    ref = process_logits_ref(logits, t, k, p)
    got = sampling.process_logits_triton(logits, t, k, p, block=256)  # 256: several blocks and a ragged tail
    # the kept sets must agree exactly; values differ only by exp/sum rounding order: a few float32 ulps of 1
    assert torch.equal(ref > 0, got > 0)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vocab", [1000, 4099])
def test_sample_kernel_matches_ref(vocab):
    require_interpreted_triton(sampling)
    g = torch.Generator().manual_seed(vocab + 1)
    w = torch.rand(5, vocab, generator=g)
    w[w < 0.5] = 0  # zero-weight tokens, unnormalised rows (a rejection residual)
    u = torch.tensor([0.0, 0.3, 0.5, 0.77, 1 - 2**-24])
    ref = sample_from_uniform_ref(w, u)
    got = sampling.sample_from_uniform_triton(w, u, block=256)
    assert torch.equal(got, ref)
    assert bool((w.gather(1, ref[:, None]) > 0).all())


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_topk_topp_ties_and_edges(impl):
    if impl == "triton":
        require_interpreted_triton(sampling)
        fn = lambda *a: sampling.process_logits_triton(*a, block=4)  # noqa: E731 - tiny block: ties straddle blocks
    else:
        fn = process_logits_ref
    # probabilities 0.4, 0.2, 0.2, 0.2 and a token at ~0; ties at the top-k and top-p boundaries
    lp = torch.log(torch.tensor([0.2, 0.4, 0.2, 1e-30, 0.2]))
    logits = lp.repeat(9, 1)
    t, k, p = params([1.0] * 9, [2, 1, 0, 5, 9, 0, 0, 0, 3], [1.0, 1.0, 1.0, 1.0, 1.0, 0.39, 0.41, 1e-6, 0.5])
    kept = (fn(logits, t, k, p) > 0).int().tolist()
    assert kept == [
        [1, 1, 1, 0, 1],  # top_k=2: the 2nd largest is tied three ways, all three kept
        [0, 1, 0, 0, 0],  # top_k=1
        [1, 1, 1, 1, 1],  # top_k=0: off
        [1, 1, 1, 1, 1],  # top_k=vocab: off
        [1, 1, 1, 1, 1],  # top_k>vocab: off
        [0, 1, 0, 0, 0],  # top_p=0.39: mass above the 0.2s is 0.4, not < 0.39
        [1, 1, 1, 0, 1],  # top_p=0.41: the tie group is kept whole, the ~0 token is not
        [0, 1, 0, 0, 0],  # tiny top_p still keeps the most probable token
        [1, 1, 1, 0, 1],  # top_k=3 keeps the whole tie group; top_p=0.5: 0.4 above the 0.2s is < 0.5
    ]


def test_topk_topp_combined_renormalises():
    lp = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3]]))
    probs = process_logits_ref(lp, *params([1.0, 1.0], [2, 0], [1.0, 0.75]))
    want = torch.tensor([[0.0, 0.4, 0.0, 0.3], [0.0, 0.4, 0.2, 0.3]])  # top-p: 0.7 above the 0.2 is < 0.75
    torch.testing.assert_close(probs, want / want.sum(1, keepdim=True), rtol=0, atol=1e-6)


def test_greedy_is_first_argmax_and_temperature_scales():
    logits = torch.tensor([[1.0, 5.0, 5.0, 0.0], [0.0, math.log(2.0), 0.0, 0.0]])
    probs = process_logits_ref(logits, *params([0.0, 0.5], [0, 0], [1.0, 1.0]))
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    torch.testing.assert_close(probs[1], torch.tensor([1.0, 4.0, 1.0, 1.0]) / 7, rtol=0, atol=1e-6)


def test_sampling_reproducible_and_follows_the_cdf():
    g = torch.Generator().manual_seed(3)
    probs = process_logits_ref(
        torch.randn(1, 7, generator=g).repeat(4000, 1), *params([1.0] * 4000, [5] * 4000, [1.0] * 4000)
    )
    u = (torch.arange(4000, dtype=torch.float32) + 0.5) / 4000  # a uniform grid: counts are a quadrature of p
    a = sample_from_uniform_ref(probs, u)
    assert torch.equal(a, sample_from_uniform_ref(probs, u.clone()))
    freq = torch.bincount(a, minlength=7).float() / 4000
    assert (freq - probs[0]).abs().max() <= 1 / 4000 + 1e-6  # one grid step of error at most
    assert freq[probs[0] == 0].sum() == 0


def test_bad_parameters_are_refused():
    logits = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="top_p must be in"):
        process_logits_ref(logits, *params([1.0, 1.0], [0, 0], [1.0, 0.0]))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        process_logits_ref(logits, *params([-1.0, 1.0], [0, 0], [1.0, 1.0]))
    with pytest.raises(ValueError, match=r"u must be in \[0, 1\)"):
        sample_from_uniform_ref(torch.ones(2, 5), torch.tensor([0.5, 1.0]))
