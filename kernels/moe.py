"""Routed experts of a sparse MoE layer: each row through its top-k experts, weighted, summed.

Owns: `moe_experts(x, gate_up, down, top_i, top_w)` (dispatcher), `moe_experts_ref` (torch twin) and its three
parts (`route_experts`, `expert_rows`, `add_experts`, which an expert cache runs over weights held elsewhere), the
device-side layout `moe_align` and the two triton kernels behind `moe_experts_triton`. Not here: the router and the
shared expert (`stages/models/moe.py`), where expert weights are held (`stages/models/expert_cache.py`).

Shapes: x [rows, hidden]; gate_up [experts, 2 * inter, hidden] (gate rows then up rows); down [experts, hidden,
inter]; top_i, top_w [rows, k]. Result [rows, hidden] = sum_j top_w[r, j] * down_e(silu(gate_e x) * up_e x) for
e = top_i[r, j], the k terms added in increasing expert index, so a row's sum never depends on its neighbours.

Why two routes. The twin groups rows by expert on the host (one copy of `top_i` a layer): free on a CPU, where it
runs, but on a GPU that copy would stall every MoE layer and forbid CUDA-graph capture. The triton route needs no
host value: `moe_align` sorts the (row, slot) pairs by expert on the device (stable sort, scatter-add counts,
searchsorted) into blocks of `block_m` pairs of one expert each, padded per expert; the grid is sized from shapes
alone (at most cdiv(pairs, block_m) + min(experts, pairs) blocks), and blocks past the last real one find the
sentinel expert and do nothing. The same layout is what vLLM's fused MoE calls aligning to the block size.
Exactness: one program computes a block of pairs of one expert with a fixed tile and reduction order, so a pair's
output is the same whichever pairs share its block; the k terms are then added in increasing expert index.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from speclane.kernels._triton import HAVE_TRITON, check, interpreting, tl, triton, use_triton

Tensor = torch.Tensor


def _check_args(x: Tensor, gate_up: Tensor, down: Tensor, top_i: Tensor, top_w: Tensor) -> None:
    e, two_i, h = gate_up.shape if gate_up.dim() == 3 else (0, 0, -1)
    # one cheap test on the hot path; the messages are built only on failure
    if (x.dim() == 2 and h == x.shape[1] and two_i % 2 == 0 and tuple(down.shape) == (e, h, two_i // 2)
            and top_i.dim() == 2 and top_i.shape == top_w.shape and top_i.shape[0] == x.shape[0]
            and gate_up.dtype == down.dtype == x.dtype == top_w.dtype):
        return
    check(x.dim() == 2, f"moe_experts: x must be [rows, hidden], got {tuple(x.shape)}")
    check(h == x.shape[1] and two_i % 2 == 0,
          f"moe_experts: gate_up must be [experts, 2 * inter, {x.shape[1]}], got {tuple(gate_up.shape)}")
    check(tuple(down.shape) == (e, h, two_i // 2),
          f"moe_experts: down must be [{e}, {h}, {two_i // 2}], got {tuple(down.shape)}")
    check(top_i.shape == top_w.shape and top_i.dim() == 2 and top_i.shape[0] == x.shape[0],
          f"moe_experts: top_i and top_w must both be [{x.shape[0]}, k], got {tuple(top_i.shape)} and "
          f"{tuple(top_w.shape)}")
    check(False, f"moe_experts: x, gate_up, down and top_w must share a dtype, got {x.dtype}, {gate_up.dtype}, "
                 f"{down.dtype}, {top_w.dtype}")


def _silu(x: Tensor) -> Tensor:
    xf = x.float()
    return (xf / (1.0 + torch.exp(-xf))).to(x.dtype)   # not F.silu: see stages/models/ops.py on row stability


def moe_experts_ref(x: Tensor, gate_up: Tensor, down: Tensor, top_i: Tensor, top_w: Tensor,
                    linear: Callable[[Tensor, Tensor], Tensor] = F.linear) -> Tensor:
    """The torch twin: rows grouped by expert on the host, each expert run once over its rows with `linear`
    (the model passes its decode route, so a row rounds as it would alone), experts added in increasing index."""
    _check_args(x, gate_up, down, top_i, top_w)
    routes = route_experts(top_i)
    return add_experts(x, routes, {e: expert_rows(x, gate_up[e], down[e], *routes[e], top_w, linear)
                                   for e in routes})


def route_experts(top_i: Tensor) -> dict[int, tuple[Tensor, Tensor]]:
    """The twin's host grouping of top_i [rows, k]: expert -> (rows, cols) int64 on top_i's device, the (row, slot)
    pairs that chose it in increasing row order. The one host copy of the twin: free on a CPU, the kernels' reason."""
    hits: dict[int, tuple[list[int], list[int]]] = {}
    for r, choice in enumerate(top_i.tolist()):
        for j, e in enumerate(choice):
            rows, cols = hits.setdefault(e, ([], []))
            rows.append(r)
            cols.append(j)
    return {e: (torch.tensor(rows, device=top_i.device), torch.tensor(cols, device=top_i.device))
            for e, (rows, cols) in hits.items()}


