"""int8 weights (stages/models/quantize.py): which tensors change, and what it costs the default model's answers."""

from __future__ import annotations

import pytest
import torch

from speclane.kernels.packed import PackedWeight
from speclane.kernels.quant import Int8Weight
from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.quantize import quantize_weights
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target


@pytest.fixture(scope="module")
def pair(smollm_dir):
    torch.set_num_threads(1)
    return Target.load(smollm_dir), Target.load(smollm_dir, quant="int8")


def _int8(t) -> bool:  # an Int8Weight, or one packed for the AVX512-BF16 build (kernels/packed.py)
    return isinstance(t, Int8Weight) or (isinstance(t, PackedWeight) and t.scale is not None)


def test_linear_weights_and_head_are_int8_the_rest_is_not(pair):
    ref, q8 = pair
    lw = q8.weights.layers[0]
    assert all(_int8(t) for t in (lw.mixer.qkv, lw.mixer.o, lw.mlp.gate_up, lw.mlp.down))
    assert _int8(q8.weights.head) and q8.weights.head.shape == ref.weights.lm_head.shape
    assert q8.weights.lm_head.dtype == torch.bfloat16  # drafters read the head as it was
    assert torch.equal(q8.weights.embed, ref.weights.embed) and torch.equal(
        lw.input_norm, ref.weights.layers[0].input_norm
    )


def test_an_unknown_mode_is_refused_by_name(pair):
    with pytest.raises(ConfigError, match="unknown quantization 'int3'.*none, int8"):
        quantize_weights(pair[0].weights, "int3")


def test_int8_keeps_the_default_models_choices(pair):
    """Teacher-forced on text the bf16 model wrote, the int8 model picks the same next token at least 90 % of the
    time and gives that text a mean log-probability within 0.1 nats a token (measured: bench/quant.py)."""
    ref, q8 = pair
    ids = list(range(2000, 2040))
    state = ref.new_state(1, 100)
    out = ref.forward(RowBatch.build([(0, 0, ids)]), state, record="last", logits="last")
    toks = [int(out.logits[-1].argmax())]
    for i in range(31):
        b = RowBatch.build([(0, len(ids) + i, [toks[-1]])])
        o = ref.forward(b, state)
        ref.commit(state, b, torch.ones(1, dtype=torch.int64), o)
        toks.append(int(o.logits[-1].argmax()))
    seq = ids + toks
    lp = [
        t.forward(RowBatch.build([(0, 0, seq)]), t.new_state(1, 100), record="last", logits="all")
        .logits[len(ids) - 1 : -1]
        .log_softmax(-1)
        for t in (ref, q8)
    ]
    answer = torch.tensor(toks)[:, None]
    agree = (lp[1].argmax(-1) == answer[:, 0]).float().mean().item()
    gap = (lp[1].gather(1, answer) - lp[0].gather(1, answer)).mean().item()
    assert agree >= 0.9 and gap > -0.1, (agree, gap)


def test_quantizing_by_blocks_of_rows_equals_all_at_once(monkeypatch):
    """kernels/quant.py quantizes `QUANT_ROWS` rows at a time to bound its float32 temporaries; each row's scale
    and values are its own, so blocks of any size give the whole-weight result bit for bit."""
    from speclane.kernels import quant

    g = torch.Generator().manual_seed(0)
    w = torch.randn(1000, 96, generator=g).to(torch.bfloat16)
    w[7] = 0  # an all-zero row: scale 1, q 0
    wf = w.float()
    amax = wf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    whole = torch.round(wf / scale[:, None]).clamp(-127, 127).to(torch.int8)
    for rows in (1, 333, 1000, 4096):
        monkeypatch.setattr(quant, "QUANT_ROWS", rows)
        got = quant.quantize_int8(w)
        assert torch.equal(got.q, whole) and torch.equal(got.scale, scale) and got.q.is_contiguous()


def test_quantizing_leaves_the_weight_as_it_was():
    """A float32 weight's float32 view is the weight itself: quantizing must divide a copy, never the weight."""
    from speclane.kernels.quant import quantize_int8

    for dtype in (torch.float32, torch.bfloat16):
        w = torch.randn(70, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
        before = w.clone()
        quantize_int8(w)
        assert torch.equal(w, before)
