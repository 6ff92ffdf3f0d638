"""The dflash2 drafter network: five decoder layers that draft a block of tokens in one non-causal pass.

Owns: the shape record (`DFlash2Config`, the `dflash2.json` schema) and the math. The target's hidden states at
several layers (`target_layers`, tap i = output of decoder layer i, 0-based) are concatenated and projected to one
context feature per committed position (`fc`, `hidden_norm`); each draft layer turns those features into keys and
values with its own projections, so the window of committed positions is read as attention context. The block is
the anchor's embedding followed by `block_size - 1` mask positions, each with its own learned mask embedding plus the
anchor's embedding; every block row sees every other block row and the window (block diffusion drafting conditioned
on target features, after z-lab's DFlash), and the output at block row j proposes the token j positions after the
anchor through the target's own head.
Version 3 files pair each window position's feature with the token after it (`pair`); version 2 files (the first
shipped) read each position's own feature, and still load and draft as they were fitted.
Version 4 reads the window as version 2 does and builds its block rows with a
learned projection of [anchor | carried feature] (`block_fc`) instead of adding the two. Version 5 (what
`fit-drafter` makes) also gives each block row j the token prompt lookup finds for
anchor + j (`stages/models/lookup.py`: what followed the latest earlier occurrence of the context's longest
matching suffix), projected (`lookup_fc`) and tagged with the matched suffix's length (`lookup_embedding`), so a
copy from the window is in the row's input instead of having to be found by attention.
Not here: the window ring buffer (`drafter_window.py`), files (`drafter_weights.py`), the backend (`stages/drafters`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from speclane.stages.models.draft_layer import (
    DrafterNet,
    DrafterShape,
    DraftLayer,
    Linear,
    RMSNorm,
    for_drafting,
    rope,
    unit_rms_norm,
)
from speclane.stages.models.ops import apply_rope, draft_linear

Tensor = torch.Tensor


class DFlash2Config(DrafterShape):
    """`dflash2.json`: the drafter's shape, the target layers it reads, and how it was fitted."""

    format: str = "speclane-dflash2"
    # 2: one mask embedding per block position, the anchor added to every row (1 had one shared mask embedding).
    # 3: the window entry at position q pairs row q - 1's feature with token q's embedding (`pair`), as block row
    #    0 pairs the last committed row's feature with the anchor, and as mtp's window does: attention that finds
    #    the anchor among the entries' previous tokens reads the token that followed it (the induction path;
    #    version 2's entry at q holds row q's feature alone). Opt-in (the controls' --version): issue 18's copy
    #    control fitted neither version to copy in 300 steps, so it is not yet shown to pay.
    # 4: window entries as version 2; the block's rows are `block_fc` of [normed anchor | carried feature] (mtp's
    #    fusion) instead of their sum. The target's head is its embedding, so a row holding the anchor's normed
    #    embedding as it is scores the anchor far above every other token before any fitting (a fresh version 2
    #    drafted the anchor itself for most first drafts), and the fit spent its first hundreds of steps
    #    unlearning that (docs/decisions/0006-dflash2-fused-block-input.md).
    # 5: version 4, plus prompt lookup's candidate for each block row (`lookup_fc` of the candidate's normed
    #    embedding, and `lookup_embedding` by the matched suffix's length, 0 where lookup found none). Issue 18's
    #    copy control: fitted from scratch, neither version 2, 3 nor 4 learnt to copy from its window in 300-600
    #    steps (the induction lookup by attention is a slow, seed-dependent phase change); the rule an n-gram
    #    drafter uses finds the copy exactly and cheaply, and the drafter learns when to trust it.
    #    What `fit-drafter` makes (`drafter_weights.FRESH_DFLASH2_VERSION`; docs/decisions/0007).
    version: Literal[2, 3, 4, 5] = 2
    num_layers: int = 5
    target_layers: tuple[int, ...]
    block_size: int = 8  # anchor + up to 7 drafts
    shortlist_tokens: int = 8192  # rows of the shortlist head (int8; the default head, `--spec-draft-head`)
    lookup_min_n: int = 1  # version 5: the suffix lengths prompt lookup tries (as `ngram`'s defaults)
    lookup_max_n: int = 4

    @property
    def paired(self) -> bool:
        """Window entries pair row q - 1's feature with token q (version 3)."""
        return self.version == 3

    @property
    def fused(self) -> bool:
        """The block's input rows are `block_fc` of [anchor | carried feature] (version 4)."""
        return self.version >= 4

    @property
    def looks_up(self) -> bool:
        """Block rows read prompt lookup's candidates (version 5)."""
        return self.version >= 5


def default_layers(num_layers: int, taps: int = 5) -> tuple[int, ...]:
    """Taps spread from the second layer to the last (the last one is the state the target's head reads); fewer
    when the target has fewer layers to spread them over."""
    return tuple(sorted({round(1 + i * (num_layers - 2) / (taps - 1)) for i in range(taps)}))


