"""The mtp head: one decoder layer that drafts the token after next from the trunk's state and the next token.

Owns: the shape record (`MtpConfig`, the `mtp.json` schema) and the math, named after the published Qwen3-Next
checkpoint (`mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*`, `mtp.norm`). A pair
(state h_t, token t+1) becomes one input row: both normalized, concatenated [embedding | hidden], projected back to
the hidden size. The layer attends over the pairs of earlier committed positions (the drafter's window) and over the
chain's own earlier rows; its output, normed, goes through the target's output head to draft token t+2, and the
output itself is the state the next step pairs with the draft (so draft i+1 follows draft i).
Not here: the window ring buffer (`drafter_window.py`), files (`drafter_weights.py`), the backend (`stages/drafters`).
"""

from __future__ import annotations

import torch
from torch import nn

from speclane.stages.models.draft_layer import DrafterNet, DrafterShape, DraftLayer, Linear, RMSNorm, rope

Tensor = torch.Tensor


class MtpConfig(DrafterShape):
    """`mtp.json`: the head's shape and how it was fitted."""

    format: str = "speclane-mtp"
    version: int = 1


class _Inner(nn.Module):
    def __init__(self, cfg: MtpConfig):
        super().__init__()
        h = cfg.hidden_size
        self.fc = Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(
            [DraftLayer(h, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps)]
        )
        self.norm = RMSNorm(h, cfg.rms_norm_eps)


class MtpNet(DrafterNet):
    def __init__(self, cfg: MtpConfig):
        super().__init__()
        self.cfg = cfg
        self.mtp = _Inner(cfg)

    @property
    def layer(self) -> DraftLayer:
        return self.mtp.layers[0]

    @property
    def kv_dim(self) -> int:
        return self.cfg.num_kv_heads * self.cfg.head_dim

    def fuse(self, hidden: Tensor, emb: Tensor) -> Tensor:
        """(state, next token's embedding) [..., hidden] each -> the layer's input row [..., hidden]."""
        m = self.mtp
        return m.fc(torch.cat([m.pre_fc_norm_embedding(emb), m.pre_fc_norm_hidden(hidden)], dim=-1))

    def tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return rope(positions, self.cfg.head_dim, self.cfg.rope_theta)

    def pair_kv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values [R, 1, kv] of fused rows x [R, hidden] at positions [R], as the window stores them."""
        cos, sin = self.tables(positions)
        k, v = self.layer.kv(self.layer.input_layernorm(x), cos, sin)
        return k[:, None], v[:, None]

    def step(
        self, x: Tensor, positions: Tensor, ext_k: Tensor, ext_v: Tensor, ext_mask: Tensor, own_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rows x [B, S, hidden] at positions [B, S] over outside keys ext_k, ext_v [B, M, kv] (ext_mask
        [B, S, M]) and each other (own_mask [S, S]). Returns (state [B, S, hidden] before the norm, keys, values)."""
        cos, sin = self.tables(positions)
        return self.layer(x, cos, sin, ext_k, ext_v, ext_mask, own_mask)

    def head_in(self, state: Tensor) -> Tensor:
        return self.mtp.norm(state)
