"""Gemma 3's attention and MLP arithmetic: local (sliding-window) and global attention with Gemma's query scale, and
the GELU-tanh gated MLP.

Owns: the q/k/v projection, Gemma's q/k RMSNorm and RoPE with the key/value write (`qk_rope_write`), attention of
each row over its lane's keys (for a local layer only the last `window` positions, the row's own included: key
position p is seen from query position q when q - window < p <= q), and `gelu_mlp`. Three routes, each row on its
own wherever the decode route's exactness is owed:
- up to DECODE_ROUTE_MAX_ROWS rows with the C kernels built: `decode_attention_cpu`, exact per row by
  construction; a local layer first gathers each row's window of keys into a row-private cache, so the kernel sees
  the same keys in the same order whatever else shares the pass;
- a wider pass (a prefill chunk): one `scaled_dot_product_attention` a lane;
- otherwise (no C kernels) the padded grid of attention.py, with the window applied to the scores.
There is no attention-score soft-cap: Gemma 3 replaced Gemma 2's with the q/k norms, and transformers' Gemma 3 reads
`attn_logit_softcapping` but never applies it, so neither does this module.
Not here: the layer's norms and residuals (gemma.py), which weights exist (gemma.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from speclane.kernels.decode_attention import decode_attention_cpu
from speclane.kernels.decode_linear import cpu_kernel_serves
from speclane.stages.models.attention import rope_write
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.layout import PassLayout
from speclane.stages.models.ops import DECODE_ROUTE_MAX_ROWS, linear
from speclane.stages.models.state import AttnCache
from speclane.stages.models.weights import AttentionWeights, MlpWeights

Tensor = torch.Tensor

_GELU_C = (2.0 / torch.pi) ** 0.5


def tanh(x: Tensor) -> Tensor:
    """tanh in float32 written with `exp` (row-stable, see ops.py: torch's vector and scalar paths of `tanh` may
    round differently); exp's overflow to inf gives exactly 1, its underflow to 0 exactly -1."""
    return 1.0 - 2.0 / (torch.exp(2.0 * x.float()) + 1.0)


def softcap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap) in float32: the soft-cap of the output logits."""
    return tanh(x / cap) * cap


def gelu_mlp(x: Tensor, w: MlpWeights) -> Tensor:
    """down(gelu_tanh(gate(x)) * up(x)), gate and up as one matrix; the activation in float32, rounded once."""
    g, u = linear(x, w.gate_up, w.gate_up_bias).float().chunk(2, dim=-1)
    act = 0.5 * g * (1.0 + tanh(_GELU_C * (g + 0.044715 * g * g * g)))
    return linear((act * u).to(x.dtype), w.down, w.down_bias)


def rope_tables(positions: Tensor, dim: int, theta: float, factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos, sin [rows, dim] float32, rotate-half convention; `factor` is linear RoPE scaling (frequencies / factor)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device).float() / dim))
    if factor != 1.0:
        inv_freq = inv_freq / factor
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def gemma_attention(
    x: Tensor,
    w: AttentionWeights,
    cfg: ModelConfig,
    cache: AttnCache,
    lay: PassLayout,
    cos: Tensor,
    sin: Tensor,
    window: int,
) -> Tensor:
    """x [rows, hidden] (normed) -> [rows, hidden]; writes the rows' keys and values. `window` 0: global."""
    rows, nh, kvh, hd = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qkv = linear(x, w.qkv, w.qkv_bias)
    qf = rope_write(qkv, (0, nh * hd, (nh + kvh) * hd), w, cfg, cache, lay, cos, sin)  # float32, normed, roped
    scale = cfg.attn_scale or hd**-0.5
    window = window if 0 < window < cache.k.shape[2] else 0  # a window as long as the cache never binds
    if rows > DECODE_ROUTE_MAX_ROWS:
        out = _per_lane(qf, cache, lay, scale, window, x.dtype)
    elif cpu_kernel_serves(x) and hd % 8 == 0 and hd <= 256:
        if window:
            k, v, slots, keys = _windows(cache, lay, window)
            out = decode_attention_cpu(qf, k, v, slots, keys, scale, x.dtype)
        else:
            out = decode_attention_cpu(qf, cache.k, cache.v, lay.write_slot, lay.row_keys, scale, x.dtype)
    else:
        out = _grid(qf, cache, lay, scale, window, x.dtype)
    return linear(out.reshape(rows, nh * hd), w.o, w.o_bias)


