"""The accept step of a verify round: per lane, the committed run from the target rows and the drafts.

Owns: `accept` (dispatcher), `accept_ref` (torch twin) and the triton kernel (one program per lane). Not here:
logits processing and inverse-CDF sampling (kernels/sampling.py, used by both paths) and random number
generation (the caller passes uniforms keyed by request seed and output position, stages/accept.py).

p and q are float32 after temperature, top-k and top-p; greedy lanes (temperature 0) have a one-hot p at the
argmax. Two rules, one per kind of drafter:
- `draft_probs` None, a deterministic drafter (a one-hot q), runs sample-and-compare, the exact shortcut of
  a one-hot q: draw the target's own token at every row j with `u_sample[j]` (inverse CDF of p_j; the
  argmax for greedy lanes), accept drafts while they equal it, and commit the drawn tokens up to and including
  the first mismatch (or the bonus after the last draft). The token at row j depends on p_j and u_sample[j]
  only, never on the drafts, which is what makes a seeded request's text the same with speculation on or off.
  `u_accept` is not read (None is allowed).
- with `draft_probs`, a drafter that samples, rejection sampling (Leviathan et al. 2023, Chen et al. 2023): draft
  i is accepted when u_accept * q(d) < p(d), i.e. with probability min(1, p/q); on the first rejection the token is
  drawn from max(p - q, 0) (unnormalised: the inverse-CDF sampler scales by its total); if every draft is
  accepted the bonus is drawn from p of the lane's last row. q must be exactly the distribution the draft was
  sampled from, after the same temperature, top-k and top-p (else acceptance is inflated and the output biased).

Nothing leaves the device: variable runs are `committed [lanes, K + 1]` padded with -1 plus `committed_len`.
"""

from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import HAVE_TRITON, check, checks_values, tl, triton, use_triton
from speclane.kernels.sampling import process_logits, process_logits_ref, row_argmax, sample_from_uniform_ref


def _check_args(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample):
    check(target.dim() == 2 and target.is_floating_point(), f"target must be float [rows, vocab], got {target.dtype} {tuple(target.shape)}")
    check(drafts.dim() == 2 and drafts.dtype == torch.int64, f"drafts must be int64 [lanes, K], got {drafts.dtype} {tuple(drafts.shape)}")
    lanes, k = drafts.shape
    vocab = target.shape[1]
    check(cu_rows.shape == (lanes + 1,) and cu_rows.dtype == torch.int64, f"cu_rows must be int64 [lanes + 1 = {lanes + 1}], got {cu_rows.dtype} {tuple(cu_rows.shape)}")
    check(u_accept is not None or draft_probs is None, "u_accept is needed with draft_probs (rejection sampling)")
    given = [("u_accept", u_accept, (lanes, k), torch.float32)] if u_accept is not None else []
    for name, t, shape, dt in [("draft_len", draft_len, (lanes,), torch.int64), ("temperature", temperature, (lanes,), torch.float32),
                               ("top_k", top_k, (lanes,), torch.int64), ("top_p", top_p, (lanes,), torch.float32),
                               ("u_sample", u_sample, (lanes, k + 1), torch.float32), *given]:
        check(t.shape == shape and t.dtype == dt, f"{name} must be {dt} {list(shape)}, got {t.dtype} {tuple(t.shape)}")
        check(t.device == target.device, f"{name} on {t.device}, target on {target.device}")
    if draft_probs is not None:
        check(draft_probs.shape == (lanes, k, vocab) and draft_probs.dtype == torch.float32,
              f"draft_probs must be float32 [lanes, K, vocab] = {[lanes, k, vocab]}, got {draft_probs.dtype} {tuple(draft_probs.shape)}")
    if checks_values(target):  # value ranges: host reads every round, so tests only (kernels/_triton.py)
        n = cu_rows[1:] - cu_rows[:-1]
        check(bool((draft_len >= 0).all() and (draft_len <= k).all()), f"draft_len must be in [0, K={k}]")
        check(bool((n == draft_len + 1).all()), "cu_rows must give each lane draft_len + 1 rows (anchor + drafts)")
        check(int(cu_rows[0]) == 0 and int(cu_rows[-1]) <= target.shape[0], f"cu_rows must start at 0 and end <= rows={target.shape[0]}")
        valid = torch.arange(k, device=drafts.device)[None, :] < draft_len[:, None]
        check(bool(((drafts >= 0) & (drafts < vocab))[valid].all()), f"drafts within draft_len must be in [0, vocab={vocab})")
        us = (u_sample,) if u_accept is None else (u_sample, u_accept)
        check(all(bool(((u >= 0) & (u < 1)).all()) for u in us), "uniforms must be in [0, 1)")


