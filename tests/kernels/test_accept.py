"""accept: case tables (ref and triton) and the triton kernel against its torch twin on random rounds."""

from __future__ import annotations

import math

import pytest
import torch
from interpreted import require_interpreted_triton

from speclane.kernels import accept as accept_mod
from speclane.kernels import accept_triton as accept_triton_mod
from speclane.kernels.accept import accept_ref
from speclane.kernels.sampling import process_logits_ref

V = 12
NEG = -30.0  # exp(-30) ~ 1e-13: a "never" token whose probability still is not exactly 0


def impls():
    return ["ref", "triton"]


def run(impl, *args, **kw):
    if impl == "triton":
        require_interpreted_triton(accept_triton_mod)
        return accept_triton_mod.accept_triton(*args, block=8, **kw)  # block 8 < vocab 12: two blocks, a ragged tail
    return accept_ref(*args, **kw)


def round_inputs(lanes, temps, u_accept=None, u_sample=None):
    """lanes: (drafts, target rows as {token: prob} or an int = that token certain). Rows are anchor + drafts."""
    k = max(len(d) for d, _ in lanes)
    rows, cu = [], [0]
    for drafts, targets in lanes:
        assert len(targets) == len(drafts) + 1
        for tgt in targets:
            dist = {tgt: 1.0} if isinstance(tgt, int) else tgt
            rows.append([math.log(dist[v]) if v in dist else NEG for v in range(V)])
        cu.append(cu[-1] + len(targets))
    n = len(lanes)
    drafts = torch.tensor([d + [-1] * (k - len(d)) for d, _ in lanes], dtype=torch.int64).reshape(n, k)
    return (
        torch.tensor(rows),
        torch.tensor(cu),
        drafts,
        torch.tensor([len(d) for d, _ in lanes]),
        None,
        torch.tensor(temps, dtype=torch.float32),
        torch.zeros(n, dtype=torch.int64),
        torch.ones(n),
        torch.full((n, k), 0.5) if u_accept is None else torch.tensor(u_accept),
        torch.full((n, k + 1), 0.5) if u_sample is None else torch.tensor(u_sample),
    )


# (case, drafts, target rows, expected committed run)
CASES = [
    ("all accepted", [5, 6, 7], [5, 6, 7, 9], [5, 6, 7, 9]),
    ("none accepted", [5, 6, 7], [1, 6, 7, 9], [1]),
    ("partial", [5, 6, 7], [5, 2, 7, 9], [5, 2]),
    ("short lane, -1 padded", [5, 6], [5, 6, 8], [5, 6, 8]),
    ("no drafts", [], [4], [4]),
    ("a later match does not count", [5, 6, 7], [3, 6, 7, 9], [3]),
]


@pytest.mark.parametrize("impl", impls())
@pytest.mark.parametrize("temp", [0.0, 1.0], ids=["greedy", "sampling-peaked"])
def test_case_table(impl, temp):
    # sampling lanes with certain targets (other tokens at ~1e-13) must commit exactly what greedy does
    lanes = [(d, t) for _, d, t, _ in CASES]
    committed, committed_len, accepted = run(impl, *round_inputs(lanes, [temp] * len(lanes)))
    for row, (name, _, _, want) in enumerate(CASES):
        assert committed[row].tolist() == want + [-1] * (4 - len(want)), name
        assert committed_len[row].item() == len(want), name
        assert accepted[row].item() == len(want) - 1, name


