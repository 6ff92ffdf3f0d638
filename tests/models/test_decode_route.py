"""The decode route: up to 8 rows in a pass, each row's logits are bit-identical to the same row decoded alone,
whatever the row count, the row's index and the other lanes in the pass, in bfloat16 and float32."""

from __future__ import annotations

import pytest
import torch
from target_artifacts import artifacts, decode_one, family, prefill, prompt  # noqa: F401  (fixtures)

from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

# (slot, prompt length, rows this pass) per lane; every pass has at most 8 rows in all.
PASSES = [
    [(1, 7, 1)],
    [(1, 7, 8)],
    [(0, 3, 2), (1, 7, 5), (2, 12, 1)],
    [(2, 12, 1), (0, 3, 1), (1, 7, 1), (3, 65, 1)],  # lane 3 sits past the first 64-key block
    [(3, 65, 4), (1, 7, 4)],
]


@pytest.fixture(params=["c", "torch"])
def route(request):
    """The C kernels (kernels/cpu/rows.c), or the torch twins a machine without a compiler runs."""
    if request.param == "torch":
        request.getfixturevalue("no_cpu_kernels")
    return request.param


@pytest.mark.parametrize(
    "dtype,quant",
    [(torch.float32, "none"), (torch.bfloat16, "none"), (torch.bfloat16, "int8")],
    ids=["fp32", "bf16", "bf16-int8"],
)
def test_rows_are_bit_identical_to_one_row_decode(family, dtype, quant, route):
    name, path, _ = family
    target = Target.load(path, dtype=dtype, quant=quant)
    prompts = {s: prompt(n, seed=30 + s) for s, n in ((0, 3), (1, 7), (2, 12), (3, 65))}
    for lanes in PASSES:
        spec, alone = target.new_state(slots=4, max_len=80), target.new_state(slots=4, max_len=80)
        for s, _, _ in lanes:
            for st in (spec, alone):
                prefill(target, st, s, prompts[s])
        rows = {s: prompt(r, seed=50 + s) for s, _, r in lanes}
        out = target.forward(RowBatch.build([(s, n, rows[s]) for s, n, _ in lanes]), spec, record="rows")
        row = 0
        for s, n, r in lanes:
            for j in range(r):
                want = decode_one(target, alone, [(s, n + j, rows[s][j])])[0]
                assert torch.equal(out.logits[row], want), f"{name} {dtype}: lane {s} row {j} of {lanes}"
                row += 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_call_layers_equal_the_op_by_op_route(artifacts, dtype):
    """kernels/dense_layer.py runs a llama layer as one C call made of the per-op kernels: bit-identical to them."""
    path = artifacts["llama"][0]
    fused, plain = Target.load(path, dtype=dtype), Target.load(path, dtype=dtype)
    if all(d is None for d in fused._dense):
        pytest.skip("no C kernels on this machine")
    plain._dense = (None,) * len(plain._dense)
    toks, seen = prompt(12, seed=9), []
    for target in (fused, plain):
        state = target.new_state(slots=2, max_len=40)
        prefill(target, state, 1, toks[:7])
        out = target.forward(RowBatch.build([(1, 7, toks[7:12]), (0, 0, toks[:3])]), state, record="rows")
        seen.append([out.logits, out.hidden] + [c.k[:, :, :12] for c in state.layers])
    assert all(torch.equal(a, b) for a, b in zip(*seen))


def test_bf16_weights_are_packed_where_the_build_reads_them(artifacts):
    """On the AVX512-BF16 build a bf16 target's one-call layers and output head take the packed layout
    (kernels/packed.py); its passes agree with the row-major layout's to float32 rounding."""
    from speclane.kernels import cpu_build
    from speclane.kernels.packed import PackedWeight

    path = artifacts["llama"][0]
    packed, rowmajor = Target.load(path, dtype=torch.bfloat16), Target.load(path, dtype=torch.bfloat16, pack=False)
    lw = packed.weights.layers[0]
    kinds = {type(t) for t in (lw.mixer.qkv, lw.mixer.o, lw.mlp.gate_up, lw.mlp.down, packed.weights.head)}
    assert kinds == ({PackedWeight} if cpu_build.bf16_kernels() else {torch.Tensor, type(None)})
    assert isinstance(rowmajor.weights.layers[0].mixer.qkv, torch.Tensor) and rowmajor.weights.head is None
    toks, logits = prompt(12, seed=9), []
    for target in (packed, rowmajor):
        state = target.new_state(slots=1, max_len=40)
        logits.append(target.forward(RowBatch.build([(0, 0, toks)]), state, record="rows").logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=0.05, atol=0.05)  # bf16 activations, 2 summation orders
