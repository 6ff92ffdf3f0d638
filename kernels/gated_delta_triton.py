"""The gated delta rule's per-row step as one triton kernel: a verify pass's rows of a Gated DeltaNet layer in one
launch (CUDA, or CPU tensors under TRITON_INTERPRET=1).

Owns: `gated_delta_rows_triton`, the same signature and result as `kernels.gated_delta.gated_delta_rows_ref`, and
its kernel. The twin takes about eight torch operations a row (decay, read, delta, write, output), so an 8-row
pass of a hybrid launches several hundred more kernels than a 1-row one on a GPU, where a pass is bound by how many
it launches; here each program keeps one block of a head's state in registers and walks the rows in order.

One program per (lane, value head, block of `BLOCK_V` value columns): it loads the state's [dk, BLOCK_V] block once,
and for each row normalises q and k (L2, eps 1e-6; q scaled by dk^-0.5), decays the state, reads it with k, writes
the delta, reads it with q, and stores the row's output block and the state after the row. Exactness: every sum is
over dk within one program, in an order fixed by the shapes, so row t of a T-row call equals the t-th one-row call
bit for bit, whatever T and the lanes (tested). Against the twin it agrees to float32 rounding, not bit for bit.
Not here: the torch twin and the chunked prefill form (kernels/gated_delta.py), choosing a route (that module's
`gated_delta_rows`).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import HAVE_TRITON, check, tl, triton

Tensor = torch.Tensor

BLOCK_V = 32

if HAVE_TRITON:

    @triton.jit
    def _rows_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        g_ptr,
        beta_ptr,
        s0_ptr,
        out_ptr,
        states_ptr,
        T,
        NK,
        NV,
        DK,
        DV,
        GROUP,
        SCALE,
        BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        b, h, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        kh = h // GROUP
        offs_k = tl.arange(0, BLOCK_K)
        offs_v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
        mk, mv = offs_k < DK, offs_v < DV
        block = offs_k[:, None] * DV + offs_v[None, :]
        both = mk[:, None] & mv[None, :]
        s = tl.load(s0_ptr + (b * NV + h) * DK * DV + block, mask=both, other=0.0)
        for t in range(T):
            row = b * T + t
            q = tl.load(q_ptr + (row * NK + kh) * DK + offs_k, mask=mk, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + (row * NK + kh) * DK + offs_k, mask=mk, other=0.0).to(tl.float32)
            q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * SCALE
            k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
            v = tl.load(v_ptr + (row * NV + h) * DV + offs_v, mask=mv, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + row * NV + h)
            beta = tl.load(beta_ptr + row * NV + h)
            s = s * tl.exp(g)
            delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
            s = s + k[:, None] * delta[None, :]
            tl.store(out_ptr + (row * NV + h) * DV + offs_v, tl.sum(s * q[:, None], axis=0), mask=mv)
            tl.store(states_ptr + (row * NV + h) * DK * DV + block, s, mask=both)


def gated_delta_rows_triton(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, block_v: int = BLOCK_V
) -> tuple[Tensor, Tensor]:
    """As `gated_delta_rows_ref`: q, k [B, T, nk, dk]; v [B, T, nv, dv]; g, beta [B, T, nv] float32; state
    [B, nv, dk, dv] float32 (not modified). Returns out [B, T, nv, dv] and states [B, T, nv, dk, dv], float32."""
    check(HAVE_TRITON, "gated_delta_rows_triton: triton is not installed")
    b, t, nk, dk = q.shape
    nv, dv = v.shape[-2:]
    check(
        k.shape == q.shape and v.shape[:2] == (b, t) and nv % nk == 0,
        f"gated_delta_rows_triton: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not agree",
    )
    check(
        g.shape == beta.shape == (b, t, nv) and state.shape == (b, nv, dk, dv) and state.dtype == torch.float32,
        f"gated_delta_rows_triton: g {tuple(g.shape)}, beta {tuple(beta.shape)}, state {tuple(state.shape)} "
        f"({state.dtype}) must be [{b}, {t}, {nv}] and float32 [{b}, {nv}, {dk}, {dv}]",
    )
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g, beta, state = g.float().contiguous(), beta.float().contiguous(), state.contiguous()
    out = torch.empty(b, t, nv, dv, dtype=torch.float32, device=q.device)
    states = torch.empty(b, t, nv, dk, dv, dtype=torch.float32, device=q.device)
    if b * t == 0:
        return out, states
    grid = (b, nv, triton.cdiv(dv, block_v))
    _rows_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        state,
        out,
        states,
        t,
        nk,
        nv,
        dk,
        dv,
        nv // nk,
        dk**-0.5,
        BLOCK_K=triton.next_power_of_2(dk),
        BLOCK_V=block_v,
    )
    return out, states
