"""Logits processing and inverse-CDF sampling, per row, in float32.

Owns: `process_logits` (temperature, top-k, top-p -> probabilities; temperature 0 = greedy one-hot),
`sample_from_uniform` (a token per row from a caller-supplied uniform), each with its `_ref` torch twin and triton
kernel, and `row_argmax` (the greedy token of float32 rows: the C kernel on a CPU where it is built, 8x torch's argmax
there, else torch's). Not here: random number generation (callers draw uniforms from per-request seeded generators,
which is what makes sampled output reproducible per request) and the accept rule (kernels/accept.py).

Masks are defined so that ties never depend on sort order:
- top-k (k = 0 or k >= vocab: off) keeps every token whose probability is >= the k-th largest, ties included;
- top-p (1.0: off) keeps token i when the mass of tokens strictly more probable than i is < top_p (after top-k),
  so tied tokens are kept or dropped together and the most probable token is always kept.
"""

from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import HAVE_TRITON, check, checks_values, tl, triton, use_triton

_ONE_BITS = 0x3F800000  # float32 1.0: every unnormalised weight exp(z - max z) lies in [0, 1]


def _check_params(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> None:
    check(
        logits.dim() == 2 and logits.is_floating_point(),
        f"logits must be float [rows, vocab], got {logits.dtype} {tuple(logits.shape)}",
    )
    rows = logits.shape[0]
    for name, t, dt in (
        ("temperature", temperature, torch.float32),
        ("top_k", top_k, torch.int64),
        ("top_p", top_p, torch.float32),
    ):
        check(t.shape == (rows,), f"{name} must be [rows={rows}], got {tuple(t.shape)}")
        check(t.dtype == dt, f"{name} must be {dt}, got {t.dtype}")
        check(t.device == logits.device, f"{name} on {t.device}, logits on {logits.device}")
    if checks_values(logits):  # value ranges: host reads every round, so tests only (kernels/_triton.py)
        check(bool((temperature >= 0).all()), "temperature must be >= 0 (0 = greedy)")
        check(bool((top_k >= 0).all()), "top_k must be >= 0 (0 = off)")
        check(bool(((top_p > 0) & (top_p <= 1)).all()), "top_p must be in (0, 1] (1 = off)")


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """x [rows, vocab] -> int64 [rows]: each row's first largest index (a NaN counts as largest), as torch.argmax.
    One vectorised pass in C where the kernels are built: torch's CPU argmax is slow on wide rows."""
    lib = cpu_build.library()
    if lib is None or x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] == 0:
        return x.argmax(dim=-1)
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    lib.sl_argmax(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
    return out


def process_logits_ref(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """probs [rows, vocab] float32 after temperature, top-k, top-p; greedy rows are one-hot at the first argmax."""
    _check_params(logits, temperature, top_k, top_p)
    rows, vocab = logits.shape
    z = logits.float()
    greedy = temperature == 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    z = z / t[:, None]
    e = torch.exp(z - z.max(dim=1, keepdim=True).values)  # [rows, vocab] in [0, 1], the max is exactly 1
    s, _ = torch.sort(e, dim=1, descending=True)
    k = torch.where((top_k <= 0) | (top_k >= vocab), torch.full_like(top_k, vocab), top_k)
    kth = s.gather(1, (k - 1)[:, None])  # [rows, 1]
    e = torch.where(e >= kth, e, torch.zeros_like(e))
    s = torch.where(s >= kth, s, torch.zeros_like(s))
    z_sum = s.sum(dim=1, keepdim=True)
    above = torch.cumsum(s, dim=1) - s  # mass of tokens before this one in sort order
    # ties: every member of a tie group takes the mass above its group's first member
    first = torch.searchsorted(-s, -s, side="left")
    above = above.gather(1, first)
    in_nucleus = (s > 0) & (above < top_p[:, None] * z_sum)
    thr = torch.where(in_nucleus, s, torch.full_like(s, float("inf"))).min(dim=1, keepdim=True).values
    e = torch.where((e >= thr) | (top_p[:, None] >= 1), e, torch.zeros_like(e))
    probs = e / e.sum(dim=1, keepdim=True)
    onehot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], onehot, probs)