def accept_ref(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample,
               target_is_probs: bool = False):
    """-> committed [lanes, K + 1] int64 (-1 padded), committed_len [lanes] int64, accepted [lanes] int64."""
    _check_args(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample)
    lanes, k = drafts.shape
    vocab = target.shape[1]
    dev = target.device
    pos = torch.arange(k + 1, device=dev)
    # [lanes, K + 1] row of each position; positions past draft_len reuse the lane's anchor row and are masked
    rows = cu_rows[:-1, None] + torch.where(pos[None, :] <= draft_len[:, None], pos[None, :], 0)
    greedy = temperature == 0
    if draft_probs is None:
        return _sample_and_compare(target, rows, drafts, draft_len, greedy, temperature, top_k, top_p, u_sample,
                                   target_is_probs)
    if target_is_probs:
        p = target.float()[rows]  # [lanes, K + 1, vocab]
    else:
        rep = lambda t: t[:, None].expand(lanes, k + 1).reshape(-1)  # noqa: E731 - per-lane params per row
        p = process_logits_ref(target[rows.reshape(-1)].float(), rep(temperature), rep(top_k), rep(top_p)).view(lanes, k + 1, vocab)
    valid = pos[None, :k] < draft_len[:, None]  # [lanes, K]
    d = drafts.clamp(min=0)
    p_d = p[:, :k].gather(2, d[:, :, None])[:, :, 0]  # [lanes, K]
    q_d = draft_probs.gather(2, d[:, :, None])[:, :, 0]
    ok_sample = u_accept * q_d < p_d
    ok_greedy = d == p[:, :k].argmax(dim=2)
    ok = torch.where(greedy[:, None], ok_greedy, ok_sample) & valid
    accepted = torch.cumprod(ok.long(), dim=1).sum(dim=1)  # leading run of accepted drafts [lanes]
    # the token after the run: residual at the first rejection, else the bonus from the last row
    p_j = p[torch.arange(lanes, device=dev), accepted]  # [lanes, vocab]
    rejected = accepted < draft_len
    j = accepted.clamp(max=max(k - 1, 0))
    if k == 0:  # no drafts anywhere: every lane samples its bonus
        q_j = torch.zeros_like(p_j)
    else:
        q_j = draft_probs[torch.arange(lanes, device=dev), j]
    residual = (p_j - q_j).clamp(min=0)
    # a residual of zero mass cannot follow a true rejection; rounding could produce one, so fall back to p
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_j)
    weights = torch.where(rejected[:, None], residual, p_j)
    u = u_sample.gather(1, accepted[:, None])[:, 0]
    sampled = sample_from_uniform_ref(weights.contiguous(), u)
    token = torch.where(greedy, p_j.argmax(dim=1), sampled)
    committed = torch.where(pos[None, :k] < accepted[:, None], drafts, -1) if k else drafts.new_empty(lanes, 0)
    committed = torch.cat([committed, torch.full((lanes, 1), -1, dtype=torch.int64, device=dev)], dim=1)
    committed.scatter_(1, accepted[:, None], token[:, None])
    return committed, accepted + 1, accepted


def _sample_and_compare(target, rows, drafts, draft_len, greedy, temperature, top_k, top_p, u_sample, target_is_probs):
    """The rule for a deterministic drafter (see the module docstring); the same returns as `accept_ref`."""
    lanes, k1 = rows.shape
    pos = torch.arange(k1, device=target.device)
    picked = target.index_select(0, rows.reshape(-1))  # [lanes * (K + 1), vocab]
    token = row_argmax(picked)  # greedy: the argmax of p is the argmax of the logits
    # all-greedy rounds skip processing; the check reads the device, so a GPU takes the triton kernel instead
    if target.is_cuda or bool((~greedy).any()):
        if target_is_probs:
            p = picked.float().contiguous()
        else:
            rep = lambda t: t.repeat_interleave(k1)  # noqa: E731 - per-lane params per row
            p = process_logits_ref(picked.float().contiguous(), rep(temperature), rep(top_k), rep(top_p))
        sampled = sample_from_uniform_ref(p, u_sample.reshape(-1))
        token = torch.where(greedy.repeat_interleave(k1), token, sampled)
    token = token.view(lanes, k1)
    valid = pos[None, :k1 - 1] < draft_len[:, None]
    agree = (token[:, :k1 - 1] == drafts) & valid
    accepted = torch.cumprod(agree.long(), dim=1).sum(dim=1)  # [lanes]
    committed = torch.where(pos[None, :] <= accepted[:, None], token, torch.full_like(token, -1))
    return committed, accepted + 1, accepted


