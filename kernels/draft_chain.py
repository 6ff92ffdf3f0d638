"""An mtp proposal in one C call: every draft step's input fusion, layer, norm, int8-rows head and argmax.

Owns: `MtpChain` (the head's weights as `sl_mtp_chain` in kernels/cpu/rows.c reads them, built once) and
`mtp_chain` (the call). The C chain is the step loop of stages/drafters/mtp.py (`Mtp._draft_steps`, its twin) made
of the same C calls in the same order, so it gives the same drafts; what it saves is the loop's Python and its
dozen small tensors a step. It serves only the form that loop's fastest route takes: bf16 rows, the one-call layer
(`kernels/dense_layer.py`) and an int8-rows proposal head (`kernels/q8.py`). Not here: the window's addressing
(stages/models/draft_route.py), which heads and layers qualify (stages/drafters/mtp.py).
"""

from __future__ import annotations

import ctypes

import attrs
import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import check
from speclane.kernels.dense_layer import DenseLayer, _data, _ptr, _scale, _wcode
from speclane.kernels.packed import PackedWeight
from speclane.kernels.q8 import Q8Weight

Tensor = torch.Tensor


class _Args(ctypes.Structure):  # mirrors `sl_chain` in kernels/cpu/rows.c
    _fields_ = [
        ("layer", ctypes.c_void_p),
        ("fc_w", ctypes.c_void_p),
        ("fc_wdt", ctypes.c_int64),
        ("fc_s", ctypes.c_void_p),
        ("norm_emb", ctypes.c_void_p),
        ("norm_hid", ctypes.c_void_p),
        ("norm_out", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("embed", ctypes.c_void_p),
        ("head_w", ctypes.c_void_p),
        ("head_s", ctypes.c_void_p),
        ("head_rs", ctypes.c_void_p),
        ("head_n", ctypes.c_int64),
        ("head_ids", ctypes.c_void_p),
    ]


@attrs.frozen
class MtpChain:
    """The tensors the C chain reads (kept alive here: the struct holds their addresses)."""

    layer: DenseLayer
    fc: Tensor | PackedWeight  # [hidden, 2 hidden] bf16
    norms: tuple[Tensor, Tensor, Tensor]  # float32 scales [hidden]: embedding, hidden state, output
    eps: float
    embed: Tensor  # [vocab, hidden] bf16
    head: Q8Weight
    ids: Tensor | None  # [head rows] int64: the shortlist's vocabulary ids, None for the whole vocabulary
    args: _Args = attrs.field(init=False, eq=False)

    def __attrs_post_init__(self):
        check(
            _data(self.fc).dtype == torch.bfloat16 and self.embed.dtype == torch.bfloat16, "MtpChain: bf16 weights only"
        )
        args = _Args(
            layer=ctypes.addressof(self.layer.args),
            fc_w=_ptr(self.fc),
            fc_wdt=_wcode(self.fc),
            fc_s=_scale(self.fc),
            norm_emb=self.norms[0].data_ptr(),
            norm_hid=self.norms[1].data_ptr(),
            norm_out=self.norms[2].data_ptr(),
            eps=self.eps,
            embed=self.embed.data_ptr(),
            head_w=self.head.data.data_ptr(),
            head_s=self.head.scale.data_ptr(),
            head_rs=self.head.rowsum.data_ptr(),
            head_n=self.head.out,
            head_ids=None if self.ids is None else self.ids.data_ptr(),
        )
        object.__setattr__(self, "args", args)


def chain_serves() -> bool:
    """Whether this process has the C chain (the AVX512-BF16 build: its int8-rows head needs VPDPBUSD)."""
    return cpu_build.bf16_kernels()


def mtp_chain(
    chain: MtpChain,
    h: Tensor,
    anchors: Tensor,
    cos: Tensor,
    sin: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    slot: Tensor,
    base: Tensor,
    width: int,
    forced: Tensor | None = None,
) -> Tensor:
    """Drafts [lanes, width] int64 of lanes whose carried states are h [lanes, hidden] bf16 (left holding the last
    step's) and whose anchors are [lanes]; cos, sin [lanes, width, head_dim] float32; the window as the one-call
    layer reads it (k_cache, v_cache [slots * layers, heads, cap, head_dim]), each lane's window slot index and
    first free position `base`. `forced` [lanes, width] int64, where given: a token >= 0 is step d's draft and the
    next step's input in place of the head's own (prompt lookup's trusted tokens), -1 leaves the head's."""
    lib = cpu_build.library()
    check(lib is not None, f"mtp_chain: the CPU kernels are unavailable ({cpu_build.unavailable()})")
    lanes = h.shape[0]
    drafts = torch.empty(lanes, width, dtype=torch.int64)
    ints = [t.to(torch.int64).contiguous() for t in (anchors, slot, base)]
    forced = None if forced is None else forced.to(torch.int64).contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    rc = lib.sl_mtp_chain(
        ctypes.byref(chain.args),
        h.data_ptr(),
        1,
        lanes,
        width,
        ints[0].data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        1 if k_cache.dtype == torch.bfloat16 else 0,
        k_cache.shape[2],
        ints[1].data_ptr(),
        ints[2].data_ptr(),
        None if forced is None else forced.data_ptr(),
        drafts.data_ptr(),
        torch.get_num_threads(),
    )
    check(rc == 0, f"mtp_chain: the kernel failed (code {rc}: out of memory or a dimension past its limits)")
    return drafts


def mtp_project(chain: MtpChain, raw: Tensor, positions: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Keys, values [rows, kv] of the window rows raw [rows, 2, hidden] (trunk state | token embedding, as
    stages/drafters/mtp.py keeps them) at `positions` [rows], whose RoPE rows the tables cos, sin [n, rot] float32
    hold (every position below n): the fusion and the layer's key and value products of a chain step, one call."""
    lib = cpu_build.library()
    check(lib is not None, f"mtp_project: the CPU kernels are unavailable ({cpu_build.unavailable()})")
    raw, positions = raw.contiguous(), positions.to(torch.int64).contiguous()
    rows, kv = raw.shape[0], chain.layer.heads[1] * chain.layer.heads[2]
    k = torch.empty(rows, kv, dtype=raw.dtype)
    v = torch.empty_like(k)
    dt = 1 if raw.dtype == torch.bfloat16 else 0
    ptrs = (raw.data_ptr(), dt, rows, positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr())
    rc = lib.sl_mtp_project(ctypes.byref(chain.args), *ptrs, torch.get_num_threads())
    check(rc == 0, f"mtp_project: the kernel failed (code {rc}: out of memory or a dimension past its limits)")
    return k, v
