"""Attention of each row over its own slot's cached keys, every row on its own: the decode route's attention.

Owns: `decode_attention_cpu(q, k_cache, v_cache, row_slot, row_keys, scale)`, the CPU kernel's wrapper
(kernels/cpu/rows.c), and `decode_attention_ref`, its torch twin (one row at a time, for the tests: where the C
kernels are missing, the attention layer keeps its own padded-grid route, which is faster than a row loop). Row r
reads keys 0 .. row_keys[r] - 1 of slot row_slot[r] (causal by construction: a row's key count is its position
+ 1), scores in float32, softmax in float32, the weighted values in float32, rounded once at the end. On the
avx512bf16 build with a bf16 cache both products are bf16 dot products summed in float32: the query and the
probabilities rounded to bf16 (the keys and values are stored so), as torch's bf16 SDPA computes them.
Not here: writing the keys (the attention layer does that first), RoPE, the output projection.

Why rows are independent here and not in a batched matmul: see docs/decode-route.md. Each (row, head) is one
program in the C kernel with a fixed reduction order over head_dim and over keys, so a verify row equals the
same token decoded alone bit for bit, whatever else shares the pass.
"""

from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import check

Tensor = torch.Tensor


def _check_args(q: Tensor, k_cache: Tensor, v_cache: Tensor, row_slot: Tensor, row_keys: Tensor) -> None:
    check(q.dim() == 3, f"decode_attention: q must be [rows, heads, head_dim], got {tuple(q.shape)}")
    check(
        k_cache.dim() == 4 and k_cache.shape == v_cache.shape,
        f"decode_attention: caches must be [slots, kv_heads, capacity, head_dim] alike, got "
        f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}",
    )
    check(q.shape[2] == k_cache.shape[3], f"decode_attention: q head_dim {q.shape[2]} != cache {k_cache.shape[3]}")
    check(
        q.shape[1] % k_cache.shape[1] == 0,
        f"decode_attention: {q.shape[1]} heads is not a multiple of {k_cache.shape[1]} kv heads",
    )
    check(
        row_slot.shape == row_keys.shape == q.shape[:1] and row_slot.dtype == row_keys.dtype == torch.int64,
        "decode_attention: row_slot and row_keys must be int64 [rows]",
    )


def decode_attention_ref(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    row_slot: Tensor,
    row_keys: Tensor,
    scale: float,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """The torch twin, one row at a time: [rows, heads, head_dim] in `out_dtype` (default: the cache's)."""
    _check_args(q, k_cache, v_cache, row_slot, row_keys)
    heads, kvh = q.shape[1], k_cache.shape[1]
    out = []
    for r in range(q.shape[0]):
        s, n = int(row_slot[r]), int(row_keys[r])
        keys = k_cache[s, :, :n].float().repeat_interleave(heads // kvh, dim=0)  # [heads, n, hd]
        vals = v_cache[s, :, :n].float().repeat_interleave(heads // kvh, dim=0)
        probs = ((keys @ q[r].float()[:, :, None])[..., 0] * scale).softmax(-1)  # [heads, n]
        out.append((probs[:, None, :] @ vals)[:, 0])
    res = torch.stack(out) if out else q.new_zeros(0, *q.shape[1:], dtype=torch.float32)
    return res.to(out_dtype or k_cache.dtype)


def decode_attention_cpu(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    row_slot: Tensor,
    row_keys: Tensor,
    scale: float,
    out_dtype: torch.dtype | None = None,
    threads: int | None = None,
) -> Tensor:
    """The C kernel; q is widened to float32 first. Needs `cpu_build.library()` and CPU tensors."""
    lib = cpu_build.library()
    check(lib is not None, f"decode_attention_cpu: the CPU kernels are unavailable ({cpu_build.unavailable()})")
    _check_args(q, k_cache, v_cache, row_slot, row_keys)
    cdt, odt = cpu_build.dtype_code(k_cache.dtype), cpu_build.dtype_code(out_dtype or k_cache.dtype)
    check(cdt is not None and odt is not None, f"decode_attention_cpu: cache dtype {k_cache.dtype} unsupported")
    check(k_cache.is_contiguous() and v_cache.is_contiguous(), "decode_attention_cpu: caches must be contiguous")
    hd = q.shape[2]
    check(hd % 8 == 0 and hd <= 256, f"decode_attention_cpu: head_dim {hd} must be a multiple of 8, at most 256")
    qf = q.float().contiguous()
    slot, keys = row_slot.contiguous(), row_keys.contiguous()
    out = torch.empty(q.shape, dtype=out_dtype or k_cache.dtype)
    slots, kvh, cap, _ = k_cache.shape
    rc = lib.sl_attend(
        qf.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        cdt,
        slot.data_ptr(),
        keys.data_ptr(),
        out.data_ptr(),
        odt,
        q.shape[0],
        q.shape[1],
        kvh,
        cap,
        hd,
        scale,
        threads or torch.get_num_threads(),
    )
    check(rc == 0, f"decode_attention_cpu: the kernel failed (code {rc})")
    return out


def serves_wide(head_dim: int) -> bool:
    """True where this kernel is also the faster route for a wide prefill chunk than one fused
    `scaled_dot_product_attention` a lane: the 16-lane (avx512bf16) build, whose jobs take up to 32 rows of a lane
    over one widening of each key block, faster than SDPA with AVX512-BF16 and a tie with the AVX2 build, where the
    fused SDPA route stays (CHANGELOG.md has the probe's figures)."""
    return head_dim % 16 == 0 and cpu_build.bf16_kernels()
