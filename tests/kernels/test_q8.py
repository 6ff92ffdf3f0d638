"""int8 rows times int8 weights for proposal heads (kernels/q8.py): the C kernel equals its torch twin bit for bit
at every row count and shape edge, a row's logits do not depend on the rows beside it, the packing round-trips,
and the argmax agrees with the bf16-rows route on a head with a clear winner."""

from __future__ import annotations

import pytest
import torch

from speclane.kernels import cpu_build
from speclane.kernels.packed import pack, packed_linear, packs
from speclane.kernels.q8 import pack_q8, q8_linear, q8_linear_ref, q8_serves
from speclane.kernels.quant import quantize_int8


@pytest.mark.parametrize("out, inner", [(100, 64), (33, 576), (1000, 12)])
def test_the_kernel_equals_its_twin_at_every_row_count(out, inner):
    torch.manual_seed(0)
    w = quantize_int8(torch.randn(out, inner))
    packed = pack_q8(w)
    assert torch.equal(packed.unpack(), w.q)
    assert torch.equal(packed.rowsum, w.q.sum(1, dtype=torch.int32))
    x = torch.randn(11, inner).bfloat16()
    x[3] = 0  # an all-zero row: scale 0, logits 0
    whole = q8_linear(x, packed)
    assert torch.equal(whole, q8_linear_ref(x, packed))
    assert torch.equal(whole[3], torch.zeros(out))
    for rows in (1, 2, 7, 8, 9):
        assert torch.equal(q8_linear(x[:rows], packed), whole[:rows])  # a row alone or among others: the same


def test_the_argmax_agrees_with_bf16_rows_times_the_same_int8_weights():
    torch.manual_seed(1)
    w = quantize_int8(torch.randn(4096, 256))
    x = torch.randn(16, 256).bfloat16()
    target = torch.randint(0, 4096, (16,))
    w.q[target] = (x.float() * 127 / x.float().abs().amax(1, keepdim=True)).round().to(torch.int8)  # clear winners
    head = pack(w) if packs(w) else w
    want = packed_linear(x, head, out_dtype=torch.float32).argmax(1) if packs(w) else target
    assert torch.equal(q8_linear(x, pack_q8(w)).argmax(1), want)
    assert torch.equal(want, target)


def test_it_serves_only_the_avx512_build_and_in_multiple_of_four():
    w = quantize_int8(torch.randn(8, 64))
    assert q8_serves(w) == (cpu_build.bf16_kernels())
    assert not q8_serves(quantize_int8(torch.randn(8, 66)))
