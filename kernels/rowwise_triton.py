"""The fused row-wise ops of a target layer as triton kernels, for CUDA (or CPU tensors under TRITON_INTERPRET=1):
residual add + RMSNorm, SwiGLU's silu(gate) * up, and q/k norm + RoPE with the key/value write into the cache.

Owns: `add_rms_norm_triton`, `silu_mul_triton`, `qk_rope_write_triton` and their kernels, with the signatures and
results of the torch twins in kernels/rowwise.py (which dispatches to them on a CUDA tensor). On a GPU a pass is
bound by how many kernels it launches (docs/benchmarks.md, "NVIDIA H200"): the twins take 8, 6 and about 14
operations where these take one launch each. Exactness: each program reads one row (or one row's head) and reduces
it in an order fixed by the shapes, so a row's result never depends on its neighbours; against the twins they
agree to float32 rounding (a norm's mean is summed in another order). Argument checks are the caller's, as for the
C kernels: these run on the hot path with tensors the model built.
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import HAVE_TRITON, tl, triton

Tensor = torch.Tensor

if HAVE_TRITON:

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, h_ptr, scale_ptr, y_ptr, D, eps, HAS_H: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr
    ):
        r = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        m = offs < D
        x = tl.load(x_ptr + r * D + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_H:
            h = tl.load(h_ptr + r * D + offs, mask=m, other=0.0).to(tl.float32)
            rounded = (x + h).to(x_ptr.dtype.element_ty)  # the residual stream keeps the model's dtype
            tl.store(x_ptr + r * D + offs, rounded, mask=m)
            x = rounded.to(tl.float32)
        if HAS_SCALE:
            inv = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
            scale = tl.load(scale_ptr + offs, mask=m, other=0.0)
            tl.store(y_ptr + r * D + offs, (x * inv * scale).to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, INTER, BLOCK: tl.constexpr):
        r, b = tl.program_id(0), tl.program_id(1)
        offs = b * BLOCK + tl.arange(0, BLOCK)
        m = offs < INTER
        g = tl.load(gu_ptr + r * 2 * INTER + offs, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + r * 2 * INTER + INTER + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + r * INTER + offs, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _norm_rope(src_ptr, norm_ptr, cos_ptr, sin_ptr, r, HD, ROT, eps, HAS_NORM: tl.constexpr, BLOCK: tl.constexpr):
        """One head of one row, normed (where the model norms it) and rotated over its first ROT dims: float32."""
        offs = tl.arange(0, BLOCK)
        m = offs < HD
        half = ROT // 2
        partner = tl.where(offs < half, offs + half, offs - half)
        x = tl.load(src_ptr + offs, mask=m, other=0.0).to(tl.float32)
        xp = tl.load(src_ptr + partner, mask=m & (offs < ROT), other=0.0).to(tl.float32)
        if HAS_NORM:
            inv = tl.rsqrt(tl.sum(x * x, axis=0) / HD + eps)
            x = x * inv * tl.load(norm_ptr + offs, mask=m, other=0.0)
            xp = xp * inv * tl.load(norm_ptr + partner, mask=m & (offs < ROT), other=0.0)
        rot = offs < ROT
        c = tl.load(cos_ptr + r * ROT + offs, mask=rot, other=1.0)
        s = tl.load(sin_ptr + r * ROT + offs, mask=rot, other=0.0)
        turned = x * c + tl.where(offs < half, -xp, xp) * s
        return tl.where(rot, turned, x)

    @triton.jit
    def _qk_rope_write_kernel(
        qkv_ptr,
        cos_ptr,
        sin_ptr,
        qn_ptr,
        kn_ptr,
        q_ptr,
        kc_ptr,
        vc_ptr,
        slot_ptr,
        pos_ptr,
        W,
        QO,
        KO,
        VO,
        NH,
        KVH,
        HD,
        ROT,
        L,
        eps,
        Q_NORM: tl.constexpr,
        K_NORM: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        r, hh = tl.program_id(0), tl.program_id(1)
        offs = tl.arange(0, BLOCK)
        m = offs < HD
        if hh < NH:  # a query head: normed, rotated, returned in float32
            y = _norm_rope(qkv_ptr + r * W + QO + hh * HD, qn_ptr, cos_ptr, sin_ptr, r, HD, ROT, eps, Q_NORM, BLOCK)
            tl.store(q_ptr + (r * NH + hh) * HD + offs, y, mask=m)
        else:  # a key head: normed, rotated and written with its value at the row's slot and position
            kh = hh - NH
            y = _norm_rope(qkv_ptr + r * W + KO + kh * HD, kn_ptr, cos_ptr, sin_ptr, r, HD, ROT, eps, K_NORM, BLOCK)
            at = ((tl.load(slot_ptr + r) * KVH + kh) * L + tl.load(pos_ptr + r)) * HD + offs
            tl.store(kc_ptr + at, y.to(kc_ptr.dtype.element_ty), mask=m)
            v = tl.load(qkv_ptr + r * W + VO + kh * HD + offs, mask=m, other=0.0)
            tl.store(vc_ptr + at, v.to(vc_ptr.dtype.element_ty), mask=m)


def add_rms_norm_triton(x: Tensor, h: Tensor | None, scale: Tensor | None, eps: float) -> Tensor | None:
    """As `add_rms_norm_ref`: x [rows, D] contiguous gets x + h in place (x's dtype) where h is given; returns
    RMSNorm(x) * scale in x's dtype, or None without a scale."""
    rows, d = x.shape
    y = None if scale is None else torch.empty_like(x)
    if rows:
        _add_rms_norm_kernel[(rows,)](
            x,
            x if h is None else h.contiguous(),
            x if scale is None else scale,
            x if y is None else y,
            d,
            eps,
            HAS_H=h is not None,
            HAS_SCALE=scale is not None,
            BLOCK=triton.next_power_of_2(d),
        )
    return y


def silu_mul_triton(gu: Tensor, block: int = 1024) -> Tensor:
    """As `silu_mul_ref`: gu [rows, 2 * inter] -> silu(gate) * up [rows, inter] in gu's dtype."""
    rows, inter = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gu.dtype, device=gu.device)
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gu.contiguous(), out, inter, BLOCK=block)
    return out


