"""A whole dense decoder layer (ungated attention + SwiGLU MLP) in one C call, updating the residual in place.

Owns: `DenseLayer` (the layer's weights as the C side reads them, built once), `dense_layer` (the C call) and
`dense_layer_ref`, its torch twin made of the same per-op twins in the same order. The C layer is the per-op
route of kernels/rows.c called from C instead of Python: the same calls, the same roundings (each linear's and
each norm's output in x's dtype), so it equals that route bit for bit; what it saves is ~10 Python-level calls and
their tensor allocations a layer. Not here: which layers qualify (stages/models/target.py), gated attention,
Gated DeltaNet, MoE (they run op by op).
"""

from __future__ import annotations

import ctypes

import attrs
import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import check
from speclane.kernels.decode_attention import decode_attention_ref
from speclane.kernels.decode_linear import decode_linear_ref
from speclane.kernels.packed import PackedWeight
from speclane.kernels.quant import Int8Weight
from speclane.kernels.rowwise import add_rms_norm_ref, qk_rope_write_ref, silu_mul_ref

Tensor = torch.Tensor


class _Args(ctypes.Structure):  # mirrors `sl_layer` in kernels/cpu/rows.c
    _fields_ = (
        [(n, ctypes.c_int64) for n in ("hidden", "nh", "kvh", "hd", "rot", "inter")]
        + [("eps", ctypes.c_float), ("scale", ctypes.c_float)]
        + [
            (n, ctypes.c_void_p)
            for n in (
                "in_norm",
                "post_norm",
                "q_norm",
                "k_norm",
                "qkv_w",
                "qkv_b",
                "o_w",
                "o_b",
                "gu_w",
                "gu_b",
                "down_w",
                "down_b",
            )
        ]
        + [("wdt", ctypes.c_int64)]
        + [(n, ctypes.c_void_p) for n in ("qkv_s", "o_s", "gu_s", "down_s")]
    )


Weight = Tensor | Int8Weight | PackedWeight


def _data(t: Weight) -> Tensor:
    return t.q if isinstance(t, Int8Weight) else t.data if isinstance(t, PackedWeight) else t


def _ptr(t: Weight | None) -> int | None:
    return None if t is None else _data(t).data_ptr()


def _scale(t: Weight) -> int | None:
    scale = t.scale if isinstance(t, (Int8Weight, PackedWeight)) else None
    return None if scale is None else scale.data_ptr()


def _wcode(t: Weight) -> int:  # rows.c's weight codes: F32, BF16, I8, PACKED, PACKED_I8
    if isinstance(t, PackedWeight):
        return 3 if t.scale is None else 4
    return 2 if isinstance(t, Int8Weight) else int(t.dtype == torch.bfloat16)


def _weight(t: Weight, dtype: torch.dtype) -> Tensor:
    t = t.row_major() if isinstance(t, PackedWeight) else t
    return t.dequantize(dtype) if isinstance(t, Int8Weight) else t


