"""Checks shared by the tests that hold a target against transformers (the oracle) on a tiny random artifact: each
loads the artifact as a float32 `Target` and compares its logits or greedy tokens with the transformers model's."""

from __future__ import annotations

import torch
from target_artifacts import decode_one, prefill

from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target


def reference_logits(model, tokens: list[int]) -> torch.Tensor:
    """transformers' logits of every position of `tokens` in one forward: [len(tokens), vocab]."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def hf_generate(model, tokens: list[int], new: int) -> list[int]:
    """transformers' `generate`, greedy, exactly `new` tokens after `tokens`."""
    with torch.no_grad():
        return model.generate(
            torch.tensor([tokens]),
            attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )[0, len(tokens) :].tolist()


def assert_one_pass_matches(path, model, tokens: list[int], max_len: int, tol: float) -> Target:
    """`tokens` in one pass into slot 1 (logits of every row) equal transformers' logits within `tol`; returns
    the loaded target."""
    want = reference_logits(model, tokens)
    assert want.std() > 0.5, "logits must not be ~0, or the tolerance proves nothing"
    target = Target.load(path, dtype=torch.float32)
    out = target.forward(RowBatch.build([(1, 0, tokens)]), target.new_state(slots=2, max_len=max_len), record="last")
    assert out.logits.dtype == torch.float32 and out.logits.shape == (len(tokens), want.shape[1])
    torch.testing.assert_close(out.logits, want, atol=tol, rtol=0)
    return target


def assert_decode_route_matches(path, model, tokens: list[int], tol: float) -> None:
    """`tokens` one row a pass into slot 0 (the decode route) give transformers' logits at every position."""
    want = reference_logits(model, tokens)
    target = Target.load(path, dtype=torch.float32)
    state = target.new_state(slots=1, max_len=32)
    got = [decode_one(target, state, [(0, i, t)])[0] for i, t in enumerate(tokens)]
    torch.testing.assert_close(torch.stack(got), want, atol=tol, rtol=0)


def greedy_tokens(path, tokens: list[int], new: int, max_len: int) -> list[int]:
    """Our greedy continuation, `new` tokens: the prompt prefilled into slot 2 in two chunks (4 rows, then the
    rest), then one row a pass."""
    target = Target.load(path, dtype=torch.float32)
    state = target.new_state(slots=3, max_len=max_len)
    logits = prefill(target, state, 2, tokens, chunks=[4, len(tokens) - 4])
    got = [int(logits[-1].argmax())]
    while len(got) < new:
        got.append(int(decode_one(target, state, [(2, len(tokens) + len(got) - 1, got[-1])])[0].argmax()))
    return got
