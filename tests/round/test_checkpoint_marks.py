"""Where a prefill stops for a checkpoint (pipeline/runtime/keeper.py `marks`): at the end of a chat's shared head, so
a second conversation with the same system prompt prefills only what follows it and decodes as a fresh prefill
does (greedy tokens with speculation on and off, on the three target families, float32; and the state after the
prefill), and at exact multiples of the interval, even for a prompt restored from a checkpoint that is not."""

import pytest
import torch

from speclane.pipeline.runtime.checkpoints import CheckpointStore
from speclane.pipeline.runtime.keeper import common_prefix
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.models.checkpoint import snapshot_slot
from tests.models.target_artifacts import FAMILIES, VOCAB
from tests.round.conftest import IdTokenizer, engine, prompt, requests

# One token a character; roles and turns marked the way ChatML marks them, so the head is `[system]...\n[user]`.
TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
SYSTEM = "You answer in one line. Be brief, be right, be kind."


class ChatIdTokenizer(IdTokenizer):
    chat_template, bos_token, eos_token = TEMPLATE, None, None

    def encode(self, text, add_special=False):
        return [4 + ord(c) % (VOCAB - 4) for c in text]


def _chat_engine(target, backend, budget=64 << 20):
    eng = engine(target, backend=backend, k=3, max_lanes=2)
    eng.tokenizer = eng.chat_tokens.tokenizer = ChatIdTokenizer()
    eng.checkpoints = CheckpointStore(budget) if budget else None
    return eng


def _chat(user, max_tokens=12):
    return parse_request(
        {
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
    )


def _run(eng, req):
    """Submit `req` and step until it is done: its lane (tokens, prompt, what it reused)."""
    lane = eng.submit(req)
    while eng.busy():
        eng.step()
    return lane


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("backend", ["none", "ngram"])
def test_a_shared_system_prompt_is_prefilled_once_and_decodes_as_a_fresh_prefill(targets, name, backend):
    eng, fresh = _chat_engine(targets[name], backend), _chat_engine(targets[name], backend, budget=0)
    first = _run(eng, _chat("Name a prime number."))
    head = len(ChatIdTokenizer().encode(f"[system]{SYSTEM}\n[user]"))
    assert tuple(first.prompt_ids[:head]) in eng.checkpoints._entries  # the head was kept on the way
    for user in ("What is two and two?", "Why is the sea salty, in short?"):
        before = (eng.checkpoints.hits, eng.checkpoints.tokens_reused)
        got = _run(eng, _chat(user))
        assert got.prefix_reused == head
        assert (eng.checkpoints.hits, eng.checkpoints.tokens_reused) == (before[0] + 1, before[1] + head)
        assert got.out_ids == _run(fresh, _chat(user)).out_ids, (name, backend, user)
    # the state after the prefill: restored from the head against a whole prefill
    states = []
    for e in (eng, fresh):
        lane = e.submit(_chat("Say something new."))
        while lane.kv_len < len(lane.prompt_ids):
            e.step()
        states.append((lane.prefix_reused, snapshot_slot(e.state, lane.slot, lane.kv_len)))
    (reused, restored), (none, whole) = states
    assert reused == head and none == 0
    # float32 rounding only: the whole prefill reads the head in the same pass as the rest, the restored one computed
    # it in a pass of its own, and the difference grows through the layers (qwen3_5_text's last attention layer: 1.2e-4
    # at one position against entries up to 3.2; a wrong restore is off by the entries' own size)
    for (a, b), (c, d) in zip(restored.layers, whole.layers):
        for x, y in ((a, c), (b, d)):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-4 * float(y.abs().max()))


def test_interval_checkpoints_land_on_multiples_after_a_restore_that_does_not(targets):
    eng = engine(targets["qwen3_5_text"], backend="none", max_lanes=1)
    eng.checkpoints = CheckpointStore(64 << 20)
    eng.keeper.every = 32
    first = prompt(45, seed=71)
    eng.generate(requests([first], max_tokens=4))
    assert {len(t) for t in eng.checkpoints._entries} >= {32, 45}
    follow = first + prompt(40, seed=72)  # restored at 45, or at the answer's end past it
    lane = _run(eng, requests([follow], max_tokens=4)[0])
    assert lane.prefix_reused >= 45 and lane.checkpoint_at == (32, 64)
    assert tuple(follow[:64]) in eng.checkpoints._entries  # at 64 itself, not where a 512-row chunk ended


def test_no_marks_without_checkpoints_or_a_head_too_short_to_keep(targets):
    eng = _chat_engine(targets["llama"], "none")
    ids = eng.prompt_ids(_chat("hi"))
    assert eng.keeper.marks(ids, _chat("hi").conversation()) == (len(f"[system]{SYSTEM}\n[user]"),)
    assert eng.keeper.marks(ids, [{"role": "user", "content": "hi"}]) == ()  # head "[user]": 6 tokens
    assert eng.keeper.marks(ids, None) == ()  # token ids: no template
    eng.checkpoints = None
    assert eng.keeper.marks(ids, _chat("hi").conversation()) == ()
    assert common_prefix([1, 2, 3], [1, 2, 4], [1, 2]) == 2 and common_prefix([], [1]) == 0


@pytest.mark.parametrize("name", ["llama", "qwen3_5_text"])
def test_lanes_admitted_together_take_the_head_the_first_one_kept(targets, name):
    """Two agents with one system prompt start at once: lanes prefill one at a time, so the second asks again before
    its prefill starts and begins at the head the first has just kept (one miss turned into a hit, not two misses)."""
    eng, fresh = _chat_engine(targets[name], "ngram"), _chat_engine(targets[name], "ngram", budget=0)
    users = ("Name a prime number.", "What is two and two?")
    lanes = [eng.submit(_chat(u)) for u in users]
    while eng.busy():
        eng.step()
    head = len(ChatIdTokenizer().encode(f"[system]{SYSTEM}\n[user]"))
    assert [lane.prefix_reused for lane in lanes] == [0, head]
    stats = eng.checkpoints.stats()
    assert (stats["hits"], stats["misses"], stats["tokens_reused"]) == (1, 1, head)
    assert [lane.out_ids for lane in lanes] == [_run(fresh, _chat(u)).out_ids for u in users]