if HAVE_TRITON:

    from speclane.kernels.sampling import sample_row

    @triton.jit
    def _store_run(drafts_ptr, committed_ptr, clen_ptr, acc_ptr, lane, K, acc, tok, BLOCK_K1: tl.constexpr):
        """The lane's committed run: its first `acc` drafts, then `tok`, then -1; its length and accepted count."""
        ks = tl.arange(0, BLOCK_K1)
        dr = tl.load(drafts_ptr + lane * K + ks, mask=ks < acc, other=-1)
        out = tl.where(ks < acc, dr, tl.where(ks == acc, tok.to(dr.dtype), -1))
        tl.store(committed_ptr + lane * (K + 1) + ks, out, mask=ks < K + 1)
        tl.store(clen_ptr + lane, acc + 1)
        tl.store(acc_ptr + lane, acc)

    @triton.jit
    def _compare_kernel(p_ptr, cu_ptr, drafts_ptr, dlen_ptr, us_ptr, committed_ptr, clen_ptr, acc_ptr,
                        V, K, BLOCK: tl.constexpr, BLOCK_K1: tl.constexpr):
        # Sample-and-compare. Greedy lanes need no branch: their p rows are one-hot, so the draw is the argmax.
        lane = tl.program_id(0)
        start = tl.load(cu_ptr + lane)
        n = tl.load(dlen_ptr + lane)
        acc = n * 0
        going = n * 0 + 1
        tok_out = n * 0
        for i in range(0, K + 1):
            live = going == 1
            # a row past the first mismatch is not read (lim 0): a scalar bool & in a mask trips the interpreter
            tok = sample_row(p_ptr + (start + i).to(tl.int64) * V, tl.load(us_ptr + lane * (K + 1) + i), V,
                             tl.where(live, V, 0), BLOCK)
            has_draft = live & (i < n)
            d = tl.load(drafts_ptr + lane * K + tl.where(has_draft, i, 0), mask=has_draft, other=-1)
            match = has_draft & (tok == d)
            tok_out = tl.where(live & (match == 0), tok, tok_out)  # the first mismatch, or the bonus
            acc += match.to(acc.dtype)
            going = tl.where(match, going, 0)
        _store_run(drafts_ptr, committed_ptr, clen_ptr, acc_ptr, lane, K, acc, tok_out, BLOCK_K1)

    @triton.jit
    def _accept_kernel(p_ptr, cu_ptr, drafts_ptr, dlen_ptr, q_ptr, ua_ptr, us_ptr, committed_ptr, clen_ptr, acc_ptr,
                       V, K, BLOCK: tl.constexpr, BLOCK_K1: tl.constexpr):
        # Rejection sampling. Greedy lanes need no branch: their p rows are one-hot at the argmax, so
        # u * q(d) < p(d) holds exactly when d is the argmax (u < 1, q <= 1), and the residual or bonus is the argmax.
        lane = tl.program_id(0)
        start = tl.load(cu_ptr + lane)
        n = tl.load(dlen_ptr + lane)
        acc = n * 0
        going = n * 0 + 1
        for i in range(0, K):
            live = (i < n) & (going == 1)
            d = tl.where(live, tl.load(drafts_ptr + lane * K + i), 0)
            p_d = tl.load(p_ptr + (start + i).to(tl.int64) * V + d, mask=live, other=0.0)
            q_d = tl.load(q_ptr + (lane * K + i).to(tl.int64) * V + d, mask=live, other=1.0)
            ok = live & (tl.load(ua_ptr + lane * K + i) * q_d < p_d)
            acc += ok.to(acc.dtype)
            going = tl.where(ok, going, 0)
        rejected = acc < n
        prow = p_ptr + (start + acc).to(tl.int64) * V
        qrow = q_ptr + (lane * K + acc).to(tl.int64) * V
        q_lim = tl.where(rejected, V, 0)  # q of the rejected row only; a bool & in a mask trips the interpreter
        r_tot = 0.0
        p_tot = 0.0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            pv = tl.load(prow + offs, mask=offs < V, other=0.0)
            qv = tl.load(qrow + offs, mask=offs < q_lim, other=0.0)
            r_tot += tl.sum(tl.maximum(pv - qv, 0.0), axis=0)
            p_tot += tl.sum(pv, axis=0)
        use_p = r_tot <= 0.0  # a zero-mass residual cannot follow a true rejection; rounding could make one
        target = tl.load(us_ptr + lane * (K + 1) + acc) * tl.where(use_p, p_tot, r_tot)
        carry = 0.0
        tok = V
        last_nz = 0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            pv = tl.load(prow + offs, mask=offs < V, other=0.0)
            qv = tl.load(qrow + offs, mask=offs < q_lim, other=0.0)
            w = tl.where(use_p, pv, tl.maximum(pv - qv, 0.0))
            c = tl.cumsum(w, axis=0) + carry
            tok = tl.minimum(tok, tl.min(tl.where((c > target) & (offs < V), offs, V), axis=0))
            last_nz = tl.maximum(last_nz, tl.max(tl.where(w > 0, offs, 0), axis=0))
            carry += tl.sum(w, axis=0)
        _store_run(drafts_ptr, committed_ptr, clen_ptr, acc_ptr, lane, K, acc, tl.minimum(tok, last_nz), BLOCK_K1)


