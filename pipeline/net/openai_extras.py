"""The extra request fields vLLM's OpenAI server documents, as speclane's gateway takes them (docs/http.md has the
table): honoured where speclane does what they ask, accepted and ignored where they ask for nothing that changes
an answer here, and refused (400 naming the field) at any value but their neutral one where ignoring them would
hand back something other than what was asked.

The honoured ones are plain fields the bodies read (openai_api.py); this module owns the other two kinds.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

_GUIDED = "does not constrain its output (guided decoding); the answer would not follow it"

# field -> (the values taken, why any other is refused)
SHARED_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "min_p": ((0, 0.0), "does not sample with min_p"),
    "repetition_penalty": ((1, 1.0), "applies no repetition penalty"),
    "min_tokens": ((0,), "has no min_tokens: a stop token ends the answer where it falls"),
    "stop_token_ids": (([],), "stops at the model's own end tokens only; send stop strings in `stop`"),
    "include_stop_str_in_output": ((False,), "cuts a stop string from the output"),
    "skip_special_tokens": ((True,), "always leaves special tokens out of the text"),
    "spaces_between_special_tokens": ((True,), "always decodes special tokens with spaces between them"),
    "use_beam_search": ((False,), "has no beam search"),
    "truncate_prompt_tokens": ((), "does not truncate prompts; shorten the prompt"),
    "prompt_logprobs": ((), "computes no log-probabilities of prompt tokens"),
    "allowed_token_ids": ((), "does not restrict the vocabulary"),
    "bad_words": (([],), "does not ban words"),
    "logits_processors": ((), "runs no logits processors"),
    "logit_bias": (({},), "applies no logit bias"),
    "guided_json": ((), _GUIDED),
    "guided_regex": ((), _GUIDED),
    "guided_choice": ((), _GUIDED),
    "guided_grammar": ((), _GUIDED),
    "structural_tag": ((), _GUIDED),
    "response_format": (({"type": "text"},), _GUIDED),
    "cache_salt": ((), "shares prompt checkpoints between all requests; a salt would not keep them apart"),
    "kv_transfer_params": ((), "has no disaggregated prefill"),
    "priority": ((0,), "serves requests in arrival order (no priority scheduling)"),
    "frequency_penalty": ((0, 0.0), "applies no frequency penalty"),
    "presence_penalty": ((0, 0.0), "applies no presence penalty"),
}
CHAT_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "echo": ((False,), "does not echo the last message"),
    "add_generation_prompt": ((True,), "always ends the prompt with the template's assistant opener"),
    "continue_final_message": ((False,), "always starts a new assistant message"),
    "add_special_tokens": ((False,), "adds only what the chat template writes"),
    "documents": ((), "passes no documents to the chat template"),
    "chat_template": ((), "renders with the model's own chat template"),
    "chat_template_kwargs": (({},), "passes no arguments to the chat template"),
    "reasoning_effort": ((), "passes no reasoning effort to the model"),
    "tools": (([],), "has no tool calling"),
    "tool_choice": (("none",), "has no tool calling"),
}
COMPLETION_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "add_special_tokens": ((True,), "encodes a prompt with the tokenizer's special tokens"),
    "prompt_embeds": ((), "takes no prompt embeddings"),
}


def _check(table: dict, name: str, value: Any) -> Any:
    taken, why = table[name]
    if value is not None and not any(type(value) is type(v) and value == v for v in taken):
        shown = " or ".join(json.dumps(v) for v in taken) or "null"
        raise ValueError(f"speclane {why}; leave the field out or send {shown}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SharedExtras(_Strict):
    """vLLM's extras of both routes: the refused ones (at a neutral value only) and the accepted, ignored ones."""

    # accepted and ignored: they change nothing here (beam search, guided decoding and multimodal inputs are
    # refused above; no extension reads vllm_xargs)
    length_penalty: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    mm_processor_kwargs: Any = None
    vllm_xargs: Any = None
    min_p: Any = None
    repetition_penalty: Any = None
    min_tokens: Any = None
    stop_token_ids: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    spaces_between_special_tokens: Any = None
    use_beam_search: Any = None
    truncate_prompt_tokens: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    logits_processors: Any = None
    logit_bias: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Any = None
    response_format: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    priority: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None

    @field_validator(*SHARED_NEUTRAL, mode="before")
    @classmethod
    def _neutral(cls, value: Any, info) -> Any:
        return _check(SHARED_NEUTRAL, info.field_name, value)


class ChatExtras(_Strict):
    # accepted and ignored: a tool-less, reasoning-less answer is the same whatever they say
    parallel_tool_calls: Any = None
    include_reasoning: Any = None
    echo: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    add_special_tokens: Any = None
    documents: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    reasoning_effort: Any = None
    tools: Any = None
    tool_choice: Any = None

    @field_validator(*CHAT_NEUTRAL, mode="before")
    @classmethod
    def _neutral(cls, value: Any, info) -> Any:
        return _check(CHAT_NEUTRAL, info.field_name, value)


class CompletionExtras(_Strict):
    add_special_tokens: Any = None
    prompt_embeds: Any = None

    @field_validator(*COMPLETION_NEUTRAL, mode="before")
    @classmethod
    def _neutral(cls, value: Any, info) -> Any:
        return _check(COMPLETION_NEUTRAL, info.field_name, value)
