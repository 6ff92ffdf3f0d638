"""Gated DeltaNet hot ops: the causal depthwise conv and the gated delta rule, per row (decode, verify) or chunked
(prefill).

Owns the plain-torch references (`*_ref`) and `gated_delta_rows`, the per-row rule's dispatcher (the triton kernel
of kernels/gated_delta_triton.py on a CUDA tensor, the twin elsewhere); triton kernels with the same signatures and
argument order go beside them. Conventions: B = sequences (lanes), T = rows per sequence, C = conv channels,
K = conv kernel, nk/nv = key/value heads (nv a multiple of nk; value head h reads key head h // (nv // nk)),
dk/dv = head dims. The recurrent state S [B, nv, dk, dv] is float32; the per-row step is

    S = S * exp(g_t);  delta = beta_t * (v_t - S^T k_t);  S = S + k_t delta^T;  o_t = S^T q_t

with q_t, k_t L2-normalised (eps 1e-6) and q_t scaled by dk^-0.5, as in transformers' Qwen3-Next/Qwen3.5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclane.kernels._triton import use_triton
from speclane.kernels.gated_delta_triton import gated_delta_rows_triton

Tensor = torch.Tensor


def gated_delta_rows(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """`gated_delta_rows_ref`'s result: on a CUDA tensor one triton launch for every row (the twin takes about eight
    operations a row), elsewhere the twin."""
    if use_triton(q):
        return gated_delta_rows_triton(q, k, v, g, beta, state)
    return gated_delta_rows_ref(q, k, v, g, beta, state)


def causal_conv1d_rows_ref(x: Tensor, conv_state: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Depthwise causal conv + SiLU over T new rows that follow `conv_state`.

    x [B, T, C] (compute dtype); conv_state [B, C, K-1] (the K-1 inputs before row 0); weight [C, K] float32.
    Returns out [B, T, C] in x.dtype and windows [B, T, C, K-1]: the conv state after each row (a view).
    The K taps are summed in a fixed order in float32, elementwise, so a row's output is independent of T and B.
    """
    t, k = x.shape[1], weight.shape[1]
    seq = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=-1)  # [B, C, K-1+T]
    seqf = seq.float()
    acc = seqf[..., 0:t] * weight[:, 0:1]
    for j in range(1, k):
        acc = acc + seqf[..., j : j + t] * weight[:, j : j + 1]
    # silu as acc / (1 + exp(-acc)): torch's float32 F.silu rounds differently in its SIMD body and scalar tail.
    out = (acc / (1.0 + torch.exp(-acc))).to(x.dtype).transpose(1, 2)
    windows = seq.unfold(-1, k - 1, 1)[:, :, 1 : t + 1].permute(0, 2, 1, 3)  # [B, T, C, K-1]
    return out, windows


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _prepare(q: Tensor, k: Tensor, nv: int) -> tuple[Tensor, Tensor]:
    r = nv // q.shape[-2]
    q, k = _l2norm(q.float()), _l2norm(k.float())
    q = q * q.shape[-1] ** -0.5
    if r > 1:
        q, k = q.repeat_interleave(r, dim=-2), k.repeat_interleave(r, dim=-2)
    return q, k


def gated_delta_rows_ref(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """The gated delta rule one row at a time, recording the state after every row.

    q, k [B, T, nk, dk]; v [B, T, nv, dv]; g, beta [B, T, nv] float32 (g = log decay <= 0); state [B, nv, dk, dv]
    float32 (not modified). Returns out [B, T, nv, dv] float32 and states [B, T, nv, dk, dv] float32.
    Every row takes exactly the single-token decode step (elementwise products and fixed-axis sums, no matmul),
    so row t of a T-row call equals the t-th one-row call bit for bit, whatever B.
    """
    # Time-major contiguous float32 copies: torch's CPU reductions pick their order from the operands' strides, so a
    # strided view (a row of a wider grid) rounds differently from the same row decoded alone (measured: the L2 norm
    # of a key head differed in the last bit). `.to(memory_format=...)` does not copy a tensor already in float32.
    q, k, v, g, beta = (x.transpose(0, 1).float().contiguous() for x in (q, k, v, g, beta))
    q, k = _prepare(q, k, v.shape[-2])
    s = state.float().contiguous()
    outs, states = [], []
    for t in range(q.shape[0]):
        s = s * g[t].exp()[..., None, None]
        kv_mem = (s * k[t, :, :, :, None]).sum(dim=-2)  # [B, nv, dv]
        delta = (v[t] - kv_mem) * beta[t, :, :, None]
        s = s + k[t, :, :, :, None] * delta[:, :, None, :]
        outs.append((s * q[t, :, :, :, None]).sum(dim=-2))
        states.append(s)
    return torch.stack(outs, dim=1), torch.stack(states, dim=1)


def gated_delta_chunk_ref(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk_size: int = 64
) -> tuple[Tensor, Tensor]:
    """The same rule over T rows in chunks (WY/UT form), returning only the final state: the prefill path.

    Shapes as `gated_delta_rows_ref`; returns out [B, T, nv, dv] float32 and final state [B, nv, dk, dv] float32.
    Agrees with the per-row form to float32 rounding, not bit for bit (different summation order).
    """
    q, k = _prepare(q.float().contiguous(), k.float().contiguous(), v.shape[-2])
    b, t = q.shape[:2]
    q, k, v, beta, g = (x.transpose(1, 2).float() for x in (q, k, v, beta, g))  # heads first
    pad = (chunk_size - t % chunk_size) % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    n = (t + pad) // chunk_size
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(*x.shape[:2], n, chunk_size, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(*g.shape[:2], n, chunk_size).cumsum(dim=-1)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * decay  # strictly-lower part drives the UT transform
    intra = (q @ k.transpose(-1, -2)) * decay
    new_v = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(system, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    q = q * g.exp()[..., None]
    k = k * (g[..., -1:] - g).exp()[..., None]
    chunk_decay = g[..., -1].exp()[..., None, None]
    s = state.float()
    out = torch.empty_like(new_v)
    for i in range(n):
        v_i = new_v[:, :, i] - k_cum[:, :, i] @ s
        out[:, :, i] = q[:, :, i] @ s + intra[:, :, i] @ v_i
        s = s * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_i
    out = out.reshape(*out.shape[:2], n * chunk_size, -1)[:, :, :t].transpose(1, 2)
    return out, s