def accept_triton(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample,
                  target_is_probs: bool = False, block: int = 1024):
    check(HAVE_TRITON, "accept_triton: triton is not installed")
    _check_args(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample)
    lanes, k = drafts.shape
    rows, vocab = target.shape
    if target_is_probs:
        p = target.float().contiguous()
    else:
        # lane of each row without a host sync (rows past cu_rows[-1] take the last lane and are never read)
        lane_of_row = (torch.searchsorted(cu_rows, torch.arange(rows, device=target.device), right=True) - 1).clamp(0, max(lanes - 1, 0))
        p = process_logits(target.contiguous(), temperature[lane_of_row], top_k[lane_of_row], top_p[lane_of_row])
    committed = torch.empty(lanes, k + 1, dtype=torch.int64, device=target.device)
    committed_len = torch.empty(lanes, dtype=torch.int64, device=target.device)
    accepted = torch.empty(lanes, dtype=torch.int64, device=target.device)
    if lanes and draft_probs is None:
        _compare_kernel[(lanes,)](p, cu_rows.contiguous(), drafts.contiguous(), draft_len.contiguous(),
                                  u_sample.contiguous(), committed, committed_len, accepted, vocab, k, BLOCK=block,
                                  BLOCK_K1=triton.next_power_of_2(k + 1))
    elif lanes:
        _accept_kernel[(lanes,)](p, cu_rows.contiguous(), drafts.contiguous(), draft_len.contiguous(),
                                 draft_probs.contiguous(), u_accept.contiguous(), u_sample.contiguous(), committed,
                                 committed_len, accepted, vocab, k, BLOCK=block, BLOCK_K1=triton.next_power_of_2(k + 1))
    return committed, committed_len, accepted


def accept_greedy_cpu(target, cu_rows, drafts, draft_len):
    """Sample-and-compare for a round of greedy lanes in one C call (kernels/cpu/rows.c): the argmax of each row
    a lane reads, up to its first mismatch, without gathering the rows; the torch twin's results, bit for bit."""
    lanes, k = drafts.shape
    committed = torch.empty(lanes, k + 1, dtype=torch.int64)
    committed_len, accepted = torch.empty(lanes, dtype=torch.int64), torch.empty(lanes, dtype=torch.int64)
    target, drafts = target.contiguous(), drafts.contiguous()
    cpu_build.library().sl_accept_greedy(target.data_ptr(), target.shape[1], cu_rows.contiguous().data_ptr(), lanes,
                                         drafts.data_ptr(), k, draft_len.contiguous().data_ptr(),
                                         committed.data_ptr(), committed_len.data_ptr(), accepted.data_ptr())
    return committed, committed_len, accepted


def _greedy_on_cpu(target, draft_probs, temperature, target_is_probs) -> bool:
    return (draft_probs is None and not target_is_probs and target.device.type == "cpu"
            and target.dtype == torch.float32 and target.dim() == 2 and cpu_build.library() is not None
            and not bool((temperature != 0).any()))


def accept(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample,
           target_is_probs: bool = False):
    """Dispatcher: triton on CUDA tensors; a greedy round of a deterministic drafter on a CPU with the C kernels
    takes `accept_greedy_cpu`; else the torch twin. Returns (committed, committed_len, accepted)."""
    if _greedy_on_cpu(target, draft_probs, temperature, target_is_probs):
        _check_args(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample)
        return accept_greedy_cpu(target, cu_rows, drafts, draft_len)
    if use_triton(target):
        return accept_triton(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p,
                             u_accept, u_sample, target_is_probs)
    return accept_ref(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p,
                      u_accept, u_sample, target_is_probs)
