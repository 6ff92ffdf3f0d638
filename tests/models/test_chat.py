"""Chat templates render exactly as transformers' `apply_chat_template` renders them, in a sandbox, and bad
messages are refused with the index and key at fault."""

from __future__ import annotations

import pytest

from speclane.stages.contract.errors import ArtifactError, RequestError
from speclane.stages.models.chat import ChatTemplate

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Ünïcödé 🙂 and\n  spaces <b>&'"},
    ],
]
# A template using what transformers' environment offers beyond plain Jinja: tojson, loop controls, specials.
CUSTOM = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{{ m | tojson }}\n{% endfor %}{% if add_generation_prompt %}<go>{% endif %}{{ eos_token }}"
)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm_dir))


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_artifact_template_matches_transformers(smollm_tokenizer, hf_tokenizer, messages):
    ours = ChatTemplate.from_tokenizer(smollm_tokenizer).render(messages)
    assert ours == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_custom_template_matches_transformers(smollm_tokenizer, hf_tokenizer, messages):
    ours = ChatTemplate(CUSTOM, smollm_tokenizer.bos_token, smollm_tokenizer.eos_token).render(messages)
    assert ours == hf_tokenizer.apply_chat_template(
        messages, chat_template=CUSTOM, tokenize=False, add_generation_prompt=True
    )
    # The system message was skipped by `continue`; tojson kept non-ASCII text as is.
    assert "Be terse" not in ours and ours.count("\n") == sum(m["role"] != "system" for m in messages)
    assert ("Ünïcödé 🙂" in ours) == any("🙂" in m["content"] for m in messages)


def test_generation_prompt_can_be_left_off(smollm_tokenizer):
    text = ChatTemplate.from_tokenizer(smollm_tokenizer).render(CONVERSATIONS[0], add_generation_prompt=False)
    assert text.endswith("What is the capital of France?<|im_end|>\n")


BAD = [
    ("hello", "messages", "messages: expected a list of {'role', 'content'} objects, got str."),
    ([], "messages", "messages: the list is empty; send at least one message."),
    (
        [{"role": "user", "content": "hi"}, "oops"],
        "messages[1]",
        "messages: 1 problem(s)\n  - messages[1]: expected an object with 'role' and 'content', got str",
    ),
    (
        [{"role": "usr", "content": "hi"}],
        "messages[0].role",
        "messages: 1 problem(s)\n  - messages[0].role: 'usr' is not a role (did you mean \"user\"?); "
        "one of system, user, assistant, tool",
    ),
    (
        [{"role": "user", "content": ["a", "b"]}],
        "messages[0].content",
        "messages: 1 problem(s)\n  - messages[0].content: expected a string, got list",
    ),
    (
        [{"role": "user", "content": "a"}, {"content": "b", "contnet": "c"}],
        "messages[1].contnet",
        'messages: 2 problem(s)\n  - messages[1].contnet: unknown key (did you mean "content"?); a message has only '
        "'role' and 'content'\n  - messages[1].role: missing; one of system, user, assistant, tool",
    ),
]


@pytest.mark.parametrize(("messages", "field", "message"), BAD)
def test_bad_messages_are_refused(smollm_tokenizer, messages, field, message):
    with pytest.raises(RequestError) as caught:
        ChatTemplate.from_tokenizer(smollm_tokenizer).render(messages)
    assert (caught.value.field, str(caught.value)) == (field, message)


def test_template_raise_exception_is_a_request_error():
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('the first message must be user') }}{% endif %}"
    with pytest.raises(RequestError, match=r"messages: the chat template refused them: the first message must be"):
        ChatTemplate(template).render([{"role": "assistant", "content": "x"}])


def test_template_is_sandboxed():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(
        ArtifactError,
        match=r"tokenizer_config.json: chat_template failed to render \(access to "
        r"attribute '__class__'",
    ):
        ChatTemplate(escape).render([{"role": "user", "content": "x"}])
    with pytest.raises(ArtifactError, match=r"chat_template failed to render"):
        ChatTemplate("{% set _ = messages.append(1) %}").render([{"role": "user", "content": "x"}])


def test_missing_or_broken_template_names_the_file():
    with pytest.raises(ArtifactError, match=r"tokenizer_config.json: no chat_template; the artifact cannot format"):
        ChatTemplate(None)
    with pytest.raises(ArtifactError, match=r"chat_template is not valid Jinja \(line 1: "):
        ChatTemplate("{% for m in messages %}")
