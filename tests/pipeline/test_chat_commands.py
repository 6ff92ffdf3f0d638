"""`speclane chat`'s commands, on piped stdin: `/help` and other commands never reach the model, `/set` changes
the next answers (or says in one line which setting it refused and why), `/stats` tells the last answer's timing
and the conversation's totals."""

from __future__ import annotations

import io

import pytest
import torch

from speclane.pipeline.cli import main
from speclane.pipeline.cli.chat import Conversation
from speclane.stages.contract.errors import RequestError

FLOAT32 = ("--dtype", "float32", "--threads", "1")


@pytest.fixture(scope="module")
def engine():
    from speclane.pipeline.runtime.engine import Engine
    from speclane.stages.models.loading import load_model

    torch.set_num_threads(1)
    target, tokenizer = load_model(None, "float32")
    return Engine(target, tokenizer, max_lanes=1)


@pytest.fixture
def chat(engine, monkeypatch, capsys):
    """`chat(lines)` runs a session on the module's engine with `lines` as stdin; returns (stdout, stderr)."""
    monkeypatch.setattr("speclane.pipeline.cli.chat.engine_from_args", lambda *_a, **_k: engine)

    def session(*lines: str, flags: tuple[str, ...] = ()) -> tuple[str, str]:
        monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))
        assert main(["chat", *flags, *FLOAT32]) == 0
        return capsys.readouterr()

    return session


def test_commands_never_reach_the_model(chat, engine):
    before = engine.stats(engine.retired)["rounds"], len(engine.retired)
    out, err = chat("/help", "/stats", "/set", "/nonsense", "/set temperature")
    assert out == ""  # no answer was written
    assert (engine.stats(engine.retired)["rounds"], len(engine.retired)) == before
    for command in ("/set temperature X", "/set max_tokens N", "/set spec off|on|N", "/stats", "/reset", "/exit"):
        assert command in err
    assert "no answer yet" in err
    assert "temperature 0, max_tokens 128, top_p 1, top_k 0; spec on" in err
    assert "speclane chat: no command /nonsense; /help lists them" in err
    assert "speclane chat: /set takes a setting and a value" in err


def test_text_that_begins_with_a_slash_is_sent_doubled(chat):
    out, _ = chat("//help", flags=("--max-tokens", "3"))
    assert len(out.splitlines()) == 1  # answered, as text


def test_set_changes_the_next_answers_and_stats_tell_them(chat):
    _, err = chat(
        "/set max_tokens 3", "What is the capital of France?", "/stats", "/set max_tokens 5", "And of Italy?", "/stats"
    )
    first, second = err.split("last answer")[1:]
    assert ", 3 out" in first and "1 answer(s), 3 tokens out" in first
    assert ", 5 out" in second and "2 answer(s), 8 tokens out" in second
    assert "of 4096 tokens (--max-len)" in second


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("temperature", "-1", "/set temperature: input should be greater than or equal to 0"),
        ("temperature", "warm", "/set temperature: 'warm' is not a number"),
        ("max_tokens", "0", "/set max_tokens: input should be greater than or equal to 1"),
        ("max_tokens", "1.5", "/set max_tokens: '1.5' is not a whole number"),
        ("top_p", "0", "/set top_p: input should be greater than 0"),
        ("spec", "9", "/set spec: draft tokens go from 1 to 7 (off: none), got 9"),
        ("spec", "maybe", "/set spec: 'maybe' is not off, on, or a number of draft tokens"),
        ("spec", "ngram", "/set spec: the drafter is chosen when chat starts (--spec-backend ngram)"),
        ("temprature", "1", "/set: no setting 'temprature' (did you mean \"temperature\"?)"),
    ],
)
def test_a_bad_setting_is_refused_in_one_line_that_names_it(setting, value, message):
    conv = Conversation(None, {"temperature": 0.5})
    with pytest.raises(RequestError) as caught:
        conv.set(setting, value)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert conv.sampling == {"temperature": 0.5}  # the setting before is kept


def test_a_bad_setting_is_said_on_stderr_and_the_session_goes_on(chat):
    out, err = chat("/set temperature -1", "Hi", flags=("--max-tokens", "2"))
    assert err == "speclane chat: /set temperature: input should be greater than or equal to 0\n"
    assert len(out.splitlines()) == 1


@pytest.mark.parametrize(
    "value, spec", [("off", {"enabled": False}), ("on", {"enabled": True}), ("2", {"draft_tokens": 2})]
)
def test_set_spec_reaches_the_engine(engine, value, spec):
    conv = Conversation(None, {"max_tokens": 4})
    conv.set("spec", value)
    assert conv.sampling == {"max_tokens": 4, "spec": spec}
    lane = engine.prepare(conv.request("Hi"), chat=True)
    assert engine.draft_tokens > 2
    assert lane.draft_tokens == {"off": 0, "on": engine.draft_tokens, "2": 2}[value]
