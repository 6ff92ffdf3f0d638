"""Request intake: a GenerateRequest checked and tokenized into a Lane, ready for the engine's queue.

Owns what a request is refused for before it costs the engine anything (top_k past the vocabulary, token ids
outside it, an empty prompt, a prompt or prompt + max_tokens past the engine's max length), how its prompt
becomes token ids (messages through the chat template, given ids, or the prompt text), and the lane it becomes
(draft tokens, seed, stop ids, detokenizer, checkpoint marks). It reads the engine and changes nothing in it, so a
server may run it on a worker thread. `ChatTokens` renders a conversation into token ids (the engine's and the
checkpoint keeper's renderer). Not here: the queue and its bound, admission into slots, the round loop
(engine.py); the request's own schema and field checks (request.py).
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any

from speclane.pipeline.runtime.request import GenerateRequest
from speclane.stages.contract.errors import RequestError
from speclane.stages.contract.events import DoneEvent
from speclane.stages.contract.lanes import Lane
from speclane.stages.models.chat import ChatTemplate


class ChatTokens:
    """A conversation as token ids: rendered through the tokenizer's chat template (read at the first use, so a
    tokenizer without one is refused by the first chat request, not at start) and encoded."""

    def __init__(self, tokenizer):
        self.tokenizer, self._template = tokenizer, None

    def __call__(self, messages: list[dict[str, str]]) -> list[int]:
        if self._template is None:
            self._template = ChatTemplate.from_tokenizer(self.tokenizer)
        return self.tokenizer.encode(self._template.render(messages))


def prompt_ids(engine, req: GenerateRequest, chat: bool = False) -> list[int]:
    """The request's prompt as token ids: its conversation through the chat template, its ids (checked against the
    vocabulary), or its prompt text."""
    messages = req.conversation(chat)
    if messages is not None:
        return engine.apply_chat(messages)
    if req.prompt_ids is not None:
        vocab = engine.target.config.vocab_size
        bad = [i for i, t in enumerate(req.prompt_ids) if not 0 <= t < vocab]
        if bad:
            raise RequestError(
                f"prompt_ids[{bad[0]}] = {req.prompt_ids[bad[0]]} is outside the vocabulary [0, {vocab})",
                field=f"prompt_ids.{bad[0]}",
            )
        return list(req.prompt_ids)
    return engine.tokenizer.encode(req.prompt, add_special=True)


def prepare(engine, req: GenerateRequest, chat: bool = False) -> Lane:
    """Tokenize and validate a request into a lane for `engine`, touching no engine state."""
    t_submit = time.perf_counter()  # time to first token counts the tokenizing too
    vocab = engine.target.config.vocab_size
    if req.top_k > vocab:
        raise RequestError(
            f"field 'top_k': {req.top_k} is more than the vocabulary ({vocab} tokens); use 0 "
            f"(no top-k) or at most {vocab}",
            field="top_k",
        )
    ids = engine.prompt_ids(req, chat)
    field = "prompt_ids" if req.prompt_ids is not None else "messages" if req.messages is not None else "prompt"
    if not ids:
        raise RequestError("the prompt encodes to no tokens; give a non-empty prompt", field=field)
    max_len = engine.max_len
    if len(ids) >= max_len:
        raise RequestError(
            f"field '{field}': the prompt is {len(ids)} tokens, and the engine's max length is "
            f"{max_len} (prompt + output); shorten the prompt",
            field=field,
        )
    if len(ids) + req.max_tokens > max_len:
        raise RequestError(
            f"prompt ({len(ids)} tokens) + max_tokens ({req.max_tokens}) exceeds the engine's "
            f"max length {max_len}; lower max_tokens to at most "
            f"{max_len - len(ids)} or shorten the prompt",
            field="max_tokens",
        )
    spec = req.spec
    k = 0 if not spec.enabled else min(spec.draft_tokens or engine.draft_tokens, engine.draft_tokens)
    seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    eos = frozenset(engine.tokenizer.eos_token_ids)
    lane = Lane(
        rid=req.id,
        order=-1,
        slot=-1,
        prompt_ids=ids,
        request=req,
        draft_tokens=k,
        eos_ids=eos,
        detok=engine.tokenizer.detokenizer(skip_special=True),
        seed=seed,
    )
    lane.t_submit = t_submit
    lane.checkpoint_at = engine.keeper.marks(ids, req.conversation(chat))
    return lane


def run_all(engine, requests, chat: bool = False, on_event=None) -> list[DoneEvent]:
    """Engine.generate: the requests through `engine`'s steps as concurrent lanes, fed to its queue as it has room
    (offline: never past `max_queue`); their final events in input order, every event to `on_event` as it comes."""
    pending = collections.deque(requests)
    order = {req.id: i for i, req in enumerate(pending)}
    done: dict[Any, DoneEvent] = {}
    while pending or engine.busy():
        while pending and len(engine.queue) < engine.max_queue:
            engine.submit(pending.popleft(), chat)
        for ev in engine.step():
            if on_event is not None:
                on_event(ev)
            if isinstance(ev, DoneEvent):
                done[ev.rid] = ev
    return [done[rid] for rid in sorted(order, key=order.get)]


def cancel(engine, rid) -> bool:
    """Engine.cancel: a queued request ends at once (its DoneEvent at the next retire), a running one at its step's
    retire; False when `rid` is neither."""
    for lane in list(engine.queue):
        if lane.rid == rid:
            engine.queue.remove(lane)
            lane.finish_reason = "cancelled"
            engine.finished.append(lane)
            return True
    for lane in engine.lanes.active.values():
        if lane.rid == rid and lane.finish_reason is None:
            lane.finish_reason = "cancelled"
            return True
    return False
