"""The accept step's triton route: one program per lane, the committed run computed on the device.

Owns: the two kernels (`_compare_kernel`, sample-and-compare for a deterministic drafter; `_accept_kernel`,
rejection sampling for a drafter that samples) and their launcher `accept_triton`, which checks the arguments,
processes the logits (kernels/sampling.py) and launches. Same signature, argument order and returns as
`accept_ref`, and the same rules, stated once in kernels/accept.py. Not here: choosing a route and the torch twin
(kernels/accept.py), the argument contract (kernels/accept_args.py), random numbers (the caller's).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import HAVE_TRITON, check, tl, triton
from speclane.kernels.accept_args import check_accept_args
from speclane.kernels.sampling import process_logits

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
    def _compare_kernel(
        p_ptr,
        cu_ptr,
        drafts_ptr,
        dlen_ptr,
        us_ptr,
        committed_ptr,
        clen_ptr,
        acc_ptr,
        V,
        K,
        BLOCK: tl.constexpr,
        BLOCK_K1: tl.constexpr,
    ):
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
            tok = sample_row(
                p_ptr + (start + i).to(tl.int64) * V,
                tl.load(us_ptr + lane * (K + 1) + i),
                V,
                tl.where(live, V, 0),
                BLOCK,
            )
            has_draft = live & (i < n)
            d = tl.load(drafts_ptr + lane * K + tl.where(has_draft, i, 0), mask=has_draft, other=-1)
            match = has_draft & (tok == d)
            tok_out = tl.where(live & (match == 0), tok, tok_out)  # the first mismatch, or the bonus
            acc += match.to(acc.dtype)
            going = tl.where(match, going, 0)
        _store_run(drafts_ptr, committed_ptr, clen_ptr, acc_ptr, lane, K, acc, tok_out, BLOCK_K1)

    @triton.jit
    def _accept_kernel(
        p_ptr,
        cu_ptr,
        drafts_ptr,
        dlen_ptr,
        q_ptr,
        ua_ptr,
        us_ptr,
        committed_ptr,
        clen_ptr,
        acc_ptr,
        V,
        K,
        BLOCK: tl.constexpr,
        BLOCK_K1: tl.constexpr,
    ):
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


def accept_triton(
    target,
    cu_rows,
    drafts,
    draft_len,
    draft_probs,
    temperature,
    top_k,
    top_p,
    u_accept,
    u_sample,
    target_is_probs: bool = False,
    block: int = 1024,
):
    check(HAVE_TRITON, "accept_triton: triton is not installed")
    check_accept_args(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample)
    lanes, k = drafts.shape
    rows, vocab = target.shape
    if target_is_probs:
        p = target.float().contiguous()
    else:
        # lane of each row without a host sync (rows past cu_rows[-1] take the last lane and are never read)
        lane_of_row = (torch.searchsorted(cu_rows, torch.arange(rows, device=target.device), right=True) - 1).clamp(
            0, max(lanes - 1, 0)
        )
        p = process_logits(target.contiguous(), temperature[lane_of_row], top_k[lane_of_row], top_p[lane_of_row])
    committed = torch.empty(lanes, k + 1, dtype=torch.int64, device=target.device)
    committed_len = torch.empty(lanes, dtype=torch.int64, device=target.device)
    accepted = torch.empty(lanes, dtype=torch.int64, device=target.device)
    if lanes and draft_probs is None:
        _compare_kernel[(lanes,)](
            p,
            cu_rows.contiguous(),
            drafts.contiguous(),
            draft_len.contiguous(),
            u_sample.contiguous(),
            committed,
            committed_len,
            accepted,
            vocab,
            k,
            BLOCK=block,
            BLOCK_K1=triton.next_power_of_2(k + 1),
        )
    elif lanes:
        _accept_kernel[(lanes,)](
            p,
            cu_rows.contiguous(),
            drafts.contiguous(),
            draft_len.contiguous(),
            draft_probs.contiguous(),
            u_accept.contiguous(),
            u_sample.contiguous(),
            committed,
            committed_len,
            accepted,
            vocab,
            k,
            BLOCK=block,
            BLOCK_K1=triton.next_power_of_2(k + 1),
        )
    return committed, committed_len, accepted
