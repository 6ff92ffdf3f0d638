"""Turn a list of chat messages into the prompt text an artifact's chat template defines.

The template is Jinja2 from `tokenizer_config.json` (`chat_template`), rendered the way transformers'
`apply_chat_template` renders it: in an immutable sandbox (a template is data from a model file and must not
reach Python internals), with `trim_blocks`/`lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter and
a `raise_exception` global. Messages are validated first and refused with a `RequestError` whose `field` names the
message index and key. Tokenizing the prompt belongs in `tokenizer.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from speclane.stages.contract.errors import ArtifactError, RequestError, did_you_mean

ROLES = ("system", "user", "assistant", "tool")
KEYS = ("role", "content")


def validate_messages(messages: Any) -> list[dict[str, str]]:
    """Every problem with `messages` at once; the error's `field` is the first offending one."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise RequestError(
            f"messages: expected a list of {{'role', 'content'}} objects, got {type(messages).__name__}.",
            field="messages",
        )
    if not messages:
        raise RequestError("messages: the list is empty; send at least one message.", field="messages")
    problems: list[tuple[str, str]] = []  # (field, message)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            problems.append(
                (where, f"{where}: expected an object with 'role' and 'content', got {type(message).__name__}")
            )
            continue
        for key in message:
            if key not in KEYS:
                problems.append(
                    (
                        f"{where}.{key}",
                        f"{where}.{key}: unknown key{did_you_mean(str(key), KEYS)}; "
                        "a message has only 'role' and 'content'",
                    )
                )
        role, content = message.get("role"), message.get("content")
        if role is None:
            problems.append((f"{where}.role", f"{where}.role: missing; one of {', '.join(ROLES)}"))
        elif role not in ROLES:
            problems.append(
                (
                    f"{where}.role",
                    f"{where}.role: {role!r} is not a role{did_you_mean(str(role), ROLES)}; one of {', '.join(ROLES)}",
                )
            )
        if content is None:
            problems.append((f"{where}.content", f"{where}.content: missing; the message text as a string"))
        elif not isinstance(content, str):
            problems.append((f"{where}.content", f"{where}.content: expected a string, got {type(content).__name__}"))
    if problems:
        lines = "\n".join(f"  - {text}" for _, text in problems)
        error = RequestError(f"messages: {len(problems)} problem(s)\n{lines}", field=problems[0][0])
        error.problems = [text for _, text in problems]
        raise error
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _raise_exception(message: str) -> None:
    # A template calls this when the conversation breaks its rules (say, roles that do not alternate).
    raise RequestError(f"messages: the chat template refused them: {message}", field="messages")


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' does not, and templates are written for it.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """One compiled chat template with the special tokens it may refer to."""

    def __init__(
        self,
        template: str | None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        source: str = "tokenizer_config.json",
    ):
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not template:
            raise ArtifactError(
                f"{source}: no chat_template; the artifact cannot format chat messages. Send a "
                "plain prompt, or add a chat_template to tokenizer_config.json."
            )
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ArtifactError(
                f"{source}: chat_template is not valid Jinja (line {exc.lineno}: {exc.message}); fix the template."
            )
        self.bos_token, self.eos_token = bos_token, eos_token
        self.source = source

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, source: str = "tokenizer_config.json") -> ChatTemplate:
        """From a `tokenizer.Tokenizer` (its chat_template and bos/eos tokens)."""
        return cls(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token, source)

    def render(self, messages: Any, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages`, ending with the assistant's opener when `add_generation_prompt`."""
        import jinja2

        checked = validate_messages(messages)
        try:
            return self._template.render(
                messages=checked,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except jinja2.TemplateError as exc:
            raise ArtifactError(f"{self.source}: chat_template failed to render ({exc}); fix the template.")
