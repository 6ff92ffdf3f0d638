"""The Gated DeltaNet ("linear_attention") token mixer of Qwen3.5 / Qwen3-Next target layers.

Owns: the fused input projection (q | k | v | z | b | a), the causal conv over the slot's conv window, the gates
(beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)), the gated delta rule from the slot's recurrent state,
the gated RMSNorm and the output projection, and the records a pass returns. It never writes the slot's state:
commit copies a record into it. Not here: the kernels' arithmetic (kernels/gated_delta.py).

Routes: a pass with record="rows", or whose lanes all have at most 8 rows, runs every row through the single-token
decode step (so a verify row equals a decode step bit for bit); a record="last" pass with a longer lane (a prefill
chunk) runs the chunked form per lane, which agrees to float32 rounding.
"""

from __future__ import annotations

import torch

from speclane.kernels.gated_delta import causal_conv1d_rows_ref, gated_delta_chunk_ref, gated_delta_rows
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.layout import PassLayout
from speclane.stages.models.ops import linear, sigmoid, silu, softplus
from speclane.stages.models.state import GdnCache, GdnRecord
from speclane.stages.models.weights import GdnWeights

Tensor = torch.Tensor

STEP_ROUTE_MAX_ROWS = 8


def gated_deltanet(
    x: Tensor, w: GdnWeights, cfg: ModelConfig, cache: GdnCache, lay: PassLayout, record: str
) -> tuple[Tensor, GdnRecord]:
    """x [rows, hidden] (already normed) -> ([rows, hidden], record)."""
    rows = x.shape[0]
    nk, nv, dk, dv = cfg.gdn_key_heads, cfg.gdn_value_heads, cfg.gdn_key_dim, cfg.gdn_value_dim
    conv_dim = cfg.gdn_conv_dim
    qkv, z, b, a = linear(x, w.in_proj).split([conv_dim, nv * dv, nv, nv], dim=-1)

    conv0 = cache.conv.index_select(0, lay.slots)  # [lanes, C, K-1]
    state0 = cache.recurrent.index_select(0, lay.slots)  # [lanes, nv, dk, dv]
    mixed, windows = causal_conv1d_rows_ref(lay.to_grid(qkv), conv0, w.conv)  # [lanes, width, C]
    q, k, v = mixed.split([nk * dk, nk * dk, nv * dv], dim=-1)
    grid = (lay.lanes, lay.width)
    q, k, v = q.reshape(*grid, nk, dk), k.reshape(*grid, nk, dk), v.reshape(*grid, nv, dv)
    beta = lay.to_grid(sigmoid(b.float()))  # [lanes, width, nv]
    g = lay.to_grid(w.neg_a * softplus(a.float() + w.dt_bias))

    t = lay.steps
    if record == "rows" or t <= STEP_ROUTE_MAX_ROWS:
        out, states = gated_delta_rows(q[:, :t], k[:, :t], v[:, :t], g[:, :t], beta[:, :t], state0)
        pick = lay.from_grid if record == "rows" else lay.last
        rec = GdnRecord(conv=pick(windows), recurrent=pick(states))
    else:
        out = v.new_zeros(lay.lanes, t, nv, dv, dtype=torch.float32)
        finals = []
        for lane, n in enumerate(lay.lane_rows):
            sl = (slice(lane, lane + 1), slice(0, n))
            o, s = gated_delta_chunk_ref(q[sl], k[sl], v[sl], g[sl], beta[sl], state0[lane : lane + 1])
            out[lane, :n] = o[0]
            finals.append(s)
        rec = GdnRecord(conv=lay.last(windows), recurrent=torch.cat(finals))

    core = lay.from_grid(out)  # [rows, nv, dv] float32
    core = core * torch.rsqrt(core.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
    core = core * w.norm * silu(z.reshape(rows, nv, dv).float())
    return linear(core.to(x.dtype).reshape(rows, nv * dv), w.out), rec