MIXED = {0: 0.3, 1: 0.6, 2: 0.1}
MIXED_LANES = [([0, 4], [MIXED, 4, 5])] * 4 + [([1, 4], [MIXED, 4, 5])]
MIXED_TEMPS = [1.0, 1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("impl", impls())
def test_mixed_greedy_and_sampling_lanes_sample_and_compare(impl):
    """No q: the target's token is drawn at each row with u_sample; drafts are accepted while they equal it."""
    # sampling: u=0.2 draws 0 (cdf 0.3) = the draft; 4 is certain; bonus 5
    # sampling: u=0.5 draws 1 (cdf 0.9) != 0: [1];  u=0.95 draws 2: [2]
    # greedy: argmax 1 != 0: [1];  greedy: 1, 4 accepted, bonus 5
    us = [[0.2, 0.5, 0.5], [0.5] * 3, [0.95, 0.5, 0.5], [0.5] * 3, [0.5] * 3]
    ua = [[0.0, 0.0]] * 5  # not read without q: a u_accept of 0 would accept every draft under rejection sampling
    committed, committed_len, _ = run(impl, *round_inputs(MIXED_LANES, MIXED_TEMPS, ua, us))
    assert committed.tolist() == [[0, 4, 5], [1, -1, -1], [2, -1, -1], [1, -1, -1], [1, 4, 5]]
    assert committed_len.tolist() == [3, 1, 1, 1, 3]


@pytest.mark.parametrize("impl", impls())
def test_mixed_greedy_and_sampling_lanes_rejection(impl):
    """A one-hot q passed as draft_probs: rejection sampling, u_accept * q(d) < p(d), residual p without d."""
    # sampling: p(0)=0.3, u_accept=0.2 accepts; then 4 is certain; bonus 5
    # sampling: u_accept=0.5 rejects 0; residual {1: 0.6, 2: 0.1}, u=0.5 -> 1
    # sampling: rejected; u=0.9 -> 0.9 * 0.7 = 0.63 > 0.6 -> 2
    # greedy: argmax 1 != 0 -> [1];  greedy: 1, 4 accepted, bonus 5
    args = list(
        round_inputs(
            MIXED_LANES,
            MIXED_TEMPS,
            [[0.2, 0.5]] + [[0.5, 0.5]] * 4,
            [[0.5] * 3, [0.5] * 3, [0.9, 0.5, 0.5], [0.5] * 3, [0.5] * 3],
        )
    )
    args[4] = torch.nn.functional.one_hot(args[2], V).float()
    committed, committed_len, _ = run(impl, *args)
    assert committed.tolist() == [[0, 4, 5], [1, -1, -1], [2, -1, -1], [1, -1, -1], [1, 4, 5]]
    assert committed_len.tolist() == [3, 1, 1, 1, 3]


@pytest.mark.parametrize("impl", impls())
def test_without_q_the_token_at_a_row_does_not_depend_on_the_drafts(impl):
    """The seeded on/off property at the kernel: whatever the drafts, the committed token at row j is the draw
    from p_j with u_sample[j], so the text is that of plain decoding with the same uniforms."""
    rows = [{0: 0.25, 1: 0.25, 2: 0.5}, {3: 0.5, 4: 0.5}, {5: 0.2, 6: 0.8}, {7: 0.5, 8: 0.5}]
    us = [[0.1, 0.7, 0.5, 0.3]]
    plain = [0, 4, 6, 7]  # the draw at each row with its uniform (cdf crossings)
    for drafts in ([0, 4, 6], [0, 3, 6], [2, 4, 6], [0, 4, 5]):
        committed, committed_len, _ = run(impl, *round_inputs([(drafts, rows)], [1.0], None, us))
        n = int(committed_len[0])
        assert committed[0, :n].tolist() == plain[:n], drafts
        assert n == 1 + next((j for j, d in enumerate(drafts) if d != plain[j]), 3), drafts


@pytest.mark.parametrize("impl", impls())
def test_draft_probs_equal_to_target_accepts_everything(impl):
    args = list(round_inputs([([3, 4, 5], [{3: 0.5, 4: 0.5}] * 4), ([7], [{7: 0.2, 8: 0.8}] * 2)], [1.0, 1.0]))
    p = process_logits_ref(args[0], torch.ones(6), torch.zeros(6, dtype=torch.int64), torch.ones(6))
    q = torch.zeros(2, 3, V)
    q[0] = p[0:3]
    q[1, 0] = p[4]
    args[4] = q  # q = p: min(1, p/q) = 1 for every draft
    args[8] = torch.full((2, 3), 0.999)
    committed, committed_len, _ = run(impl, *args)
    assert committed_len.tolist() == [4, 2]
    assert committed[0, :3].tolist() == [3, 4, 5] and committed[1, :1].tolist() == [7]


@pytest.mark.parametrize("vocab", [1000, 4099])
@pytest.mark.parametrize("with_q", [False, True])
def test_kernel_matches_ref_on_random_rounds(vocab, with_q):
    require_interpreted_triton(accept_triton_mod)
    g = torch.Generator().manual_seed(vocab * 2 + with_q)
    lanes, k = 7, 5
    draft_len = torch.tensor([5, 0, 3, 1, 5, 2, 4])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(draft_len + 1, 0)])
    # peaked logits so that drafts from a nearby distribution get accepted a fair share of the time
    base = torch.randn(lanes, vocab, generator=g) * 4
    target = torch.cat(
        [
            base[l].repeat(int(draft_len[l]) + 1, 1) + torch.randn(int(draft_len[l]) + 1, vocab, generator=g)
            for l in range(lanes)
        ]
    )
    temp = torch.tensor([0.0, 1.0, 0.8, 0.0, 1.2, 1.0, 0.6])
    top_k = torch.tensor([0, 0, 20, 0, vocab, 5, 0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 0.8, 1.0, 0.95])
    dl = base[:, None, :] + torch.randn(lanes, k, vocab, generator=g)
    q = process_logits_ref(
        dl.reshape(-1, vocab),
        temp.repeat_interleave(k).clamp(min=0.5),
        top_k.repeat_interleave(k),
        top_p.repeat_interleave(k),
    ).view(lanes, k, vocab)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(lanes, k)
    drafts[torch.arange(k)[None, :] >= draft_len[:, None]] = -1
    args = (
        target,
        cu,
        drafts,
        draft_len,
        q if with_q else None,
        temp,
        top_k,
        top_p,
        torch.rand(lanes, k, generator=g),
        torch.rand(lanes, k + 1, generator=g),
    )
    want = accept_ref(*args)
    got = accept_triton_mod.accept_triton(*args, block=512)
    for w, x in zip(want, got):
        assert torch.equal(w, x)
    assert 0 < int(want[2].sum()) < int(draft_len.sum())  # the round mixes acceptances and rejections


