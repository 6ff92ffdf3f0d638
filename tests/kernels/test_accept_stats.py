"""Both accept rules keep the target distribution (sample-and-compare without q, rejection sampling with it):
chi-square tests that fail when the property is broken.

The target here ignores context (row i of every lane has the same logits), so under correct rejection sampling
the committed token at position j, given anything about positions < j, is distributed as the processed p_j.
Each test checks positions 0 and 1 (given the run reached it) with Pearson's chi-square at ALPHA = 1e-4 per
test: with a fixed seed the outcome is deterministic, and a correct sampler fails with probability 1e-4 per
seed. The planted-bias tests run the same checker on a broken round and require it to report a failure.
"""

from __future__ import annotations

import torch

from speclane.kernels.accept import accept_ref
from speclane.kernels.sampling import process_logits_ref, sample_from_uniform_ref

ALPHA = 1e-4
LANES, K, V = 40_000, 3, 8


def chi_square_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of `samples` against `probs`; a sample outside the support gives 0."""
    counts = torch.bincount(samples, minlength=V).double()
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = probs[support].double() * counts.sum()
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def params(n, temp, top_k, top_p):
    return (torch.full((n,), temp), torch.full((n,), top_k, dtype=torch.int64), torch.full((n,), top_p))


def make_round(seed, drafter, temp=1.0, top_k=5, top_p=0.9):
    """-> accept args and the processed target p [K + 1, V]. drafter: 'deterministic' | 'sampling'."""
    g = torch.Generator().manual_seed(seed)
    target_rows = torch.randn(K + 1, V, generator=g) * 1.5
    p = process_logits_ref(target_rows, *params(K + 1, temp, top_k, top_p))
    # a drafter near the target but far from equal: acceptance and rejection both happen often
    draft_logits = target_rows[:K] + torch.randn(K, V, generator=g)
    q = process_logits_ref(draft_logits, *params(K, temp, top_k, top_p))  # the distribution drafts come from
    raw_q = torch.softmax(draft_logits / temp, dim=1)  # before top-k/top-p: the transformers bug's q
    u_draft = torch.rand(LANES, K, generator=g)
    drafts = torch.stack(
        [sample_from_uniform_ref(q[i].expand(LANES, V).contiguous(), u_draft[:, i]) for i in range(K)], 1
    )
    rows = target_rows.repeat(LANES, 1)  # [LANES * (K + 1), V]
    cu = torch.arange(LANES + 1) * (K + 1)
    draft_probs = q.expand(LANES, K, V).contiguous() if drafter == "sampling" else None
    args = [
        rows,
        cu,
        drafts,
        torch.full((LANES,), K),
        draft_probs,
        *params(LANES, temp, top_k, top_p),
        torch.rand(LANES, K, generator=g),
        torch.rand(LANES, K + 1, generator=g),
    ]
    return args, p, raw_q


def positions_keep_target(args, p) -> bool:
    committed, committed_len, _ = accept_ref(*args)
    first = chi_square_pvalue(committed[:, 0], p[0])
    reached = committed_len >= 2
    second = chi_square_pvalue(committed[reached, 1], p[1])
    assert reached.sum() > 2_000  # enough runs reach position 1 for the test to have power
    return first > ALPHA and second > ALPHA


def test_deterministic_drafter_keeps_target_distribution():
    # drafts drawn from q but passed as one-hot: a drafter whose choice is fixed before the target is seen
    args, p, _ = make_round(1, "deterministic")
    assert positions_keep_target(args, p)


def test_sampling_drafter_with_topk_topp_keeps_target_distribution():
    args, p, _ = make_round(2, "sampling")
    assert positions_keep_target(args, p)


def test_greedy_drafter_at_temperature_0_is_argmax():
    args, p, _ = make_round(3, "deterministic", temp=0.0)
    committed, _, _ = accept_ref(*args)
    assert bool((committed[:, 0] == p[0].argmax()).all())


def test_catches_always_accepting_drafts():
    args, p, _ = make_round(4, "sampling")
    args[8] = torch.zeros(LANES, K)  # u_accept = 0: every draft inside p's support is accepted
    assert not positions_keep_target(args, p)


def test_catches_raw_q_instead_of_processed_q():
    args, p, raw_q = make_round(5, "sampling")
    args[4] = raw_q.expand(LANES, K, V).contiguous()  # drafts were sampled from the top-k/top-p q
    assert not positions_keep_target(args, p)


def test_catches_one_uniform_for_every_row():
    # sample-and-compare (no q) is exact only if each row's draw has its own uniform: reusing row 0's couples
    # position 1 to the token accepted at position 0
    args, p, _ = make_round(6, "deterministic")
    args[9] = args[9][:, :1].expand(LANES, K + 1).contiguous()
    assert not positions_keep_target(args, p)
