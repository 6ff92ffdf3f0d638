"""A drafter layer in one C call over the window in place (stages/models/draft_route.py) computes what the per-op
layer computes over the window read out: the same output rows, and the rows' own keys and values written right
after the slot's valid positions, for a window not yet full and one that has wrapped, a block of rows (dflash2) and
a chain of one-row steps (mtp)."""

from __future__ import annotations

import types

import pytest
import torch

from speclane.kernels import cpu_build
from speclane.stages.models.draft_layer import DraftLayer, rope
from speclane.stages.models.draft_route import WindowRoute, layer_form
from speclane.stages.models.drafter_window import Window

pytestmark = pytest.mark.skipif(cpu_build.library() is None, reason="the CPU kernels are unavailable here")

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, SIZE, LAYERS = 64, 4, 2, 16, 16, 2
KV = KV_HEADS * HEAD_DIM


def _layers(dtype):
    torch.manual_seed(0)
    layers = [DraftLayer(HIDDEN, HEADS, KV_HEADS, HEAD_DIM, 96, 1e-6).to(dtype) for _ in range(LAYERS)]
    with torch.no_grad():
        for layer in layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.uniform_(0.5, 1.5)
            layer.fuse()
    return layers


def _window(dtype, counts):
    """A window of two slots holding `counts` committed positions (random keys and values)."""
    w = Window(2, SIZE, LAYERS, KV, dtype, "cpu", heads=KV_HEADS, scratch=8)
    lanes = [types.SimpleNamespace(slot=i) for i in range(2)]
    w.claim(lanes)
    n = sum(counts)
    k, v = torch.randn(n, LAYERS, KV).to(dtype), torch.randn(n, LAYERS, KV).to(dtype)
    w.append(torch.tensor([0, 1]), k, v, tuple(counts), None)
    return w


def _reference(layers, w, slots, x, positions, own_mask):
    """The per-op layers over the window read out: (output rows, each layer's own keys and values)."""
    ext_k, ext_v, valid = w.read(slots, SIZE)
    b, s = x.shape[:2]
    cos, sin = rope(positions, HEAD_DIM, 10000.0)
    mask = valid[:, None].expand(b, s, valid.shape[1])
    own = []
    for i, layer in enumerate(layers):
        x, k, v = layer(x, cos, sin, ext_k[:, i], ext_v[:, i], mask, own_mask)
        own.append((k, v))
    return x, own


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("counts", [(5, 11), (20, 37)])  # a window not yet full; both wrapped
@torch.no_grad()
def test_a_block_of_rows_in_one_call_per_layer_matches_the_per_op_layers(dtype, counts):
    layers = _layers(dtype)
    forms = [layer_form(layer) for layer in layers]
    assert all(f is not None for f in forms)
    w = _window(dtype, counts)
    slots, s = torch.tensor([1, 0]), 6
    x = torch.randn(2, s, HIDDEN).to(dtype)
    positions = torch.tensor(counts)[slots][:, None] + torch.arange(s)
    want, own = _reference(layers, w, slots, x.clone(), positions, torch.ones(s, s, dtype=torch.bool))
    assert WindowRoute.serves(w, 2, s, 1, forms[0])
    route = WindowRoute(w, slots, s)
    cos, sin = (t.reshape(2 * s, -1).contiguous() for t in rope(positions, HEAD_DIM, 10000.0))
    got = x.reshape(2 * s, HIDDEN).contiguous()
    for i, form in enumerate(forms):
        route.run(form, i, got, cos, sin)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.05}
    torch.testing.assert_close(got.view(2, s, HIDDEN).float(), want.float(), **tol)
    base = w.draft_base(slots)
    for i, (k, v) in enumerate(own):  # the rows' own keys and values, right after each slot's valid positions
        for lane, slot in enumerate(slots.tolist()):
            at = torch.arange(int(base[lane]), int(base[lane]) + s)
            held_k = w.k[slot, i, :, at].transpose(0, 1).reshape(s, KV)
            held_v = w.v[slot, i, :, at].transpose(0, 1).reshape(s, KV)
            torch.testing.assert_close(held_k.float(), k[lane].float(), **tol)
            torch.testing.assert_close(held_v.float(), v[lane].float(), **tol)
    assert int(w.count[0]) == counts[0] and int(w.count[1]) == counts[1]  # drafting commits nothing


@torch.no_grad()
def test_a_chain_of_one_row_steps_sees_the_steps_before_it():
    dtype = torch.float32
    layer = _layers(dtype)[0]
    form = layer_form(layer)
    counts = (9, 30)
    w = _window(dtype, counts)
    slots, steps = torch.tensor([0, 1]), 4
    route = WindowRoute(w, slots, 1)
    xs = torch.randn(steps, 2, HIDDEN)
    ext_k, ext_v, valid = w.read(slots, SIZE)
    keys, values, mask = ext_k[:, 0], ext_v[:, 0], valid
    one = torch.ones(1, 1, dtype=torch.bool)
    for d in range(steps):
        positions = torch.tensor(counts)[:, None] + d
        cos, sin = rope(positions, HEAD_DIM, 10000.0)
        want, k, v = layer(xs[d][:, None], cos, sin, keys, values, mask[:, None], one)
        keys, values = torch.cat([keys, k], 1), torch.cat([values, v], 1)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.bool)], 1)
        got = xs[d].clone().contiguous()
        route.run(form, 0, got, cos[:, 0].contiguous(), sin[:, 0].contiguous(), step=d)
        torch.testing.assert_close(got, want[:, 0], rtol=1e-4, atol=1e-4)


def test_a_proposal_past_the_scratch_takes_the_per_op_route():
    w = Window(1, SIZE, 1, KV, torch.float32, "cpu", heads=KV_HEADS, scratch=8)
    form = layer_form(_layers(torch.float32)[0])
    assert WindowRoute.serves(w, 1, 1, 8, form) and not WindowRoute.serves(w, 1, 1, 9, form)
    assert not WindowRoute.serves(w, 1, 9, 1, form) and not WindowRoute.serves(w, 1, 1, 1, None)
