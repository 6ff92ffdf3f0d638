"""The decoder layer both model drafters are built from (dflash2's five, mtp's one), as a torch module.

Owns: one pre-norm llama-style layer (GQA attention with RoPE, SwiGLU MLP) whose attention reads its own rows' keys plus
keys handed in from outside (a drafter's window of committed positions), under a boolean mask. The same code trains
(`stages/fitting/fit.py`, autograd) and drafts (`stages/drafters/*`, no grad), so what was fitted is what runs. Not
here: where the outside keys come from (`drafter_window.py`), the nets' inputs and heads (`dflash2_net.py`,
`mtp_net.py`), reading files (`drafter_weights.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import nn

from speclane.kernels.packed import PackedWeight, pack, packs
from speclane.kernels.rowwise import add_rms_norm
from speclane.stages.models.ops import apply_rope, draft_linear, rope_tables

Tensor = torch.Tensor


class DrafterShape(BaseModel):
    """The fields every model drafter's json config shares: its layers' shape and the target's vocabulary."""

    model_config = ConfigDict(extra="forbid")
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    vocab_size: int
    window: int = 2048  # committed positions the drafter reads
    fit: dict = {}  # how it was fitted (free-form provenance)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """GQA attention: q [B, H, S, D] over k, v [B, KVH, M, D] where mask [B, 1, S, M] (bool). Fitting (autograd)
    and devices other than the CPU take `scaled_dot_product_attention`; drafting on a CPU takes two float32 products
    with the query heads of a KV head stacked, which reads each key once (torch's CPU SDPA reads them once per
    query head and costs several times as much for a proposal's few rows). The two differ by rounding only: drafts
    are proposals the target verifies. Drafting where the C kernels serve runs neither
    (stages/models/draft_route.py)."""
    if torch.is_grad_enabled() or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    b, h, s, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    scores = torch.matmul(q.float().reshape(b, kvh, g * s, d), k.float().transpose(-1, -2)) * d**-0.5
    scores = scores.view(b, kvh, g, s, -1).masked_fill(~mask[:, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(b, kvh, g * s, -1)
    return torch.matmul(probs, v.float()).view(b, h, s, d).to(q.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if not torch.is_grad_enabled():  # drafting: the row kernel's float32 sums, no float32 copy of x
            return _row_rms_norm(x, self.weight.float(), self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def _row_rms_norm(x: Tensor, scale: Tensor, eps: float) -> Tensor:
    """RMSNorm of x [..., hidden] times float32 `scale` through the row kernel (`speclane.kernels.rowwise`: the C kernel
    where it serves, the float32 formula elsewhere). Torch's composite norm makes a float32 copy of x and three
    more temporaries; for a prompt's window rows those are fresh pages every call (CHANGELOG.md, a070374). Its sums are
    added in another order than torch's: a last-bit difference in about 1e-5 of bf16 elements, which a proposal
    (verified by the target) does not need to match."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    return add_rms_norm(flat, None, scale.contiguous(), eps).view(x.shape)


def unit_rms_norm(x: Tensor, eps: float) -> Tensor:
    """RMSNorm with no weight (dflash2's taps) for drafting, through the row kernel."""
    return _row_rms_norm(x, torch.ones(x.shape[-1], device=x.device), eps)


def for_drafting(weight: Tensor) -> Tensor | PackedWeight:
    """`weight` in the form drafting reads fastest: packed where this process's C kernels read that layout
    (kernels/packed.py: several draft rows for about the price of one), else itself."""
    return pack(weight) if weight.dtype == torch.bfloat16 and packs(weight) else weight


def packed_bytes(module: nn.Module) -> int:
    """Bytes of the packed copies drafting keeps beside `module`'s parameters."""
    return sum(v.data.nbytes for m in module.modules() for v in vars(m).values() if isinstance(v, PackedWeight))


class Linear(nn.Linear):
    """nn.Linear whose inference (no autograd) takes `draft_linear`: on a CPU with the C kernel a bf16 weight is
    streamed once with float32 sums instead of through torch's bf16 GEMV (half float32's speed on AVX2), in its
    packed copy where `prepare_drafting` made one. Fitting (autograd on) is plain nn.Linear; the state-dict
    names do not change."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.packed: PackedWeight | None = None

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or self.bias is not None:
            return super().forward(x)
        w = self.packed if self.packed is not None else self.weight
        return draft_linear(x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], -1)


class _Attn(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = Linear(heads * head_dim, hidden, bias=False)


class _Mlp(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = Linear(hidden, inter, bias=False)
        self.up_proj = Linear(hidden, inter, bias=False)
        self.down_proj = Linear(inter, hidden, bias=False)
        self.gate_up: Tensor | PackedWeight | None = None  # [gate; up] for drafting, set by `DraftLayer.fuse`

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up is not None and not torch.is_grad_enabled():
            gate, up = _fused(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _fused(x: Tensor, weight: Tensor | PackedWeight) -> Tensor:
    """x [..., in] @ weight.T through `draft_linear` (no autograd): one weight streamed for what were several."""
    return draft_linear(x.reshape(-1, x.shape[-1]), weight).reshape(*x.shape[:-1], -1)


class DraftLayer(nn.Module):
    """Tensor names follow the Hugging Face llama layer: input_layernorm, self_attn.{q,k,v,o}_proj,
    post_attention_layernorm, mlp.{gate,up,down}_proj."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = _Attn(hidden, heads, kv_heads, head_dim)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = _Mlp(hidden, inter)
        self.qkv: Tensor | PackedWeight | None = None  # [q; k; v] for drafting, set by `fuse`

    @torch.no_grad()
    def fuse(self) -> None:
        """Concatenate q|k|v and gate|up into one weight each for drafting (not for fitting: the copies would go
        stale as the parameters move; nor saved: the state dict keeps the Hugging Face names). Each output column
        is the same dot product as through its own projection; a proposal's layer makes 4 weight passes instead of
        7 (each pass of a few rows costs its call and its weight's stream)."""
        a, m = self.self_attn, self.mlp
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous()
        gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous()
        # the projections become views of the fused weights: one row-major copy of each weight in memory
        q, k, v = qkv.split([a.q_proj.weight.shape[0], a.k_proj.weight.shape[0], a.v_proj.weight.shape[0]])
        a.q_proj.weight.data, a.k_proj.weight.data, a.v_proj.weight.data = q, k, v
        m.gate_proj.weight.data, m.up_proj.weight.data = gate_up.chunk(2)
        # drafting reads packed copies where the build has them (the row-major ones stay for the state dict)
        self.qkv, m.gate_up = for_drafting(qkv), for_drafting(gate_up)
        for lin in (a.o_proj, m.down_proj):
            w = for_drafting(lin.weight)
            lin.packed = w if isinstance(w, PackedWeight) else None

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (RoPE'd) and values of rows x [..., hidden] that are already normed: [..., kv_heads * head_dim]."""
        a = self.self_attn
        return self.rope_keys(a.k_proj(x), cos, sin), a.v_proj(x)

    def rope_keys(self, k: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Projected keys [..., kv_heads * head_dim] RoPE'd at cos/sin [..., rot]."""
        a = self.self_attn
        lead = k.shape[:-1]
        k = apply_rope(
            k.reshape(-1, a.kv_heads, a.head_dim), cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
        )
        return k.reshape(*lead, -1)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, ext_k: Tensor, ext_v: Tensor, ext_mask: Tensor, own_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, S, hidden] at RoPE tables cos/sin [B, S, rot]; outside keys/values ext_k, ext_v [B, M, kv] visible
        where ext_mask [B, S, M]; the rows' own keys visible where own_mask [S, S] (or [B, S, S]).
        Returns (x after the layer, the rows' own keys, values [B, S, kv])."""
        a = self.self_attn
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        if self.qkv is not None and not torch.is_grad_enabled():
            kvd = a.kv_heads * a.head_dim
            q, k, v = _fused(h, self.qkv).split([a.heads * a.head_dim, kvd, kvd], dim=-1)
            k = self.rope_keys(k, cos, sin)
        else:
            q = a.q_proj(h)
            k, v = self.kv(h, cos, sin)
        q = apply_rope(q.reshape(b * s, a.heads, a.head_dim), cos.reshape(b * s, -1), sin.reshape(b * s, -1)).reshape(
            b, s, a.heads, a.head_dim
        )
        keys = torch.cat([ext_k, k], dim=1).reshape(b, -1, a.kv_heads, a.head_dim)
        values = torch.cat([ext_v, v], dim=1).reshape(b, -1, a.kv_heads, a.head_dim)
        mask = torch.cat([ext_mask, own_mask.expand(b, s, s)], dim=2)  # [B, S, M + S]
        out = attend(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), mask[:, None])
        x = x + a.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class DrafterNet(nn.Module):
    """What both drafter networks (dflash2's, mtp's) share once loaded for drafting."""

    @torch.no_grad()
    def prepare_drafting(self) -> None:
        """Every draft layer's fused projections (`DraftLayer.fuse`) and every linear's packed copy where the
        build reads that layout; the backends call it at load."""
        layers = [m for m in self.modules() if isinstance(m, DraftLayer)]
        for layer in layers:
            layer.fuse()
        inside = {id(m) for layer in layers for m in layer.modules()}  # fuse chose those layers' forms
        for module in self.modules():  # the other linears (mtp's input projection, dflash2's lookup), packed
            if isinstance(module, Linear) and id(module) not in inside and module.bias is None:
                w = for_drafting(module.weight)
                module.packed = w if isinstance(w, PackedWeight) else None

    def memory_bytes(self) -> int:
        """The parameters' bytes (the fused row-major weights are views of them) and any packed copies."""
        return sum(p.numel() * p.element_size() for p in self.parameters()) + packed_bytes(self)


def rope(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin [*positions.shape, head_dim] float32 (rotate-half convention, full rotary)."""
    cos, sin = rope_tables(positions.reshape(-1), head_dim, theta)
    return cos.reshape(*positions.shape, head_dim), sin.reshape(*positions.shape, head_dim)
