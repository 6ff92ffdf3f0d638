"""The decode route's attention as a triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1): each row over
its own slot's cached keys, read in place.

Owns: `decode_attention_triton`, the signature and result of kernels/decode_attention.py's twin. One program per
(row, head): it reads the row's slot and key count, walks the keys in blocks of `BLOCK_N` with a running maximum
and sum (the softmax in float32, online), and writes the weighted values rounded once. Where the device route
copies every lane's whole key and value prefix out of the cache each layer and launches about fifteen operations,
this reads the keys where they are in one launch. Exactness: a row's blocks and sums depend only on its own key
count, so a verify row equals the same token decoded alone bit for bit; against the twin it agrees to float32
rounding (the online softmax rescales as it goes).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import HAVE_TRITON, tl, triton

Tensor = torch.Tensor

BLOCK_N = 32

if HAVE_TRITON:

    @triton.jit
    def _attend_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        slot_ptr,
        keys_ptr,
        out_ptr,
        H,
        KVH,
        CAP,
        HD,
        scale,
        BLOCK_D: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        r, h = tl.program_id(0), tl.program_id(1)
        kh = h // (H // KVH)
        offs_d = tl.arange(0, BLOCK_D)
        dm = offs_d < HD
        slot = tl.load(slot_ptr + r)
        n = tl.load(keys_ptr + r)
        q = tl.load(q_ptr + (r * H + h) * HD + offs_d, mask=dm, other=0.0).to(tl.float32)
        base = (slot * KVH + kh) * CAP * HD
        # float32 scalars from the start (a loop-carried value keeps its first type when compiled)
        m_i = tl.max(tl.full((BLOCK_N,), -float("inf"), tl.float32), axis=0)
        l_i = tl.sum(tl.zeros((BLOCK_N,), dtype=tl.float32), axis=0)
        acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for start in range(0, n, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            km = keys < n
            at = base + keys[:, None] * HD + offs_d[None, :]
            k = tl.load(k_ptr + at, mask=km[:, None] & dm[None, :], other=0.0).to(tl.float32)
            s = tl.where(km, tl.sum(k * q[None, :], axis=1) * scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_ptr + at, mask=km[:, None] & dm[None, :], other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        tl.store(out_ptr + (r * H + h) * HD + offs_d, (acc / l_i).to(out_ptr.dtype.element_ty), mask=dm)


def decode_attention_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    row_slot: Tensor,
    row_keys: Tensor,
    scale: float,
    out_dtype: torch.dtype | None = None,
    block_n: int = BLOCK_N,
) -> Tensor:
    """As `decode_attention_ref`: q [rows, heads, head_dim]; caches [slots, kv_heads, capacity, head_dim]
    (contiguous); row r attends to keys 0 .. row_keys[r] - 1 of slot row_slot[r]. Returns [rows, heads,
    head_dim] in `out_dtype` (default: the cache's). Every row has at least one key (its own)."""
    rows, heads, hd = q.shape
    out = torch.empty(q.shape, dtype=out_dtype or k_cache.dtype, device=q.device)
    if rows:
        _attend_kernel[(rows, heads)](
            q.contiguous(),
            k_cache,
            v_cache,
            row_slot.contiguous(),
            row_keys.contiguous(),
            out,
            heads,
            k_cache.shape[1],
            k_cache.shape[2],
            hd,
            scale,
            BLOCK_D=triton.next_power_of_2(hd),
            BLOCK_N=block_n,
        )
    return out