def _windows(cache: AttnCache, lay: PassLayout, window: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each row's window of keys and values, oldest first, as a cache of its own: ([rows, kvh, window, hd] twice,
    the row-private slots [rows], the keys each row reads [rows]). Device-side only."""
    n = lay.row_keys.clamp(max=window)  # [rows]
    first = lay.row_keys - n
    j = torch.arange(window, device=n.device)
    pos = torch.minimum(first[:, None] + j[None, :], (lay.row_keys - 1)[:, None])  # [rows, window]
    slot = lay.write_slot[:, None].expand_as(pos)
    k = cache.k[slot, :, pos].permute(0, 2, 1, 3).contiguous()  # [rows, window, kvh, hd] -> [rows, kvh, window, hd]
    v = cache.v[slot, :, pos].permute(0, 2, 1, 3).contiguous()
    return k, v, torch.arange(pos.shape[0], device=n.device), n


def _per_lane(qf: Tensor, cache: AttnCache, lay: PassLayout, scale: float, window: int, dtype) -> Tensor:
    """A wide chunk: one fused SDPA a lane in float32, causal and windowed, over the keys the lane can see."""
    out, dev = torch.empty(qf.shape, dtype=dtype, device=qf.device), qf.device
    first = 0
    for lane, (start, n) in enumerate(zip(lay.lane_start, lay.lane_rows)):
        end = start + n
        lo = max(0, start - window + 1) if window else 0
        slot = lay.slots[lane : lane + 1]
        k = cache.k.index_select(0, slot)[:, :, lo:end].float()  # [1, kvh, end - lo, hd]
        v = cache.v.index_select(0, slot)[:, :, lo:end].float()
        q = qf[first : first + n].transpose(0, 1).unsqueeze(0)  # [1, nh, n, hd]
        kpos, qpos = torch.arange(lo, end, device=dev)[None, :], torch.arange(start, end, device=dev)[:, None]
        allowed = (kpos <= qpos) & ((kpos > qpos - window) if window else True)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)
        out[first : first + n] = o[0].transpose(0, 1)
        first += n
    return out


def _grid(qf: Tensor, cache: AttnCache, lay: PassLayout, scale: float, window: int, dtype) -> Tensor:
    """The padded grid of attention.py (queries padded to whole 8-row buckets, keys to whole blocks), float32
    scores with the window applied before the softmax."""
    rows, nh, hd = qf.shape
    kvh = cache.k.shape[1]
    groups = nh // kvh
    keys = cache.k[:, :, : lay.keys].index_select(0, lay.slots).float()  # [lanes, kvh, keys, hd]
    values = cache.v[:, :, : lay.keys].index_select(0, lay.slots).float()
    qg = lay.to_grid(qf).view(lay.lanes, lay.width, kvh, groups, hd).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(lay.lanes, kvh, groups * lay.width, hd)
    scores = (torch.matmul(qg, keys.transpose(-1, -2)) * scale).view(lay.lanes, kvh, groups, lay.width, lay.keys)
    mask = lay.mask
    if window:
        qpos = [[s + min(j, r - 1) for j in range(lay.width)] for s, r in zip(lay.lane_start, lay.lane_rows)]
        qpos = torch.tensor(qpos, dtype=torch.int64, device=mask.device)  # [lanes, width]
        mask = mask | (torch.arange(lay.keys, device=mask.device)[None, None, :] <= qpos[:, :, None] - window)
    scores = scores.masked_fill(mask[:, None, None], float("-inf"))
    probs = scores.softmax(dim=-1).view(lay.lanes, kvh, groups * lay.width, lay.keys)
    out = torch.matmul(probs, values).view(lay.lanes, kvh, groups, lay.width, hd).permute(0, 3, 1, 2, 4)
    return lay.from_grid(out.reshape(lay.lanes, lay.width, nh, hd)).to(dtype)
