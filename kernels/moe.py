"""Routed experts of a sparse MoE layer: each row through its top-k experts, weighted, summed.

Owns: `moe_experts(x, gate_up, down, top_i, top_w)` (dispatcher), `moe_experts_ref` (torch twin) and its three
parts (`route_experts`, `expert_rows`, `add_experts`, which an expert cache runs over weights held elsewhere). Not
here: the triton route (`moe_experts_triton`, its device-side layout `moe_align` and kernels: kernels/moe_triton.py),
the argument checks both routes share (kernels/moe_args.py), the router and the shared expert
(`stages/models/moe.py`), where expert weights are held (`stages/models/expert_cache.py`).

Shapes: x [rows, hidden]; gate_up [experts, 2 * inter, hidden] (gate rows then up rows); down [experts, hidden,
inter]; top_i, top_w [rows, k]. Result [rows, hidden] = sum_j top_w[r, j] * down_e(silu(gate_e x) * up_e x) for
e = top_i[r, j], the k terms added in increasing expert index, so a row's sum never depends on its neighbours.

Why two routes. The twin groups rows by expert on the host (one copy of `top_i` a layer): free on a CPU, where it
runs, but on a GPU that copy would stall every MoE layer and forbid CUDA-graph capture. The triton route needs no
host value: it groups the (row, slot) pairs by expert on the device (kernels/moe_triton.py).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from speclane.kernels._triton import use_triton
from speclane.kernels.moe_args import check_moe_args
from speclane.kernels.moe_triton import moe_experts_triton

Tensor = torch.Tensor


def _silu(x: Tensor) -> Tensor:
    xf = x.float()
    return (xf / (1.0 + torch.exp(-xf))).to(x.dtype)  # not F.silu: see stages/models/ops.py on row stability


def moe_experts_ref(
    x: Tensor,
    gate_up: Tensor,
    down: Tensor,
    top_i: Tensor,
    top_w: Tensor,
    linear: Callable[[Tensor, Tensor], Tensor] = F.linear,
) -> Tensor:
    """The torch twin: rows grouped by expert on the host, each expert run once over its rows with `linear`
    (the model passes its decode route, so a row rounds as it would alone), experts added in increasing index."""
    check_moe_args(x, gate_up, down, top_i, top_w)
    routes = route_experts(top_i)
    return add_experts(x, routes, {e: expert_rows(x, gate_up[e], down[e], *routes[e], top_w, linear) for e in routes})


def route_experts(top_i: Tensor, choices: list[list[int]] | None = None) -> dict[int, tuple[Tensor, Tensor]]:
    """The twin's host grouping of top_i [rows, k]: expert -> (rows, cols) int64 on top_i's device, the (row, slot)
    pairs that chose it in increasing row order. The one host copy of the twin: free on a CPU, the kernels' reason.
    `choices`: top_i's values already read on the host (top_i.tolist()), which the grouping then does not read again."""
    hits: dict[int, tuple[list[int], list[int]]] = {}
    for r, choice in enumerate(top_i.tolist() if choices is None else choices):
        for j, e in enumerate(choice):
            rows, cols = hits.setdefault(e, ([], []))
            rows.append(r)
            cols.append(j)
    return {
        e: (torch.tensor(rows, device=top_i.device), torch.tensor(cols, device=top_i.device))
        for e, (rows, cols) in hits.items()
    }


def expert_rows(
    x: Tensor,
    gate_up: Tensor,
    down: Tensor,
    rows: Tensor,
    cols: Tensor,
    top_w: Tensor,
    linear: Callable[[Tensor, Tensor], Tensor] = F.linear,
) -> Tensor:
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


def moe_experts(
    x: Tensor,
    gate_up: Tensor,
    down: Tensor,
    top_i: Tensor,
    top_w: Tensor,
    linear: Callable[[Tensor, Tensor], Tensor] = F.linear,
) -> Tensor:
    """Routed experts: the triton kernels on CUDA (no host copy), the twin with `linear` elsewhere."""
    if use_triton(x):
        return moe_experts_triton(x, gate_up, down, top_i, top_w)
    return moe_experts_ref(x, gate_up, down, top_i, top_w, linear)