def qk_rope_write_triton(
    qkv: Tensor,
    offsets: tuple[int, int, int],
    heads: tuple[int, int, int],
    cos: Tensor,
    sin: Tensor,
    q_norm: Tensor | None,
    k_norm: Tensor | None,
    eps: float,
    k_cache: Tensor,
    v_cache: Tensor,
    write_slot: Tensor,
    write_pos: Tensor,
) -> Tensor:
    """As `qk_rope_write_ref`: writes each row's normed, roped key and its value at (write_slot, :, write_pos) of
    the caches [slots, kv_heads, length, head_dim]; returns q [rows, heads, head_dim] float32."""
    nh, kvh, hd = heads
    rows = qkv.shape[0]
    q = torch.empty(rows, nh, hd, dtype=torch.float32, device=qkv.device)
    if rows:
        cos, sin, qkv = cos.contiguous(), sin.contiguous(), qkv.contiguous()
        _qk_rope_write_kernel[(rows, nh + kvh)](
            qkv,
            cos,
            sin,
            cos if q_norm is None else q_norm,
            cos if k_norm is None else k_norm,
            q,
            k_cache,
            v_cache,
            write_slot,
            write_pos,
            qkv.shape[1],
            *offsets,
            nh,
            kvh,
            hd,
            cos.shape[-1],
            k_cache.shape[2],
            eps,
            Q_NORM=q_norm is not None,
            K_NORM=k_norm is not None,
            BLOCK=triton.next_power_of_2(hd),
        )
    return q