class DFlash2Net(DrafterNet):
    def __init__(self, cfg: DFlash2Config):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = Linear(len(cfg.target_layers) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(cfg.block_size - 1, h))
        if cfg.fused:
            self.block_fc = Linear(2 * h, h, bias=False)
        if cfg.looks_up:
            self.lookup_fc = Linear(h, h, bias=False)
            self.lookup_embedding = nn.Parameter(torch.zeros(cfg.lookup_max_n + 1, h))
        self.layers = nn.ModuleList(
            DraftLayer(h, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps)
            for _ in range(cfg.num_layers)
        )
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.window_kv: Tensor | None = None  # every layer's [k; v] in one weight for drafting (`prepare_drafting`)

    @torch.no_grad()
    def prepare_drafting(self) -> None:
        """The layers' fused projections, and every layer's key and value projections stacked into one weight
        (a copy: the layers' own `qkv` keep theirs), which the window upkeep (`context_kv`) streams once for
        all five layers instead of ten products of 192 columns and five RoPEs."""
        super().prepare_drafting()
        self.window_kv = for_drafting(
            torch.cat(
                [torch.cat([layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight]) for layer in self.layers]
            ).contiguous()
        )

    def memory_bytes(self) -> int:
        extra = self.window_kv.numel() * self.window_kv.element_size() if isinstance(self.window_kv, Tensor) else 0
        return super().memory_bytes() + extra

    @property
    def kv_dim(self) -> int:
        return self.cfg.num_kv_heads * self.cfg.head_dim

    def features(self, taps: Tensor) -> Tensor:
        """taps [R, n_taps, hidden] -> one context feature per position [R, hidden]."""
        # Each tap is RMS-normalised before they are concatenated: the target's residual stream grows with depth and
        # carries a few very large dimensions, which would otherwise dominate `fc`.
        if torch.is_grad_enabled():
            tf = taps.float()
            normed = (tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)).to(taps.dtype)
        else:  # the row kernel: float32 sums without a float32 copy of the taps (a page-faulted 10 MB for a prompt)
            normed = unit_rms_norm(taps, self.cfg.rms_norm_eps)
        return self.hidden_norm(self.fc(normed.flatten(1)))

    def embed_norm(self, emb: Tensor) -> Tensor:
        """A token's embedding [..., hidden], RMS-normalised (no weight): the target's embedding rows are small
        beside a normed feature."""
        ef = emb.float()
        return (ef * torch.rsqrt(ef.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)).to(emb.dtype)

    def pair(self, prev: Tensor, emb: Tensor) -> Tensor:
        """Version 3's window entry [R, hidden] at position q: row q - 1's feature `prev` (zero at q = 0) plus
        token q's normed embedding `emb` (raw, [R, hidden]); block row 0 is the same pair for the anchor."""
        return prev + self.embed_norm(emb).to(prev.dtype)

    def context_kv(self, feats: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Features [R, hidden] of committed positions [R] -> keys, values [R, layers, kv] for the window."""
        cos, sin = rope(positions, self.cfg.head_dim, self.cfg.rope_theta)
        if self.window_kv is not None and not torch.is_grad_enabled():
            layers, heads, dim = len(self.layers), self.cfg.num_kv_heads, self.cfg.head_dim
            kv = draft_linear(feats, self.window_kv).view(-1, layers, 2, heads * dim)
            k = apply_rope(kv[:, :, 0].reshape(-1, layers * heads, dim), cos, sin)  # every layer's heads at once
            return k.view(-1, layers, heads * dim), kv[:, :, 1]
        kv = [layer.kv(feats, cos, sin) for layer in self.layers]
        return torch.stack([k for k, _ in kv], dim=1), torch.stack([v for _, v in kv], dim=1)

    def lookup_input(self, embed: Tensor, cand: Tensor, level: Tensor) -> tuple[Tensor, Tensor]:
        """Prompt lookup's candidates [B, S - 1] (-1: none) and their suffix lengths [B, S - 1] (0: none, from
        `lookup.lookup_rows`) -> `block`'s `lookup` input: the candidates' embeddings (zero where none) and the
        lengths, clamped to `lookup_max_n`."""
        found = cand >= 0
        emb = embed[cand.clamp(min=0)] * found[..., None].to(embed.dtype)
        return emb, torch.where(found, level.clamp(max=self.cfg.lookup_max_n), 0)

    def block(
        self,
        anchor_emb: Tensor,
        last: Tensor,
        start: Tensor,
        ext_k: Tensor,
        ext_v: Tensor,
        ext_mask: Tensor,
        lookup: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """anchor_emb [B, hidden] at positions start [B], `last` [B, hidden] the feature of the position before the
        anchor; window keys/values ext_k, ext_v [B, layers, M, kv] visible where ext_mask [B, M] (or [1, layers,
        M, kv]: one window all B blocks read, as in fitting: see `_packed`); `lookup` (version 5, from
        `lookup_input`) the block rows' candidate tokens. Returns the normed block states [B, block_size, hidden];
        row j drafts anchor + j."""
        b, s = anchor_emb.shape[0], self.cfg.block_size
        x = self.block_input(anchor_emb, last, lookup)
        cos, sin = self.block_tables(start)
        if ext_k.shape[0] == 1 and b > 1:
            return self._packed(x, cos, sin, ext_k, ext_v, ext_mask)
        own = torch.ones(s, s, dtype=torch.bool, device=x.device)  # non-causal inside the block
        mask = ext_mask[:, None, :].expand(b, s, ext_mask.shape[1])
        for i, layer in enumerate(self.layers):
            x, _, _ = layer(x, cos, sin, ext_k[:, i], ext_v[:, i], mask, own)
        return self.norm(x)

    def block_input(self, anchor_emb: Tensor, last: Tensor, lookup: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """The block's rows [B, block_size, hidden] before the layers (`block`'s arguments)."""
        # The anchor's embedding is RMS-normalised: the target's embedding rows are small beside a normed feature,
        # and the anchor is the most telling input of the block.
        anchor = self.embed_norm(anchor_emb)
        if self.cfg.fused:
            x = self._fused_rows(anchor, last)
            return self._looked_up(x, *lookup) if self.cfg.looks_up else x
        return self._summed_rows(anchor, last)

    def block_tables(self, start: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE tables cos, sin [B, block_size, head_dim] of blocks whose anchors sit at positions start [B]."""
        return rope(
            start[:, None] + torch.arange(self.cfg.block_size, device=start.device),
            self.cfg.head_dim,
            self.cfg.rope_theta,
        )

    def _fused_rows(self, anchor: Tensor, last: Tensor) -> Tensor:
        """Version 4's block input [B, S, hidden]: every row is `block_fc` of [normed anchor | carried feature]
        (mtp's fusion), rows 1.. plus their mask embedding."""
        x0 = self.block_fc(torch.cat([anchor, last.to(anchor.dtype)], dim=-1))[:, None]
        return torch.cat([x0, x0 + self.mask_embedding.to(x0.dtype)[None]], dim=1)

    def _looked_up(self, x: Tensor, cand_emb: Tensor, level: Tensor) -> Tensor:
        """Version 5: block rows 1.. plus their candidate's projected normed embedding (zero where lookup found
        none) and the embedding of the matched suffix's length."""
        w = cand_emb.shape[1]
        add = self.lookup_fc(self.embed_norm(cand_emb).to(x.dtype)) + self.lookup_embedding.to(x.dtype)[level]
        return torch.cat([x[:, :1], x[:, 1 : w + 1] + add, x[:, w + 1 :]], dim=1)

    def _summed_rows(self, anchor: Tensor, last: Tensor) -> Tensor:
        """Versions 2 and 3's block input [B, S, hidden]: the normed anchor, plus the mask embeddings, plus the
        carried feature, summed."""
        # Every mask position carries the anchor and its own embedding: with one shared mask embedding the rows
        # differed only through RoPE inside attention and had to find the anchor by attention too, and fitted to a
        # fraction of mtp's first-draft acceptance, which sees its token in its input row
        # (docs/decisions/0006-dflash2-fused-block-input.md).
        masks = self.mask_embedding.to(anchor.dtype)[None] + anchor[:, None]
        x = torch.cat([anchor[:, None], masks], dim=1)
        # The last committed position's feature is added to every block row, so the drafter starts from the state
        # that predicted the anchor instead of having to find it by attention, which fitted poorly alone.
        return x + last[:, None].to(x.dtype)

    def _packed(self, x: Tensor, cos: Tensor, sin: Tensor, ext_k: Tensor, ext_v: Tensor, ext_mask: Tensor) -> Tensor:
        """`block` for B blocks that read one window (fitting): the blocks laid end to end as one sequence of
        B * S rows, each row seeing the window through its block's mask and the rows of its own block only. The
        same attention as B separate blocks, in one call instead of B small ones (fitting's forward and backward
        then cost a fraction of the separate calls')."""
        b, s, h = x.shape
        block_of = torch.arange(b * s, device=x.device) // s
        own = block_of[:, None] == block_of[None, :]
        mask = ext_mask.repeat_interleave(s, dim=0)[None]  # [1, B * S, M]
        x, cos, sin = x.reshape(1, b * s, h), cos.reshape(1, b * s, -1), sin.reshape(1, b * s, -1)
        for i, layer in enumerate(self.layers):
            x, _, _ = layer(x, cos, sin, ext_k[:, i], ext_v[:, i], mask, own)
        return self.norm(x).reshape(b, s, h)
