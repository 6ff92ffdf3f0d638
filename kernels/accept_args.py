"""The argument contract of the accept step, checked alike by every route (`accept_ref`, `accept_triton`, the CPU
greedy path): dtypes, shapes and devices of the round's tensors always; value ranges (draft lengths, row offsets,
token ids, uniforms) only where `checks_values` says the host may read them (kernels/_triton.py).

Owns: `check_accept_args`. Not here: the accept rule itself (kernels/accept.py for the dispatcher and the torch twin,
kernels/accept_triton.py for the kernel).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import check, checks_values


def check_accept_args(target, cu_rows, drafts, draft_len, draft_probs, temperature, top_k, top_p, u_accept, u_sample):
    check(
        target.dim() == 2 and target.is_floating_point(),
        f"target must be float [rows, vocab], got {target.dtype} {tuple(target.shape)}",
    )
    check(
        drafts.dim() == 2 and drafts.dtype == torch.int64,
        f"drafts must be int64 [lanes, K], got {drafts.dtype} {tuple(drafts.shape)}",
    )
    lanes, k = drafts.shape
    vocab = target.shape[1]
    check(
        cu_rows.shape == (lanes + 1,) and cu_rows.dtype == torch.int64,
        f"cu_rows must be int64 [lanes + 1 = {lanes + 1}], got {cu_rows.dtype} {tuple(cu_rows.shape)}",
    )
    check(u_accept is not None or draft_probs is None, "u_accept is needed with draft_probs (rejection sampling)")
    given = [("u_accept", u_accept, (lanes, k), torch.float32)] if u_accept is not None else []
    for name, t, shape, dt in [
        ("draft_len", draft_len, (lanes,), torch.int64),
        ("temperature", temperature, (lanes,), torch.float32),
        ("top_k", top_k, (lanes,), torch.int64),
        ("top_p", top_p, (lanes,), torch.float32),
        ("u_sample", u_sample, (lanes, k + 1), torch.float32),
        *given,
    ]:
        check(t.shape == shape and t.dtype == dt, f"{name} must be {dt} {list(shape)}, got {t.dtype} {tuple(t.shape)}")
        check(t.device == target.device, f"{name} on {t.device}, target on {target.device}")
    if draft_probs is not None:
        check(
            draft_probs.shape == (lanes, k, vocab) and draft_probs.dtype == torch.float32,
            f"draft_probs must be float32 [lanes, K, vocab] = {[lanes, k, vocab]}, "
            f"got {draft_probs.dtype} {tuple(draft_probs.shape)}",
        )
    if checks_values(target):  # value ranges: host reads every round, so tests only (kernels/_triton.py)
        n = cu_rows[1:] - cu_rows[:-1]
        check(bool((draft_len >= 0).all() and (draft_len <= k).all()), f"draft_len must be in [0, K={k}]")
        check(bool((n == draft_len + 1).all()), "cu_rows must give each lane draft_len + 1 rows (anchor + drafts)")
        check(
            int(cu_rows[0]) == 0 and int(cu_rows[-1]) <= target.shape[0],
            f"cu_rows must start at 0 and end <= rows={target.shape[0]}",
        )
        valid = torch.arange(k, device=drafts.device)[None, :] < draft_len[:, None]
        check(
            bool(((drafts >= 0) & (drafts < vocab))[valid].all()),
            f"drafts within draft_len must be in [0, vocab={vocab})",
        )
        us = (u_sample,) if u_accept is None else (u_sample, u_accept)
        check(all(bool(((u >= 0) & (u < 1)).all()) for u in us), "uniforms must be in [0, 1)")
