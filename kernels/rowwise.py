"""Fused row-wise ops of a target layer: residual add + RMSNorm, SwiGLU's silu(gate) * up, and q/k norm + RoPE
with the key/value write into the cache. Each has a torch twin (`*_ref`), a C kernel (kernels/cpu/rows.c) and a
triton kernel for CUDA (kernels/rowwise_triton.py).

Owns: the arithmetic of these ops, one row at a time, in float32 with one rounding on the way out, so a row's
result never depends on its neighbours. A layer runs about 40 small torch ops without these; fused, 4 calls.
Not here: the linear layers (decode_linear.py, wide_linear.py), attention over keys (decode_attention.py),
which layers call what (stages/models/).

Argument checks are the caller's: these run on the hot path with tensors the model built itself (contiguous,
of the model's dtype), and the C side trusts the shapes it is given.
"""

from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import use_triton
from speclane.kernels.rowwise_triton import add_rms_norm_triton, qk_rope_write_triton, silu_mul_triton

Tensor = torch.Tensor


_CODES = {torch.float32: 0, torch.bfloat16: 1}


def _code(t: Tensor) -> int:
    return _CODES[t.dtype]


def _c_serves(t: Tensor):
    """The C library where it takes `t` (a float32/bfloat16 CPU tensor), else None: the twin runs."""
    lib = cpu_build.library()
    return lib if lib is not None and t.device.type == "cpu" and t.dtype in _CODES else None


def add_rms_norm_ref(x: Tensor, h: Tensor | None, scale: Tensor | None, eps: float) -> Tensor | None:
    """If h: x <- x + h in place (x's dtype). Returns RMSNorm(x) * scale in x's dtype, computed in float32;
    with no scale, only the add (returns None)."""
    if h is not None:
        x.copy_(x.float() + h.float())
    if scale is None:
        return None
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * scale).to(x.dtype)


def add_rms_norm(x: Tensor, h: Tensor | None, scale: Tensor | None, eps: float) -> Tensor | None:
    if use_triton(x):
        return add_rms_norm_triton(x, h, scale, eps)
    lib = _c_serves(x)
    if lib is None:
        return add_rms_norm_ref(x, h, scale, eps)
    y = None if scale is None else torch.empty_like(x)
    rc = lib.sl_add_rmsnorm(
        x.data_ptr(),
        None if h is None else h.data_ptr(),
        _code(x),
        None if scale is None else scale.data_ptr(),
        None if y is None else y.data_ptr(),
        _code(x),
        x.shape[0],
        x.shape[1],
        eps,
    )
    if rc:
        raise ValueError(f"add_rms_norm: hidden size {x.shape[1]} over the kernel's 16384")
    return y


def silu_mul_ref(gu: Tensor) -> Tensor:
    """gu [rows, 2 * inter] -> silu(gate) * up [rows, inter], float32 inside, gu's dtype out."""
    g, u = gu.float().chunk(2, dim=-1)
    return (g / (1.0 + torch.exp(-g)) * u).to(gu.dtype)


def silu_mul(gu: Tensor) -> Tensor:
    if use_triton(gu):
        return silu_mul_triton(gu)
    lib = _c_serves(gu)
    if lib is None:
        return silu_mul_ref(gu)
    rows, inter = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gu.dtype)
    lib.sl_silu_mul(gu.data_ptr(), _code(gu), out.data_ptr(), rows, inter)
    return out


def _norm_rope_ref(x: Tensor, cos: Tensor, sin: Tensor, norm: Tensor | None, eps: float) -> Tensor:
    x = x.float()
    if norm is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm
    rot = cos.shape[-1]
    xr = x[..., :rot]
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    turned = xr * cos[:, None] + torch.cat([-x2, x1], dim=-1) * sin[:, None]
    return torch.cat([turned, x[..., rot:]], dim=-1)


def qk_rope_write_ref(
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
    """qkv [rows, width]: q, k, v start at `offsets`; `heads` = (heads, kv_heads, head_dim). Writes each row's
    normed, roped key and its value at (write_slot, :, write_pos) of the caches; returns q [rows, heads, head_dim]
    float32, normed and roped."""
    nh, kvh, hd = heads
    rows = qkv.shape[0]
    qo, ko, vo = offsets
    q = _norm_rope_ref(qkv[:, qo : qo + nh * hd].reshape(rows, nh, hd), cos, sin, q_norm, eps)
    k = _norm_rope_ref(qkv[:, ko : ko + kvh * hd].reshape(rows, kvh, hd), cos, sin, k_norm, eps)
    k_cache[write_slot, :, write_pos] = k.to(k_cache.dtype)
    v_cache[write_slot, :, write_pos] = qkv[:, vo : vo + kvh * hd].reshape(rows, kvh, hd).to(v_cache.dtype)
    return q


def qk_rope_write(
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
    if use_triton(qkv):
        return qk_rope_write_triton(
            qkv, offsets, heads, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, write_slot, write_pos
        )
    lib = _c_serves(qkv)
    if lib is None or k_cache.dtype not in _CODES:
        return qk_rope_write_ref(
            qkv, offsets, heads, cos, sin, q_norm, k_norm, eps, k_cache, v_cache, write_slot, write_pos
        )
    nh, kvh, hd = heads
    rows = qkv.shape[0]
    q = torch.empty(rows, nh, hd, dtype=torch.float32)
    cos, sin = cos.contiguous(), sin.contiguous()
    rc = lib.sl_qk_rope_write(
        qkv.data_ptr(),
        _code(qkv),
        rows,
        qkv.shape[1],
        *offsets,
        nh,
        kvh,
        hd,
        cos.shape[-1],
        cos.data_ptr(),
        sin.data_ptr(),
        None if q_norm is None else q_norm.data_ptr(),
        None if k_norm is None else k_norm.data_ptr(),
        eps,
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        _code(k_cache),
        write_slot.data_ptr(),
        write_pos.data_ptr(),
        k_cache.shape[2],
    )
    if rc:
        raise ValueError(f"qk_rope_write: head_dim {hd} over the kernel's 256, or rotary dim past it")
    return q
