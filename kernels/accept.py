"""The accept step of a verify round: per lane, the committed run from the target rows and the drafts.

Owns: `accept` (dispatcher), `accept_ref` (torch twin) and the CPU greedy path `accept_greedy_cpu`, and the rules
below, which every route follows; `accept_tokens` (with its twin `accept_tokens_ref`), sample-and-compare where each
row's token is already drawn (kernels/fused_head.py). Not here: the triton kernels and their launcher `accept_triton`
(kernels/accept_triton.py), the argument checks shared by all routes (kernels/accept_args.py), logits processing and
inverse-CDF sampling (kernels/sampling.py, used by every route) and random number generation (the caller passes
uniforms keyed by request seed and output position, stages/accept.py).

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
from speclane.kernels._triton import check, checks_values, use_triton
from speclane.kernels.accept_args import check_accept_args
from speclane.kernels.accept_triton import accept_triton
from speclane.kernels.sampling import process_logits_ref, row_argmax, sample_from_uniform_ref


def accept_ref(
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
):
    """-> committed [lanes, K + 1] int64 (-1 padded), committed_len [lanes] int64, accepted [lanes] int64."""
    check_accept_args(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample)
    lanes, k = drafts.shape
    vocab = target.shape[1]
    dev = target.device
    pos = torch.arange(k + 1, device=dev)
    # [lanes, K + 1] row of each position; positions past draft_len reuse the lane's anchor row and are masked
    rows = cu_rows[:-1, None] + torch.where(pos[None, :] <= draft_len[:, None], pos[None, :], 0)
    greedy = temperature == 0
    if draft_probs is None:
        return _sample_and_compare(
            target, rows, drafts, draft_len, greedy, temperature, top_k, top_p, u_sample, target_is_probs
        )
    if target_is_probs:
        p = target.float()[rows]  # [lanes, K + 1, vocab]
    else:
        rep = lambda t: t[:, None].expand(lanes, k + 1).reshape(-1)  # noqa: E731 - per-lane params per row
        p = process_logits_ref(target[rows.reshape(-1)].float(), rep(temperature), rep(top_k), rep(top_p)).view(
            lanes, k + 1, vocab
        )
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
    valid = pos[None, : k1 - 1] < draft_len[:, None]
    agree = (token[:, : k1 - 1] == drafts) & valid
    accepted = torch.cumprod(agree.long(), dim=1).sum(dim=1)  # [lanes]
    committed = torch.where(pos[None, :] <= accepted[:, None], token, torch.full_like(token, -1))
    return committed, accepted + 1, accepted


def accept_greedy_cpu(target, cu_rows, drafts, draft_len):
    """Sample-and-compare for a round of greedy lanes in one C call (kernels/cpu/rows.c): the argmax of each row
    a lane reads, up to its first mismatch, without gathering the rows; the torch twin's results, bit for bit."""
    lanes, k = drafts.shape
    committed = torch.empty(lanes, k + 1, dtype=torch.int64)
    committed_len, accepted = torch.empty(lanes, dtype=torch.int64), torch.empty(lanes, dtype=torch.int64)
    target, drafts = target.contiguous(), drafts.contiguous()
    cpu_build.library().sl_accept_greedy(
        target.data_ptr(),
        target.shape[1],
        cu_rows.contiguous().data_ptr(),
        lanes,
        drafts.data_ptr(),
        k,
        draft_len.contiguous().data_ptr(),
        committed.data_ptr(),
        committed_len.data_ptr(),
        accepted.data_ptr(),
    )
    return committed, committed_len, accepted


