"""The shared head of a chat prompt (pipeline/runtime/keeper.py `Keeper.head`) on the default model's own ChatML
template: it ends where the first user turn's text begins, whether the system prompt is the request's or the
template's default one, so every conversation with that system prompt can start from one checkpoint."""

import types

import pytest

from speclane.pipeline.runtime.keeper import Keeper, SlotHandles
from speclane.stages.models.chat import ChatTemplate


@pytest.fixture
def keeper(smollm_tokenizer):
    chat = ChatTemplate.from_tokenizer(smollm_tokenizer)
    engine = types.SimpleNamespace(apply_chat=lambda ms: smollm_tokenizer.encode(chat.render(ms)))
    handles = SlotHandles(target=types.SimpleNamespace(device="cpu"), state=None)
    return Keeper(handles, engine.apply_chat, budget_bytes=1 << 20, every=0), engine


@pytest.mark.parametrize("system", [None, "You are a careful reviewer of Python code. Answer with a diff."])
def test_the_head_ends_where_the_user_turn_begins(keeper, smollm_tokenizer, system):
    keeper, engine = keeper
    lead = [{"role": "system", "content": system}] if system else []
    heads = set()
    for user in ("Fix the bug in this loop.", "Hello", "\nwhy?"):
        ids = engine.apply_chat(lead + [{"role": "user", "content": user}])
        head = keeper.head(ids, lead + [{"role": "user", "content": user}])
        text = smollm_tokenizer.decode(ids[:head])
        assert text.endswith("<|im_start|>user\n") or text.endswith("<|im_start|>user"), text[-40:]
        assert (system or "SmolLM") in text and user.strip() not in text
        heads.add(tuple(ids[:head]))
    assert len(heads) == 1  # one head for every user message
    assert keeper.marks(ids, lead + [{"role": "user", "content": "\nwhy?"}]) == (len(next(iter(heads))),)
