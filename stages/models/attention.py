"""Full (softmax) attention of a target layer over the slot's KV cache, with the decode-route row guarantee.

Owns: the q/k/v projection (with Qwen's q/k norms and sigmoid output gate when the config says so), partial RoPE,
writing every row's key and value at `lane_start + j` (the cache length itself is commit's business), and attention
of each lane's rows over that lane's own keys. Not here: the KV length bookkeeping (target.commit).

Why the shapes are padded (measured on this project's CPU, torch 2.13.0, float32 and bfloat16, tests in
tests/models/test_decode_route.py): a float32 `q @ k.T` of 1 query row takes a gemv and of several rows a gemm,
which round differently; so each lane's queries are padded to a multiple of 8 rows (`QUERY_BUCKET`), which makes a
row's scores, softmax and weighted values independent of how many rows its lane has. Keys are read in whole
`KEY_BLOCK`s with the positions past each row masked: on this CPU that was already exact without the rounding, it
is kept because it costs at most one block of masked keys and fixes the key length a kernel sees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclane.kernels._triton import use_triton
from speclane.kernels.decode_attention import decode_attention_cpu, serves_wide
from speclane.kernels.decode_attention_triton import decode_attention_triton
from speclane.kernels.decode_linear import cpu_kernel_serves
from speclane.kernels.rowwise import qk_rope_write
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.layout import PassLayout
from speclane.stages.models.ops import DECODE_ROUTE_MAX_ROWS, apply_rope, linear, rms_norm, sigmoid
from speclane.stages.models.state import AttnCache
from speclane.stages.models.weights import AttentionWeights

Tensor = torch.Tensor


def wide_attention(qf: Tensor, cache: AttnCache, lay: PassLayout, dtype: torch.dtype) -> Tensor:
    """Queries qf [rows, heads, head_dim] (float32, roped) of a wide chunk over each lane's keys, causal: one
    `scaled_dot_product_attention` a lane in float32 (a fused kernel that never materialises the scores; the C
    kernel reads every key once per row, which dominated a long prompt's prefill)."""
    out = torch.empty(qf.shape, dtype=dtype)
    first = 0
    for lane, (start, n) in enumerate(zip(lay.lane_start, lay.lane_rows)):
        end = start + n
        slot = lay.slots[lane : lane + 1]
        k = cache.k.index_select(0, slot)[:, :, :end].float()  # [1, kv_heads, end, head_dim]
        v = cache.v.index_select(0, slot)[:, :, :end].float()
        q = qf[first : first + n].transpose(0, 1).unsqueeze(0)  # [1, heads, n, head_dim]
        allowed = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        out[first : first + n] = o[0].transpose(0, 1)
        first += n
    return out


def rope_write(
    qkv: Tensor,
    offsets: tuple[int, int, int],
    w: AttentionWeights,
    cfg: ModelConfig,
    cache: AttnCache,
    lay: PassLayout,
    cos: Tensor,
    sin: Tensor,
) -> Tensor:
    """q [rows, heads, head_dim] float32, normed (where the model norms q and k) and roped; each row's key, normed
    and roped, and its value written into the cache at its slot and position (`qk_rope_write`: one C call or one
    triton launch). `offsets`: where q, k and v start in a row of qkv."""
    heads = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    return qk_rope_write(
        qkv,
        offsets,
        heads,
        cos,
        sin,
        w.q_norm,
        w.k_norm,
        cfg.rms_norm_eps,
        cache.k,
        cache.v,
        lay.write_slot,
        lay.write_pos,
    )


def attention(
    x: Tensor, w: AttentionWeights, cfg: ModelConfig, cache: AttnCache, lay: PassLayout, cos: Tensor, sin: Tensor
) -> Tensor:
    """x [rows, hidden] (already normed) -> [rows, hidden]; writes the rows' keys and values into `cache`."""
    rows, nh, kvh, hd = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    groups = nh // kvh
    qkv = linear(x, w.qkv, w.qkv_bias)
    sizes = [nh * hd, nh * hd if cfg.attn_output_gate else 0, kvh * hd, kvh * hd]
    q, gate, k, v = qkv.split(sizes, dim=-1)
    offsets = (0, sizes[0] + sizes[1], sizes[0] + sizes[1] + sizes[2])
    gpu_rows = use_triton(x) and rows <= DECODE_ROUTE_MAX_ROWS  # the decode route's kernels on a GPU
    if cpu_kernel_serves(x) or gpu_rows:  # every row on its own, over its own slot's keys: exact without padding
        qf = rope_write(qkv, offsets, w, cfg, cache, lay, cos, sin)
        if gpu_rows:  # the keys read in place, one launch (the grid route below copies them out each layer)
            out = decode_attention_triton(qf, cache.k, cache.v, lay.write_slot, lay.row_keys, hd**-0.5, x.dtype)
        elif rows > DECODE_ROUTE_MAX_ROWS and not serves_wide(hd):  # a wide chunk: one fused product a lane
            out = wide_attention(qf, cache, lay, x.dtype)
        else:
            out = decode_attention_cpu(qf, cache.k, cache.v, lay.write_slot, lay.row_keys, hd**-0.5, x.dtype)
        out = out.view(rows, nh * hd)
        if cfg.attn_output_gate:
            out = out * sigmoid(gate)
        return linear(out, w.o, w.o_bias)
    if use_triton(x):  # a wide chunk on a GPU: norms, rotary and the key/value write in one launch
        q = rope_write(qkv, offsets, w, cfg, cache, lay, cos, sin).to(x.dtype)
    else:
        q, k, v = q.reshape(rows, nh, hd), k.reshape(rows, kvh, hd), v.reshape(rows, kvh, hd)
        if w.q_norm is not None:
            q, k = rms_norm(q, w.q_norm, cfg.rms_norm_eps), rms_norm(k, w.k_norm, cfg.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.k[lay.write_slot, :, lay.write_pos] = k
        cache.v[lay.write_slot, :, lay.write_pos] = v
    keys = cache.k[:, :, : lay.keys].index_select(0, lay.slots)  # [lanes, kvh, keys, hd]
    values = cache.v[:, :, : lay.keys].index_select(0, lay.slots)

    # Query rows grouped per KV head (no repeated keys): [lanes, kvh, groups * width, hd].
    qg = lay.to_grid(q).view(lay.lanes, lay.width, kvh, groups, hd).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(lay.lanes, kvh, groups * lay.width, hd)
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * hd**-0.5
    scores = scores.view(lay.lanes, kvh, groups, lay.width, lay.keys)
    scores = scores.masked_fill(lay.mask[:, None, None], float("-inf"))
    probs = scores.softmax(dim=-1).to(x.dtype).view(lay.lanes, kvh, groups * lay.width, lay.keys)
    out = torch.matmul(probs, values)  # [lanes, kvh, groups * width, hd]
    out = out.view(lay.lanes, kvh, groups, lay.width, hd).permute(0, 3, 1, 2, 4)
    out = lay.from_grid(out.reshape(lay.lanes, lay.width, nh * hd))  # [rows, nh * hd]
    if cfg.attn_output_gate:
        out = out * sigmoid(gate)
    return linear(out, w.o, w.o_bias)
