"""The routed experts' triton route: grouped-expert kernels with no host value, so a CUDA graph can hold them.

Owns: the device-side layout `moe_align` (the (row, slot) pairs sorted by expert on the device: stable sort,
scatter-add counts, searchsorted, into blocks of `block_m` pairs of one expert each, padded per expert; the same
layout is what vLLM's fused MoE calls aligning to the block size), the up and down kernels, their launcher
`moe_experts_triton` and what runs around them (`route_layout`, `add_slots`). The grid is sized from shapes alone
(at most cdiv(pairs, block_m) + min(experts, pairs) blocks), and blocks past the last real one find the sentinel
expert and do nothing. Exactness: one program computes a block of pairs of one expert with a fixed tile and
reduction order, so a pair's output is the same whichever pairs share its block; the k terms are then added in
increasing expert index, as the twin adds them.
Not here: choosing a route, the torch twin and its host grouping (kernels/moe.py, which also states the result's
contract), the argument checks (kernels/moe_args.py).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import HAVE_TRITON, check, interpreting, tl, triton
from speclane.kernels.moe_args import check_moe_args

Tensor = torch.Tensor


def moe_align(top_i: Tensor, num_experts: int, block_m: int) -> tuple[Tensor, Tensor]:
    """The (row, slot) pairs grouped by expert into blocks of `block_m`, with no host copy.

    Pair p = r * k + j. Returns ids [blocks * block_m] int32 (pair ids, expert by expert, each expert's run padded
    to a whole block with the sentinel `pairs`) and block_expert [blocks] int32 (the expert of each block;
    `num_experts` for the idle blocks past the last real one). `blocks` depends only on the shapes."""
    pairs = top_i.numel()
    flat = top_i.reshape(-1).long()
    order = torch.argsort(flat, stable=True)  # pair ids, grouped by expert
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # not bincount: that reads its max on the host
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    first = torch.cumsum(counts, 0) - counts  # each expert's first place in `order`
    experts = flat[order]
    where = pad_end[experts] - padded[experts] + torch.arange(pairs, device=flat.device) - first[experts]
    blocks = _cdiv(pairs, block_m) + min(num_experts, pairs)  # an upper bound on sum(padded) / block_m
    ids = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=flat.device)
    ids[where] = order.to(torch.int32)
    starts = torch.arange(blocks, device=flat.device) * block_m
    block_expert = torch.searchsorted(pad_end, starts, right=True).to(torch.int32)
    return ids, block_expert


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


if HAVE_TRITON:

    @triton.jit
    def _block(blk_ptr, ids_ptr, PAIRS, BLOCK_M: tl.constexpr):
        """This program's block: its expert (EXPERTS for an idle block), pair ids, which are real, safe ids."""
        b = tl.program_id(0)
        ids = tl.load(ids_ptr + b * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        valid = ids < PAIRS
        return tl.load(blk_ptr + b).to(tl.int64), ids, valid, tl.where(valid, ids, 0)

    @triton.jit
    def _rows_times(
        a_ptr,
        a_rows,
        a_valid,
        w_ptr,
        w_rows,
        w_valid,
        K,
        IEEE: tl.constexpr,
        UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """[BLOCK_M, BLOCK_N] float32: rows a_rows of A [*, K] times rows w_rows of W [*, K], transposed; the
        reduction in fixed BLOCK_K steps, so a row's result never depends on the other rows of the tile."""
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < K
            av = tl.load(a_ptr + a_rows[:, None] * K + ks[None, :], mask=a_valid[:, None] & kmask[None, :], other=0.0)
            wv = tl.load(w_ptr + w_rows[None, :] * K + ks[:, None], mask=kmask[:, None] & w_valid[None, :], other=0.0)
            if UPCAST:
                av, wv = av.to(tl.float32), wv.to(tl.float32)
            if IEEE:
                acc = tl.dot(av, wv, acc, input_precision="ieee")
            else:
                acc = tl.dot(av, wv, acc)
        return acc

    @triton.jit
    def _moe_up_kernel(
        x_ptr,
        w_ptr,
        ids_ptr,
        blk_ptr,
        h_ptr,
        PAIRS,
        SLOTS,
        HIDDEN,
        INTER,
        EXPERTS,
        IEEE: tl.constexpr,
        UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """h[pair, n] = silu(gate_e x[row]) * (up_e x[row]) for a block of one expert's pairs."""
        e, ids, valid, safe = _block(blk_ptr, ids_ptr, PAIRS, BLOCK_M)
        if e < EXPERTS:
            rows = safe // SLOTS
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < INTER
            w_e = w_ptr + e * 2 * INTER * HIDDEN
            acc_g = _rows_times(x_ptr, rows, valid, w_e, cols, cmask, HIDDEN, IEEE, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
            acc_u = _rows_times(
                x_ptr, rows, valid, w_e, INTER + cols, cmask, HIDDEN, IEEE, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K
            )
            # the twin's roundings: each projection to the activation dtype, silu in float32, the product
            g = acc_g.to(h_ptr.dtype.element_ty).to(tl.float32)
            u = acc_u.to(h_ptr.dtype.element_ty).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(h_ptr.dtype.element_ty).to(tl.float32)
            tl.store(
                h_ptr + ids[:, None] * INTER + cols[None, :],
                (s * u).to(h_ptr.dtype.element_ty),
                mask=valid[:, None] & cmask[None, :],
            )

    @triton.jit
    def _moe_down_kernel(
        h_ptr,
        w_ptr,
        ids_ptr,
        blk_ptr,
        tw_ptr,
        y_ptr,
        PAIRS,
        HIDDEN,
        INTER,
        EXPERTS,
        IEEE: tl.constexpr,
        UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        """y[pair, n] = top_w[pair] * (down_e h[pair])[n] for a block of one expert's pairs."""
        e, ids, valid, safe = _block(blk_ptr, ids_ptr, PAIRS, BLOCK_M)
        if e < EXPERTS:
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < HIDDEN
            acc = _rows_times(
                h_ptr,
                safe,
                valid,
                w_ptr + e * HIDDEN * INTER,
                cols,
                cmask,
                INTER,
                IEEE,
                UPCAST,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
            )
            tw = tl.load(tw_ptr + safe, mask=valid, other=0.0).to(tl.float32)
            y = acc.to(y_ptr.dtype.element_ty).to(tl.float32) * tw[:, None]
            tl.store(
                y_ptr + ids[:, None] * HIDDEN + cols[None, :],
                y.to(y_ptr.dtype.element_ty),
                mask=valid[:, None] & cmask[None, :],
            )


def moe_experts_triton(
    x: Tensor,
    gate_up: Tensor,
    down: Tensor,
    top_i: Tensor,
    top_w: Tensor,
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 64,
    presorted: bool = False,
) -> Tensor:
    """The grouped-expert kernels (CUDA, or CPU tensors under TRITON_INTERPRET=1): no host copy, a grid fixed by
    the shapes, so a CUDA graph can hold it. `presorted`: each row's k choices are already in the order their terms
    are to be added (an expert cache passes slot indices in its experts' order, so the sum stays the twin's)."""
    check(HAVE_TRITON, "moe_experts_triton: triton is not installed")
    check_moe_args(x, gate_up, down, top_i, top_w)
    rows, hidden = x.shape
    experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if rows == 0:
        return torch.zeros_like(x)
    top_w, ids, block_expert = route_layout(top_i, top_w, experts, block_m, presorted)
    slots = top_i.shape[1]
    pairs = rows * slots
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    # triton 3.9.0's interpreter computes tl.dot of bf16 operands wrongly (off by ~1e10 on a 16x16 tile, measured
    # 2026-11-30); float32 copies of them give the same products (bf16 x bf16 is exact in float32), so the
    # interpreted tests check the kernel's logic while a GPU keeps its bf16 tensor-core dot.
    upcast = interpreting() and x.dtype != torch.float32
    ieee = x.dtype == torch.float32 or upcast  # float32 operands: no tf32 rounding
    blocks = block_expert.shape[0]
    _moe_up_kernel[(blocks, triton.cdiv(inter, block_n))](
        x,
        gate_up,
        ids,
        block_expert,
        h,
        pairs,
        slots,
        hidden,
        inter,
        experts,
        IEEE=ieee,
        UPCAST=upcast,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    _moe_down_kernel[(blocks, triton.cdiv(hidden, block_n))](
        h,
        down,
        ids,
        block_expert,
        top_w,
        y,
        pairs,
        hidden,
        inter,
        experts,
        IEEE=ieee,
        UPCAST=upcast,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return add_slots(y.view(rows, slots, hidden))


def route_layout(
    top_i: Tensor, top_w: Tensor, experts: int, block_m: int, presorted: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Device-side set-up of the kernels: each row's slots put in increasing expert index (so `add_slots` adds
    them in the twin's order; kept as given when `presorted`), then `moe_align`. Returns (top_w in that order, ids,
    block_expert)."""
    if presorted:
        return top_w.contiguous(), *moe_align(top_i, experts, block_m)
    top_i, perm = top_i.sort(dim=-1, stable=True)
    return top_w.gather(1, perm).contiguous(), *moe_align(top_i, experts, block_m)


def add_slots(y: Tensor) -> Tensor:
    """[rows, k, hidden] -> [rows, hidden], in y's dtype, term by term from zero, as the twin's index_add_ does."""
    out = torch.zeros_like(y[:, 0])
    for j in range(y.shape[1]):
        out = out + y[:, j]
    return out
