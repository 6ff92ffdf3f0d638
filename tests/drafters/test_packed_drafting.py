"""Drafting reads packed copies of a drafter's linears where the C kernels read that layout (kernels/packed.py):
the layer's output is the same product to bf16 rounding, the state dict keeps the Hugging Face names and nothing
else, and the memory count includes the copies."""

from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels.packed import PackedWeight
from speclane.stages.models.draft_layer import DrafterNet, DraftLayer, Linear


class _Net(DrafterNet):
    def __init__(self):
        super().__init__()
        self.layer = DraftLayer(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, eps=1e-6)
        self.fc = Linear(128, 64, bias=False)  # as mtp's input projection


def _run(layer, x):
    b, s, _ = x.shape
    cos, sin = torch.ones(b, s, 16), torch.zeros(b, s, 16)
    ext_k = ext_v = torch.zeros(b, 0, 32, dtype=x.dtype)
    return layer(x, cos, sin, ext_k, ext_v, torch.zeros(b, s, 0, dtype=torch.bool), torch.ones(s, s).tril().bool())[0]


@torch.no_grad()
def test_fused_drafting_layer_is_packed_and_computes_the_same():
    torch.manual_seed(0)
    net = _Net().to(torch.bfloat16)
    keys = set(net.state_dict())
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    x = torch.randn(1, 5, 64).bfloat16()
    before = _run(net.layer, x)
    net.prepare_drafting()
    after = _run(net.layer, x)
    torch.testing.assert_close(after.float(), before.float(), rtol=0.02, atol=0.02)  # bf16 outputs, two sum orders
    assert set(net.state_dict()) == keys
    packed = cpu_build.bf16_kernels()
    m, a = net.layer.mlp, net.layer.self_attn
    assert isinstance(net.layer.qkv, PackedWeight) == packed and isinstance(m.gate_up, PackedWeight) == packed
    assert (a.o_proj.packed is not None) == packed and (m.down_proj.packed is not None) == packed
    assert (net.fc.packed is not None) == packed and a.q_proj.packed is None  # q drafts through the fused qkv
    y = torch.randn(3, 128).bfloat16()
    torch.testing.assert_close(
        net.fc(y).float(), torch.nn.functional.linear(y, net.fc.weight).float(), rtol=0.02, atol=0.02
    )
    assert (net.memory_bytes() > params) == packed