def test_inconsistent_cu_rows_refused():
    args = list(round_inputs([([5, 6], [5, 6, 7])], [0.0]))
    args[1] = torch.tensor([0, 2])
    with pytest.raises(ValueError, match="cu_rows must give each lane draft_len \\+ 1 rows"):
        accept_ref(*args)


def test_value_checks_run_only_when_asked(monkeypatch):
    """The wrappers read argument values on the host only with SPECLANE_CHECK_VALUES=1 (set for the whole suite
    by tests/conftest.py): serving skips those per-round host reads; shapes and dtypes are checked always."""
    args = list(round_inputs([([5, 6], [5, 6, 7])], [0.0]))
    args[1] = torch.tensor([0, 2])  # inconsistent with draft_len: a value defect
    monkeypatch.delenv("SPECLANE_CHECK_VALUES")
    accept_ref(*args)  # not read: no error, no host read
    args[2] = args[2].int()  # a dtype defect is caught either way
    with pytest.raises(ValueError, match="drafts must be int64"):
        accept_ref(*args)


@pytest.mark.parametrize("vocab", [12, 1000, 4099])
def test_greedy_cpu_kernel_matches_ref_on_random_rounds(vocab):
    """The C greedy path (a round of greedy lanes without draft_probs) equals the torch twin: ties (the first
    index wins), a NaN row (it counts as largest), lanes with no drafts, drafts that agree for a while."""
    from speclane.kernels import cpu_build

    if cpu_build.library() is None:
        pytest.skip(f"no C kernels here: {cpu_build.unavailable()}")
    g = torch.Generator().manual_seed(vocab)
    for trial in range(40):
        lanes, k = 1 + trial % 4, trial % 8
        draft_len = torch.randint(0, k + 1, (lanes,), generator=g)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(draft_len + 1, 0)])
        logits = torch.randint(0, 5, (int(cu[-1]), vocab), generator=g).float()  # few values: many ties
        if trial % 7 == 3:
            logits[0, vocab // 2] = float("nan")
        drafts = torch.randint(0, vocab, (lanes, k), generator=g)
        truth = logits.argmax(dim=1)
        for lane in range(lanes):  # most drafts agree with the target, so runs are long
            for j in range(int(draft_len[lane])):
                if torch.rand(1, generator=g) < 0.8:
                    drafts[lane, j] = truth[cu[lane] + j]
        t = torch.zeros(lanes)
        args = (
            logits,
            cu,
            drafts,
            draft_len,
            None,
            t,
            torch.zeros(lanes, dtype=torch.int64),
            torch.ones(lanes),
            None,
            torch.zeros(lanes, k + 1),
        )
        want = accept_ref(*args)
        got = accept_mod.accept_greedy_cpu(logits, cu, drafts, draft_len)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), trial
        assert all(torch.equal(a, b) for a, b in zip(accept_mod.accept(*args), want)), trial