def expert_rows(x: Tensor, gate_up: Tensor, down: Tensor, rows: Tensor, cols: Tensor, top_w: Tensor,
                linear: Callable[[Tensor, Tensor], Tensor] = F.linear) -> Tensor:
    """One expert's weighted output for its rows: top_w[rows, cols] * down(silu(gate x) * up x), [len(rows), hidden].
    gate_up [2 * inter, hidden] and down [hidden, inter] are the expert's own, wherever they are held."""
    gate, up = linear(x[rows], gate_up).chunk(2, dim=-1)
    return linear(_silu(gate) * up, down) * top_w[rows, cols, None]


def add_experts(x: Tensor, routes: dict[int, tuple[Tensor, Tensor]], terms: dict[int, Tensor]) -> Tensor:
    """[rows, hidden]: each expert's term (`expert_rows`) added to its rows from zero in increasing expert index,
    whatever order the terms were computed in, so a row's sum is the twin's."""
    out = torch.zeros_like(x)
    for e in sorted(routes):
        out.index_add_(0, routes[e][0], terms[e])
    return out


def moe_align(top_i: Tensor, num_experts: int, block_m: int) -> tuple[Tensor, Tensor]:
    """The (row, slot) pairs grouped by expert into blocks of `block_m`, with no host copy.

    Pair p = r * k + j. Returns ids [blocks * block_m] int32 (pair ids, expert by expert, each expert's run padded
    to a whole block with the sentinel `pairs`) and block_expert [blocks] int32 (the expert of each block;
    `num_experts` for the idle blocks past the last real one). `blocks` depends only on the shapes."""
    pairs = top_i.numel()
    flat = top_i.reshape(-1).long()
    order = torch.argsort(flat, stable=True)                          # pair ids, grouped by expert
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))              # not bincount: that reads its max on the host
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    first = torch.cumsum(counts, 0) - counts                         # each expert's first place in `order`
    experts = flat[order]
    where = pad_end[experts] - padded[experts] + torch.arange(pairs, device=flat.device) - first[experts]
    blocks = _cdiv(pairs, block_m) + min(num_experts, pairs)   # an upper bound on sum(padded) / block_m
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
    def _rows_times(a_ptr, a_rows, a_valid, w_ptr, w_rows, w_valid, K, IEEE: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
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
    def _moe_up_kernel(x_ptr, w_ptr, ids_ptr, blk_ptr, h_ptr, PAIRS, SLOTS, HIDDEN, INTER, EXPERTS,
                       IEEE: tl.constexpr, UPCAST: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """h[pair, n] = silu(gate_e x[row]) * (up_e x[row]) for a block of one expert's pairs."""
        e, ids, valid, safe = _block(blk_ptr, ids_ptr, PAIRS, BLOCK_M)
        if e < EXPERTS:
            rows = safe // SLOTS
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < INTER
            w_e = w_ptr + e * 2 * INTER * HIDDEN
            acc_g = _rows_times(x_ptr, rows, valid, w_e, cols, cmask, HIDDEN, IEEE, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
            acc_u = _rows_times(x_ptr, rows, valid, w_e, INTER + cols, cmask, HIDDEN, IEEE, UPCAST,
                                BLOCK_M, BLOCK_N, BLOCK_K)
            # the twin's roundings: each projection to the activation dtype, silu in float32, the product
            g = acc_g.to(h_ptr.dtype.element_ty).to(tl.float32)
            u = acc_u.to(h_ptr.dtype.element_ty).to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(h_ptr.dtype.element_ty).to(tl.float32)
            tl.store(h_ptr + ids[:, None] * INTER + cols[None, :], (s * u).to(h_ptr.dtype.element_ty),
                     mask=valid[:, None] & cmask[None, :])

    @triton.jit
    def _moe_down_kernel(h_ptr, w_ptr, ids_ptr, blk_ptr, tw_ptr, y_ptr, PAIRS, HIDDEN, INTER, EXPERTS,
                         IEEE: tl.constexpr, UPCAST: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """y[pair, n] = top_w[pair] * (down_e h[pair])[n] for a block of one expert's pairs."""
        e, ids, valid, safe = _block(blk_ptr, ids_ptr, PAIRS, BLOCK_M)
        if e < EXPERTS:
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            cmask = cols < HIDDEN
            acc = _rows_times(h_ptr, safe, valid, w_ptr + e * HIDDEN * INTER, cols, cmask, INTER, IEEE, UPCAST,
                              BLOCK_M, BLOCK_N, BLOCK_K)
            tw = tl.load(tw_ptr + safe, mask=valid, other=0.0).to(tl.float32)
            y = acc.to(y_ptr.dtype.element_ty).to(tl.float32) * tw[:, None]
            tl.store(y_ptr + ids[:, None] * HIDDEN + cols[None, :], y.to(y_ptr.dtype.element_ty),
                     mask=valid[:, None] & cmask[None, :])


def moe_experts_triton(x: Tensor, gate_up: Tensor, down: Tensor, top_i: Tensor, top_w: Tensor,
                       block_m: int = 16, block_n: int = 64, block_k: int = 64) -> Tensor:
    """The grouped-expert kernels (CUDA, or CPU tensors under TRITON_INTERPRET=1): no host copy, a grid fixed by
    the shapes, so a CUDA graph can hold it."""
    check(HAVE_TRITON, "moe_experts_triton: triton is not installed")
    _check_args(x, gate_up, down, top_i, top_w)
    rows, hidden = x.shape
    experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if rows == 0:
        return torch.zeros_like(x)
    top_w, ids, block_expert = route_layout(top_i, top_w, experts, block_m)
    slots = top_i.shape[1]
    pairs = rows * slots
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    h = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    # triton 3.9.0's interpreter computes tl.dot of bf16 operands wrongly (off by ~1e10 on a 16x16 tile, measured
    # 2026-11-30); float32 copies of them give the same products (bf16 x bf16 is exact in float32), so the
    # interpreted tests check the kernel's logic while a GPU keeps its bf16 tensor-core dot.
    upcast = interpreting() and x.dtype != torch.float32
    ieee = x.dtype == torch.float32 or upcast   # float32 operands: no tf32 rounding
    blocks = block_expert.shape[0]
    _moe_up_kernel[(blocks, triton.cdiv(inter, block_n))](
        x, gate_up, ids, block_expert, h, pairs, slots, hidden, inter, experts,
        IEEE=ieee, UPCAST=upcast, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    _moe_down_kernel[(blocks, triton.cdiv(hidden, block_n))](
        h, down, ids, block_expert, top_w, y, pairs, hidden, inter, experts,
        IEEE=ieee, UPCAST=upcast, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return add_slots(y.view(rows, slots, hidden))


def route_layout(top_i: Tensor, top_w: Tensor, experts: int, block_m: int) -> tuple[Tensor, Tensor, Tensor]:
    """Device-side set-up of the kernels: each row's slots put in increasing expert index (so `add_slots` adds
    them in the twin's order), then `moe_align`. Returns (top_w in that order, ids, block_expert)."""
    top_i, perm = top_i.sort(dim=-1, stable=True)
    return top_w.gather(1, perm).contiguous(), *moe_align(top_i, experts, block_m)


def add_slots(y: Tensor) -> Tensor:
    """[rows, k, hidden] -> [rows, hidden], in y's dtype, term by term from zero, as the twin's index_add_ does."""
    out = torch.zeros_like(y[:, 0])
    for j in range(y.shape[1]):
        out = out + y[:, j]
    return out


def moe_experts(x: Tensor, gate_up: Tensor, down: Tensor, top_i: Tensor, top_w: Tensor,
                linear: Callable[[Tensor, Tensor], Tensor] = F.linear) -> Tensor:
    """Routed experts: the triton kernels on CUDA (no host copy), the twin with `linear` elsewhere."""
    if use_triton(x):
        return moe_experts_triton(x, gate_up, down, top_i, top_w)
    return moe_experts_ref(x, gate_up, down, top_i, top_w, linear)