def sample_from_uniform_ref(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """tokens [rows] int64: the first token whose cumulative weight exceeds u * total weight.

    `probs` may be unnormalised (a rejection residual). A token of zero weight is never returned.
    """
    _check_sample_args(probs, u)
    c = torch.cumsum(probs, dim=1)
    tok = torch.searchsorted(c, (u * c[:, -1])[:, None].contiguous(), right=True)[:, 0]
    vocab = probs.shape[1]
    last_nonzero = (vocab - 1) - (probs.flip(1) > 0).int().argmax(dim=1)  # rounding can push u * total past c
    return torch.minimum(tok, last_nonzero)


def _check_sample_args(probs: torch.Tensor, u: torch.Tensor) -> None:
    check(
        probs.dim() == 2 and probs.dtype == torch.float32,
        f"probs must be float32 [rows, vocab], got {probs.dtype} {tuple(probs.shape)}",
    )
    check(probs.is_contiguous(), "probs must be contiguous")
    check(
        u.shape == (probs.shape[0],) and u.dtype == torch.float32,
        f"u must be float32 [rows={probs.shape[0]}], got {u.dtype} {tuple(u.shape)}",
    )
    if probs.device.type == "cpu":
        check(bool(((u >= 0) & (u < 1)).all()), "u must be in [0, 1)")


if HAVE_TRITON:

    @triton.jit
    def _weights(row_ptr, temp, offs, mask):
        z = tl.load(row_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
        return z / temp

    @triton.jit
    def _process_kernel(logits_ptr, temp_ptr, topk_ptr, topp_ptr, out_ptr, V, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        src = logits_ptr + row.to(tl.int64) * V
        dst = out_ptr + row.to(tl.int64) * V
        temp = tl.load(temp_ptr + row)
        greedy = temp == 0
        temp = tl.where(greedy, 1.0, temp)
        k = tl.load(topk_ptr + row)
        k = tl.where((k <= 0) | (k >= V), V, k)
        top_p = tl.load(topp_ptr + row)
        # pass 1: the max of z (and the first argmax, for greedy rows)
        best = -float("inf")
        best_i = 0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            z = _weights(src, temp, offs, offs < V)
            m = tl.max(z, axis=0)
            i = tl.argmax(z, axis=0) + v0
            take = m > best  # strict: an equal max in a later block keeps the earlier index
            best_i = tl.where(take, i, best_i)
            best = tl.where(take, m, best)
        # top-k: the largest bit pattern b with count(e >= b) >= k (non-negative floats order like their bits)
        lo = 0
        hi = 0x3F800001
        if k < V:
            for _ in range(31):
                mid = (lo + hi) // 2
                cnt = 0
                for v0 in range(0, V, BLOCK):
                    offs = v0 + tl.arange(0, BLOCK)
                    e = tl.exp(_weights(src, temp, offs, offs < V) - best)
                    cnt += tl.sum((e.to(tl.int32, bitcast=True) >= mid).to(tl.int32), axis=0)
                ok = cnt >= k
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid)
        kbits = lo
        z_sum = 0.0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            e = tl.exp(_weights(src, temp, offs, offs < V) - best)
            z_sum += tl.sum(tl.where(e.to(tl.int32, bitcast=True) >= kbits, e, 0.0), axis=0)
        # top-p: the smallest bit pattern b whose strictly-larger kept mass is < top_p * z_sum
        lo = -1
        hi = 0x3F800000
        if top_p < 1.0:
            for _ in range(31):
                mid = (lo + hi) // 2
                above = 0.0
                for v0 in range(0, V, BLOCK):
                    offs = v0 + tl.arange(0, BLOCK)
                    e = tl.exp(_weights(src, temp, offs, offs < V) - best)
                    bits = e.to(tl.int32, bitcast=True)
                    above += tl.sum(tl.where((bits >= kbits) & (bits > mid), e, 0.0), axis=0)
                ok = above < top_p * z_sum
                hi = tl.where(ok, mid, hi)
                lo = tl.where(ok, lo, mid)
        else:
            hi = 0
        keep_bits = tl.maximum(kbits, hi)
        total = 0.0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            e = tl.exp(_weights(src, temp, offs, offs < V) - best)
            total += tl.sum(tl.where(e.to(tl.int32, bitcast=True) >= keep_bits, e, 0.0), axis=0)
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            e = tl.exp(_weights(src, temp, offs, offs < V) - best)
            p = tl.where(e.to(tl.int32, bitcast=True) >= keep_bits, e / total, 0.0)
            p = tl.where(greedy, tl.where(offs == best_i, 1.0, 0.0), p)
            tl.store(dst + offs, p, mask=offs < V)

    @triton.jit
    def sample_row(prow, u, V, lim, BLOCK: tl.constexpr):
        """Inverse-CDF draw from the row at `prow` (as sample_from_uniform_ref) reading entries below `lim` (V, or 0
        for a row that must not be read); also the accept kernel's draw."""
        total = 0.0
        last_nz = 0
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            w = tl.load(prow + offs, mask=offs < lim, other=0.0)
            total += tl.sum(w, axis=0)
            last_nz = tl.maximum(last_nz, tl.max(tl.where(w > 0, offs, 0), axis=0))
        target = u * total
        carry = 0.0
        tok = V
        for v0 in range(0, V, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            w = tl.load(prow + offs, mask=offs < lim, other=0.0)
            c = tl.cumsum(w, axis=0) + carry
            tok = tl.minimum(tok, tl.min(tl.where((c > target) & (offs < V), offs, V), axis=0))
            carry += tl.sum(w, axis=0)
        return tl.minimum(tok, last_nz)

    @triton.jit
    def _sample_kernel(probs_ptr, u_ptr, out_ptr, V, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        tok = sample_row(probs_ptr + row.to(tl.int64) * V, tl.load(u_ptr + row), V, V, BLOCK)
        tl.store(out_ptr + row, tok.to(tl.int64))


def process_logits_triton(logits, temperature, top_k, top_p, block: int = 1024) -> torch.Tensor:
    check(HAVE_TRITON, "process_logits_triton: triton is not installed")
    _check_params(logits, temperature, top_k, top_p)
    check(logits.is_contiguous(), "logits must be contiguous")
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if logits.shape[0]:
        _process_kernel[(logits.shape[0],)](logits, temperature, top_k, top_p, out, logits.shape[1], BLOCK=block)
    return out


def sample_from_uniform_triton(probs: torch.Tensor, u: torch.Tensor, block: int = 1024) -> torch.Tensor:
    check(HAVE_TRITON, "sample_from_uniform_triton: triton is not installed")
    _check_sample_args(probs, u)
    out = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    if probs.shape[0]:
        _sample_kernel[(probs.shape[0],)](probs, u, out, probs.shape[1], BLOCK=block)
    return out


def process_logits(logits, temperature, top_k, top_p) -> torch.Tensor:
    """Dispatcher: triton on CUDA tensors, else the torch twin."""
    if use_triton(logits):
        return process_logits_triton(logits, temperature, top_k, top_p)
    return process_logits_ref(logits, temperature, top_k, top_p)


def sample_from_uniform(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Dispatcher: triton on CUDA tensors, else the torch twin."""
    if use_triton(probs):
        return sample_from_uniform_triton(probs, u)
    return sample_from_uniform_ref(probs, u)
