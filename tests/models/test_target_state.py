"""Prefill, verify passes and commits leave every slot exactly where plain one-token decoding would.

The state compared is everything a slot carries: keys and values up to its KV length (the caller's, as the lane's
is in a round), the conv window and the
recurrent matrix of every Gated DeltaNet layer (a bug peers shipped: the conv state must roll back too).
"""

from __future__ import annotations

import torch
from target_artifacts import artifacts, decode_one, family, prefill, prompt, slot_state  # noqa: F401  (fixtures)

from speclane.stages.models.decode import greedy_decode
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

TOL = 2e-4  # float32, chunked prefill vs one full pass: summation order only (see test_target_oracle.py)


def test_chunked_prefill_then_decode_equals_one_full_pass(family):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    tokens = prompt(47, seed=4)
    full = target.forward(RowBatch.build([(0, 0, tokens)]), target.new_state(slots=1, max_len=64), record="last")
    state = target.new_state(slots=2, max_len=64)
    got = []
    start = 0
    for n in (13, 9, 1, 17):  # uneven chunks; 17 > 8 takes the chunked delta rule
        batch = RowBatch.build([(1, start, tokens[start : start + n])])
        out = target.forward(batch, state, record="last")
        target.commit(state, batch, torch.tensor([n]), out)
        got.append(out.logits)
        start += n
    got += [decode_one(target, state, [(1, start + j, tokens[start + j])]) for j in range(len(tokens) - start)]
    torch.testing.assert_close(torch.cat(got), full.logits, atol=TOL, rtol=0)


def _assert_same_slot(a, sa: int, b, sb: int, n: int):
    for x, y in zip(slot_state(a, sa, n), slot_state(b, sb, n), strict=True):
        assert torch.equal(x, y)


def test_verify_rounds_then_commit_equal_plain_decoding(family):
    """Three lanes of different lengths and acceptances in each pass, then a slot freed and reused."""
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    prompts = {2: prompt(9, seed=5), 0: prompt(4, seed=6), 3: prompt(15, seed=7)}
    stream = {s: prompt(40, seed=10 + s) for s in prompts}  # the tokens each lane will run, drafts included
    spec, plain = target.new_state(slots=4, max_len=80), target.new_state(slots=4, max_len=80)
    for s, toks in prompts.items():
        for st in (spec, plain):
            prefill(target, st, s, toks, chunks=[3, len(toks) - 3])
    done = {s: 0 for s in prompts}  # tokens of `stream` committed so far per lane
    # Per round: (rows, committed) per lane in slot order 2, 0, 3. committed 0 leaves a lane untouched.
    rounds = [((4, 2), (1, 1), (6, 6)), ((3, 0), (5, 3), (2, 1)), ((8, 8), (2, 2), (1, 1)), ((1, 1), (7, 4), (4, 2))]
    for rnd in rounds:
        lanes = [(s, len(prompts[s]) + done[s], stream[s][done[s] : done[s] + r]) for s, (r, _) in zip((2, 0, 3), rnd)]
        batch = RowBatch.build(lanes)
        out = target.forward(batch, spec, record="rows")
        committed = torch.tensor([c for _, c in rnd])
        target.commit(spec, batch, committed, out)
        row = 0
        for s, (r, c) in zip((2, 0, 3), rnd):
            for j in range(r):
                if j < c:  # the plain baseline decodes only what was committed, one token a pass
                    want = decode_one(target, plain, [(s, len(prompts[s]) + done[s] + j, stream[s][done[s] + j])])
                    assert torch.equal(out.logits[row + j], want[0]), f"{name}: lane {s} row {j} differs"
            row += r
            done[s] += c
        for s in prompts:
            _assert_same_slot(spec, s, plain, s, len(prompts[s]) + done[s])

    # Free slot 0 and give it to a new lane in the spec state; the baseline decodes it in a fresh slot 1.
    spec.reset(0)
    fresh = prompt(6, seed=42)
    prefill(target, spec, 0, fresh, chunks=[6])
    prefill(target, plain, 1, fresh, chunks=[6])
    nxt = prompt(5, seed=43)
    batch = RowBatch.build([(0, 6, nxt), (3, len(prompts[3]) + done[3], stream[3][done[3] : done[3] + 2])])
    out = target.forward(batch, spec, record="rows")
    target.commit(spec, batch, torch.tensor([3, 2]), out)
    for j in range(3):
        decode_one(target, plain, [(1, 6 + j, nxt[j])])
    for j in range(2):
        decode_one(target, plain, [(3, len(prompts[3]) + done[3] + j, stream[3][done[3] + j])])
    _assert_same_slot(spec, 0, plain, 1, 9)
    _assert_same_slot(spec, 3, plain, 3, len(prompts[3]) + done[3] + 2)


def test_lanes_batched_generate_what_each_generates_alone(family):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    prompts = [prompt(n, seed=20 + n) for n in (5, 12, 3)]

    def generate(slots_prompts, state, steps=16):
        slots, prompts_ = zip(*slots_prompts)
        return dict(zip(slots, greedy_decode(target, prompts_, steps + 1, state=state, slots=slots)))

    together = generate(list(zip((3, 0, 1), prompts)), target.new_state(slots=4, max_len=48))
    for s, p in zip((3, 0, 1), prompts):
        assert generate([(2, p)], target.new_state(slots=4, max_len=48))[2] == together[s]
