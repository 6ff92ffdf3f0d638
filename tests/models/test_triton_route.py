"""The layers' triton route, run on the CPU under the triton interpreter: a target pass whose fused row-wise ops
and Gated DeltaNet rows go through the triton kernels (as on CUDA) gives the twins' logits to float32 rounding, on
every family. What it checks is the model's plumbing into the kernels (offsets, heads, the cache layout, the
records); the kernels' own arithmetic is tests/kernels'."""

from __future__ import annotations

import pytest
import torch

from speclane.kernels import (
    decode_attention_triton,
    decode_linear,
    gated_delta,
    gated_delta_triton,
    rowwise,
    rowwise_triton,
)
from speclane.stages.models import attention, ops
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from tests.models.target_artifacts import artifacts, family, prompt  # noqa: F401  (fixtures)


def _interpreted() -> None:
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction

    for module in (rowwise_triton, gated_delta_triton, decode_linear, decode_attention_triton):
        kernels = [v for v in vars(module).values() if type(v).__name__ in ("JITFunction", "InterpretedFunction")]
        if not all(isinstance(k, InterpretedFunction) for k in kernels):
            pytest.skip("the kernels were imported before TRITON_INTERPRET=1 was set")


def _passes(target: Target) -> list:
    state = target.new_state(2, 64)
    dev = target.device
    batch = RowBatch.build([(0, 0, prompt(9, seed=1)), (1, 0, prompt(5, seed=2))], device=dev)
    outs = [target.forward(batch, state, record="last")]
    target.commit(state, batch, torch.tensor([9, 5], device=dev), outs[-1])
    batch = RowBatch.build([(0, 9, prompt(3, seed=3)), (1, 5, prompt(4, seed=4))], device=dev)  # verify-shaped
    outs.append(target.forward(batch, state))
    return outs


def test_a_pass_through_the_triton_kernels_gives_the_twins_logits(family, no_cpu_kernels, monkeypatch):
    _interpreted()
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    want = _passes(target)
    for module in (rowwise, gated_delta, ops, attention, decode_linear):
        monkeypatch.setattr(module, "use_triton", lambda t: True)
    ran = {}
    for module, fn in (
        (rowwise, "add_rms_norm_triton"),
        (rowwise, "silu_mul_triton"),
        (rowwise, "qk_rope_write_triton"),
        (gated_delta, "gated_delta_rows_triton"),
        (decode_linear, "decode_linear_triton"),
        (attention, "decode_attention_triton"),
    ):
        kernel = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, _k=kernel, _n=fn, **kw: ran.update({_n: True}) or _k(*a, **kw))
    got = _passes(target)
    hybrid = name != "llama"
    kernels = {"add_rms_norm_triton", "silu_mul_triton", "qk_rope_write_triton", "decode_linear_triton"}
    assert set(ran) == kernels | {"decode_attention_triton"} | ({"gated_delta_rows_triton"} if hybrid else set()), (
        name,
        ran,
    )
    for a, b in zip(want, got):
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4, msg=name)
        for ra, rb in zip(a.records, b.records):
            if ra is not None and hasattr(ra, "recurrent"):
                torch.testing.assert_close(rb.recurrent, ra.recurrent, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the kernels compiled for a GPU")
def test_on_a_gpu_a_pass_through_the_triton_kernels_gives_the_twins_logits(family, monkeypatch):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32, device="cuda")
    got = _passes(target)
    for module in (rowwise, gated_delta, ops, attention, decode_linear):
        monkeypatch.setattr(module, "use_triton", lambda t: False)
    want = _passes(target)
    for a, b in zip(want, got):
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4, msg=name)