@attrs.frozen
class DenseLayer:
    """One layer's tensors (kept alive here: the C struct holds their addresses) and its dims."""

    in_norm: Tensor  # [hidden] float32 scale
    post_norm: Tensor
    qkv: Weight  # [(nh + 2 kvh) hd, hidden]: rows q | k | v
    qkv_bias: Tensor | None
    o: Weight  # [hidden, nh hd]
    o_bias: Tensor | None
    gate_up: Weight  # [2 inter, hidden]
    gate_up_bias: Tensor | None
    down: Weight  # [hidden, inter]
    down_bias: Tensor | None
    q_norm: Tensor | None  # [hd] float32 scale
    k_norm: Tensor | None
    heads: tuple[int, int, int]  # (nh, kvh, hd)
    rot: int
    eps: float
    args: _Args = attrs.field(init=False, eq=False)

    def __attrs_post_init__(self):
        nh, kvh, hd = self.heads
        ws = (self.qkv, self.o, self.gate_up, self.down)
        check(
            all(
                _data(m).is_contiguous() and _wcode(m) == _wcode(ws[0]) and _data(m).dtype == _data(ws[0]).dtype
                for m in ws
            ),
            "DenseLayer: weights must be contiguous and of one form and dtype",
        )
        check(
            self.qkv.shape[0] == (nh + 2 * kvh) * hd and hd % 8 == 0 and hd <= 256 and self.rot <= hd,
            f"DenseLayer: qkv rows {self.qkv.shape[0]} do not fit heads {self.heads}",
        )
        args = _Args(
            hidden=self.qkv.shape[1],
            nh=nh,
            kvh=kvh,
            hd=hd,
            rot=self.rot,
            inter=self.down.shape[1],
            eps=self.eps,
            scale=hd**-0.5,
            in_norm=_ptr(self.in_norm),
            post_norm=_ptr(self.post_norm),
            q_norm=_ptr(self.q_norm),
            k_norm=_ptr(self.k_norm),
            qkv_w=_ptr(self.qkv),
            qkv_b=_ptr(self.qkv_bias),
            o_w=_ptr(self.o),
            o_b=_ptr(self.o_bias),
            gu_w=_ptr(self.gate_up),
            gu_b=_ptr(self.gate_up_bias),
            down_w=_ptr(self.down),
            down_b=_ptr(self.down_bias),
            wdt=_wcode(self.qkv),
            qkv_s=_scale(self.qkv),
            o_s=_scale(self.o),
            gu_s=_scale(self.gate_up),
            down_s=_scale(self.down),
        )
        object.__setattr__(self, "args", args)


def dense_layer(
    layer: DenseLayer,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    write_slot: Tensor,
    write_pos: Tensor,
    row_keys: Tensor,
) -> None:
    """x [rows, hidden] += the layer's attention, then its MLP, in place; writes the rows' keys and values."""
    lib = cpu_build.library()
    check(lib is not None, f"dense_layer: the CPU kernels are unavailable ({cpu_build.unavailable()})")
    code = 1 if x.dtype == torch.bfloat16 else 0
    rc = lib.sl_dense_layer(
        ctypes.byref(layer.args),
        x.data_ptr(),
        code,
        x.shape[0],
        cos.data_ptr(),
        sin.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        1 if k_cache.dtype == torch.bfloat16 else 0,
        k_cache.shape[2],
        write_slot.data_ptr(),
        write_pos.data_ptr(),
        row_keys.data_ptr(),
        torch.get_num_threads(),
    )
    check(rc == 0, f"dense_layer: the kernel failed (code {rc}: out of memory or a dimension past its limits)")


def dense_layer_ref(
    layer: DenseLayer,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    write_slot: Tensor,
    write_pos: Tensor,
    row_keys: Tensor,
) -> None:
    """The torch twin: the same steps through the per-op twins."""
    nh, kvh, hd = layer.heads
    h = add_rms_norm_ref(x, None, layer.in_norm, layer.eps)
    qkv = decode_linear_ref(h, _weight(layer.qkv, x.dtype), layer.qkv_bias)
    q = qk_rope_write_ref(
        qkv,
        (0, nh * hd, (nh + kvh) * hd),
        layer.heads,
        cos,
        sin,
        layer.q_norm,
        layer.k_norm,
        layer.eps,
        k_cache,
        v_cache,
        write_slot,
        write_pos,
    )
    att = decode_attention_ref(q, k_cache, v_cache, write_slot, row_keys, hd**-0.5, x.dtype)
    o = decode_linear_ref(att.reshape(x.shape[0], nh * hd), _weight(layer.o, x.dtype), layer.o_bias)
    h = add_rms_norm_ref(x, o, layer.post_norm, layer.eps)
    act = silu_mul_ref(decode_linear_ref(h, _weight(layer.gate_up, x.dtype), layer.gate_up_bias))
    add_rms_norm_ref(x, decode_linear_ref(act, _weight(layer.down, x.dtype), layer.down_bias), None, layer.eps)