def _check_tokens(tokens, cu_rows, drafts, draft_len) -> None:
    check(
        tokens.dim() == 1 and tokens.dtype == torch.int64,
        f"tokens must be int64 [rows], got {tokens.dtype} {tuple(tokens.shape)}",
    )
    check(
        drafts.dim() == 2 and drafts.dtype == torch.int64,
        f"drafts must be int64 [lanes, K], got {drafts.dtype} {tuple(drafts.shape)}",
    )
    lanes = drafts.shape[0]
    for name, t, shape in (("cu_rows", cu_rows, (lanes + 1,)), ("draft_len", draft_len, (lanes,))):
        check(t.shape == shape and t.dtype == torch.int64, f"{name} must be int64 {list(shape)}, got {t.dtype}")
        check(t.device == tokens.device, f"{name} on {t.device}, tokens on {tokens.device}")
    if checks_values(tokens):  # value ranges: host reads every round, so tests only (kernels/_triton.py)
        check(bool((draft_len >= 0).all() and (draft_len <= drafts.shape[1]).all()), "draft_len must be in [0, K]")
        check(
            bool((cu_rows[1:] - cu_rows[:-1] == draft_len + 1).all()) and int(cu_rows[-1]) <= tokens.shape[0],
            "cu_rows must give each lane draft_len + 1 rows within tokens",
        )


def accept_tokens_ref(tokens, cu_rows, drafts, draft_len):
    """Sample-and-compare on drawn tokens: `tokens` [rows] int64 holds the target's token at every row (lane l's row
    j at cu_rows[l] + j). Drafts are accepted while they equal the token of their row; the committed run is the
    tokens of rows 0 .. accepted. The same returns as `accept_ref`."""
    _check_tokens(tokens, cu_rows, drafts, draft_len)
    lanes, k = drafts.shape
    pos = torch.arange(k + 1, device=tokens.device)
    token = tokens[cu_rows[:-1, None] + torch.minimum(pos[None, :], draft_len[:, None])]  # [lanes, K + 1]
    agree = (token[:, :k] == drafts) & (pos[None, :k] < draft_len[:, None])
    accepted = torch.cumprod(agree.long(), dim=1).sum(dim=1)  # [lanes]
    committed = torch.where(pos[None, :] <= accepted[:, None], token, torch.full_like(token, -1))
    return committed, accepted + 1, accepted


def accept_tokens(tokens, cu_rows, drafts, draft_len):
    """Dispatcher: one C call (`sl_accept_tokens`) on a CPU where the kernels are built, else the torch twin; the
    same results bit for bit."""
    lib = cpu_build.library()
    if lib is None or tokens.device.type != "cpu":
        return accept_tokens_ref(tokens, cu_rows, drafts, draft_len)
    _check_tokens(tokens, cu_rows, drafts, draft_len)
    lanes, k = drafts.shape
    committed = torch.empty(lanes, k + 1, dtype=torch.int64)
    committed_len, accepted = torch.empty(lanes, dtype=torch.int64), torch.empty(lanes, dtype=torch.int64)
    tokens, cu_rows, drafts, draft_len = (t.contiguous() for t in (tokens, cu_rows, drafts, draft_len))
    lib.sl_accept_tokens(
        tokens.data_ptr(),
        cu_rows.data_ptr(),
        lanes,
        drafts.data_ptr(),
        k,
        draft_len.data_ptr(),
        committed.data_ptr(),
        committed_len.data_ptr(),
        accepted.data_ptr(),
    )
    return committed, committed_len, accepted


def _greedy_on_cpu(target, draft_probs, temperature, target_is_probs) -> bool:
    return (
        draft_probs is None
        and not target_is_probs
        and target.device.type == "cpu"
        and target.dtype == torch.float32
        and target.dim() == 2
        and cpu_build.library() is not None
        and not bool((temperature != 0).any())
    )


def accept(
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
):
    """Dispatcher: triton on CUDA tensors; a greedy round of a deterministic drafter on a CPU with the C kernels
    takes `accept_greedy_cpu`; else the torch twin. Returns (committed, committed_len, accepted)."""
    if _greedy_on_cpu(target, draft_probs, temperature, target_is_probs):
        check_accept_args(
            target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample
        )
        return accept_greedy_cpu(target, cu_rows, drafts, draft_len)
    if use_triton(target):
        return accept_triton(
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
            target_is_probs,
        )
    return accept_ref(
        target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample, target_is_probs
    )
