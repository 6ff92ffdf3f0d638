"""Teacher-forced fitting data: the labels are the target's own greedy choices, and a draft counts only while the
text agreed with them (pipeline/fit_data.forced, pipeline/fit_losses._chain_labels)."""

from __future__ import annotations

import torch

from speclane.stages.fitting import data as fit_data
from speclane.stages.fitting import losses as fit_losses
from speclane.stages.models import drafter_weights as dw
from tests.models.target_artifacts import prompt


def test_chain_labels_stop_counting_after_the_text_leaves_the_target():
    # rows 0..5; the target's choice after row t is next[t]; the text agrees at rows 0, 1, 3, 4 but not 2
    tokens = torch.tensor([10, 11, 12, 99, 14, 15, 16], dtype=torch.int32)
    nxt = torch.tensor([11, 12, 13, 14, 15, 16], dtype=torch.int32)
    labels, valid = fit_losses._chain_labels({"tokens": tokens, "next": nxt}, torch.tensor([0, 3]), 4)
    assert labels.tolist() == [[11, 12, 13, 14], [14, 15, 16, 16]]
    # anchor 0: drafts 1-3 follow agreeing text; draft 4 would follow row 3, reached only through the text's 99
    # where the target said 13, so it does not count. Anchor 3: rows 3, 4, 5 exist, row 6 does not.
    assert valid.tolist() == [[True, True, True, False], [True, True, True, False]]


def test_generated_answers_keep_their_old_labels():
    tokens = torch.arange(20, 30, dtype=torch.int32)
    labels, valid = fit_losses._chain_labels({"tokens": tokens}, torch.tensor([2, 7]), 3)
    assert labels.tolist() == [[23, 24, 25], [28, 29, 29]] and valid.tolist() == [[True] * 3, [True, True, False]]


def test_forced_pass_labels_are_the_greedy_answer(tiny):
    """Teacher-forcing the target's own greedy answer: every `next` equals the token the answer has there, and the
    taps are the ones the greedy run recorded."""
    taps = tiny.hidden_taps
    tiny.hidden_taps = dw.fit_taps(tiny.cfg)
    try:
        prompts = [prompt(8 + i, seed=900 + i) for i in range(3)]
        greedy = fit_data.generate(tiny, prompts, 12, set(), lanes=3)
        seqs = fit_data.forced(
            tiny, [("code", p, g["tokens"].tolist()) for p, g in zip(prompts, greedy)], chunk_rows=40
        )
    finally:
        tiny.hidden_taps = taps
    for p, g, q in zip(prompts, greedy, seqs):
        assert q["start"] == len(p) and q["next"].shape[0] == len(q["tokens"]) - 1
        assert torch.equal(q["next"][len(p) - 1 :], g["tokens"][len(p) :])
        torch.testing.assert_close(q["taps"].float(), g["taps"].float(), atol=0.05, rtol=0.05)


def test_make_forced_mixes_styles_and_keeps_the_split():
    code = "\n".join(f"def f{i}(x):\n    y = x + {i}\n    return y * {i}  # a line long enough" for i in range(40))
    prose = "\n\n".join(f"Paragraph {i} " + "words " * 40 for i in range(6))
    docs = [("code", f"c{i}.py", code) for i in range(30)] + [("prose", f"p{i}.txt", prose) for i in range(30)]
    items = fit_data.make_forced(docs, 20, 0, heldout=False)
    assert len(items) == 20 and sum(k == "prose" for k, _, _ in items) == 4
    rewrites = [(ask, ans) for k, ask, ans in items if k == "code" and not ask.startswith("Continue")]
    assert len(rewrites) == 8 and all(ans.strip("`\npython") in ask for ask, ans in rewrites)  # answer = the chunk
    held = {name for _, name, _ in docs if fit_data.held_out(name)}
    assert held and len(held) < len(docs)
    texts = fit_data.make_forced([d for d in docs if d[1] in held], 4, 0, heldout=False)
    assert texts == []  # only held-out documents: nothing to fit on


def test_write_asks_are_the_benchs_code_generation_ask_from_train_documents_only():
    doc = '"""' + "Return the sum of a and b, checked. " * 6 + '"""'
    code = "\n\n".join(
        f"def add{i}(a, b=2):\n    {doc}\n    return a + b\n\ndef _hidden{i}(x):\n    {doc}\n"
        f'    return x\n\ndef short{i}(x):\n    """Too short."""\n    return x'
        for i in range(3)
    )
    docs = [("code", f"c{i}.py", code) for i in range(40)] + [("prose", "p.txt", "words " * 200)]
    held = {name for _, name, _ in docs if fit_data.held_out(name)}
    asks = fit_data.make_write_prompts(docs, 10_000, 0, heldout=False)
    assert len(asks) == 3 * sum(1 for k, n, _ in docs if k == "code" and n not in held) and held
    assert all(kind == "code" and ask.startswith("Write a Python function `def add") for kind, ask in asks)
    first = asks[0][1]
    assert first.endswith("\n\nGive only the code.") and "`def add" in first and "(a, b=2):`." in first
    # the bench's own code-generation ask, word for word (bench/workloads.py)
    from speclane.bench import workloads

    bench_ask = next(p["user"] for p in workloads.load() if p["workload"] == "code_gen")
    assert bench_ask.split("`")[0] == first.split("`")[0] and bench_ask.endswith("\n\nGive only the code.")
    assert fit_data.make_write_prompts(docs, 5, 0, heldout=False) == asks[:5]  # seeded, a prefix
    assert len(fit_data.make_write_prompts(docs, 10_000, 0, heldout=True)) == 3 * sum(n in held for _, n, _ in docs)
