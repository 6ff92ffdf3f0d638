"""Our target's logits and greedy text equal transformers' on tiny random artifacts of each family (float32)."""

from __future__ import annotations

import torch
from target_artifacts import artifacts, decode_one, family, prefill, prompt  # noqa: F401  (fixtures)

from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

# float32 with other summation orders than transformers (fused q|k|v and gate|up matrices, 8-row padded GEMMs,
# the fixed-order conv, our chunked delta rule): differences of a few ulp per op, compounded over 3-5 layers.
# Measured here (70-token prompt): at most 1.2e-5 on logits of std 1.0-6.8; 2e-4 is ~17x that and still far below
# what a real defect gives (a wrong norm, gate, rotary or head layout moves logits by O(0.1) or more).
TOL = 2e-4


def test_logits_equal_transformers_in_one_prefill_pass(family):
    name, path, ref = family
    tokens = prompt(70, seed=1)  # 70 rows: past the 64-row decode route and two 64-row delta-rule chunks
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0]
    assert want.std() > 0.5, "logits must not be ~0, or the tolerance below proves nothing"
    target = Target.load(path, dtype=torch.float32)
    state = target.new_state(slots=2, max_len=96)
    out = target.forward(RowBatch.build([(1, 0, tokens)]), state, record="last")
    assert out.logits.dtype == torch.float32 and out.logits.shape == (70, want.shape[1])
    torch.testing.assert_close(out.logits, want, atol=TOL, rtol=0)


def test_logits_equal_transformers_on_the_decode_route(family):
    name, path, ref = family
    tokens = prompt(13, seed=2)
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0]
    target = Target.load(path, dtype=torch.float32)
    state = target.new_state(slots=1, max_len=32)
    got = [decode_one(target, state, [(0, i, t)])[0] for i, t in enumerate(tokens)]
    torch.testing.assert_close(torch.stack(got), want, atol=TOL, rtol=0)


def test_greedy_generation_equals_transformers_generate(family):
    name, path, ref = family
    tokens, new = prompt(11, seed=3), 24
    with torch.no_grad():
        want = ref.generate(
            torch.tensor([tokens]),
            attention_mask=torch.ones(1, 11, dtype=torch.long),
            max_new_tokens=new,
            do_sample=False,
            min_new_tokens=new,
            pad_token_id=0,
        )[0, 11:].tolist()
    target = Target.load(path, dtype=torch.float32)
    state = target.new_state(slots=3, max_len=64)
    logits = prefill(target, state, 2, tokens, chunks=[4, 7])
    got = [int(logits[-1].argmax())]
    while len(got) < new:
        got.append(int(decode_one(target, state, [(2, len(tokens) + len(got) - 1, got[-1])])[0].argmax()))
    assert got == want
