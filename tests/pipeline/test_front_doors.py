"""The front doors a person watches: `speclane chat` on piped stdin (history kept, /reset, /exit, end of input),
Ctrl-C ending an answer between steps, progress drawn only on a terminal and never under --json, the closing
timing line, and the checks that come before any model loads."""

import io
import json
import threading

import pytest
import torch

from speclane.pipeline.cli import drive, main
from speclane.pipeline.cli.chat import Conversation
from speclane.pipeline.cli.progress import Progress, timing_line
from speclane.pipeline.runtime.request import parse_request

FLOAT32 = ("--dtype", "float32", "--threads", "1")


@pytest.fixture(scope="module")
def engine():
    from speclane.pipeline.runtime.engine import Engine
    from speclane.stages.models.loading import load_model

    torch.set_num_threads(1)
    target, tokenizer = load_model(None, "float32")
    return Engine(target, tokenizer, max_lanes=2)


def test_chat_answers_each_line_with_the_conversation_so_far(capsys, monkeypatch):
    monkeypatch.setattr(
        "sys.stdin",
        io.StringIO("What is the capital of France?\nAnd of Italy?\n\n/reset\nAnd of Italy?\n/exit\nnever read\n"),
    )
    assert main(["chat", "--max-tokens", "12", *FLOAT32]) == 0
    out, err = capsys.readouterr()
    answers = out.splitlines()
    assert len(answers) == 3 and "Paris" in answers[0]
    assert "Rome" in answers[1]  # "And of Italy?" read with the first turn before it
    assert answers[2] != answers[1]  # ... and without it once /reset forgot the conversation
    assert err == ""  # stderr is not a terminal here: no bars, no timing line


def test_chat_ends_at_the_end_of_input(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi!"))  # no newline, then Ctrl-D
    assert main(["chat", "--max-tokens", "4", *FLOAT32]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_conversation_keeps_turns_and_forgets_them_on_reset():
    conv = Conversation("Be brief.", {"max_tokens": 5})
    conv.answered("Hi", "Hello!")
    req = conv.request("Bye")
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello!"),
        ("user", "Bye"),
    ]
    assert req.max_tokens == 5
    conv.reset()
    assert [m.role for m in conv.request("Bye").messages] == ["system", "user"]


def test_stop_ends_the_answer_between_steps(engine):
    """What Ctrl-C does in `chat`: the answer ends cancelled with the tokens it had, and the engine goes on."""
    stop = threading.Event()
    req = parse_request({"id": "long", "prompt": "Count: 1, 2, 3,", "max_tokens": 64, "ignore_eos": True})
    [got] = drive.run(engine, [req], on_token=lambda ev: stop.set() if ev.index >= 2 else None, stop=stop)
    assert got.done.finish_reason == "cancelled" and 3 <= len(got.done.tokens) < 64
    [again] = drive.run(engine, [parse_request({"id": "next", "prompt": "Hi", "max_tokens": 3})])
    assert again.done.finish_reason == "length" and again.ttft > 0 and again.decode_s > 0


def test_progress_only_on_a_terminal():
    quiet = io.StringIO()
    p = Progress(stream=quiet)
    assert not p.enabled
    with p.task("loading", 3) as advance:
        advance(3)
    p.line("speclane: done")
    p.loader()("converting", 1, 2)
    assert quiet.getvalue() == ""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    shown = Terminal()
    p = Progress(stream=shown)
    assert p.enabled
    report = p.loader()
    for done in range(4):
        report("converting x.gguf", done, 3)
    assert "converting x.gguf: " in shown.getvalue() and " s" in shown.getvalue()


def test_timing_line_says_what_llama_cpp_says():
    spec = {"rounds": 4, "drafted": 12, "accepted": 6, "tokens_per_round": 2.5, "accepted_per_position": []}
    line = timing_line({"prompt_tokens": 7, "completion_tokens": 11}, 0.25, 2.0, spec)
    assert line == "7 in, 11 out | ttft 0.25 s | 5.0 tok/s | 2.50 tok/round, 50 % accepted"
    assert "tok/round" not in timing_line({"prompt_tokens": 7, "completion_tokens": 1}, 0.1, 0.0, None)


def test_generate_json_draws_nothing_but_the_summary(capsys):
    assert main(["generate", "--prompt", "Hi", "--max-tokens", "3", "--json", *FLOAT32]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["usage"]["completion_tokens"] == 3
    assert [json.loads(line) for line in err.splitlines()][0]["summary"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--prompt", ""], "--prompt is empty"),
        (["generate", "--prompt", "x", "--system", "s"], "--system needs --chat"),
        (["chat", "--temperature", "-1"], "temperature"),
    ],
)
def test_refused_before_the_model_loads(capsys, monkeypatch, argv, message):
    def no_load(*_a, **_k):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr("speclane.stages.models.loading.load_model", no_load)
    code = main(argv)
    assert code == 2 and message in capsys.readouterr().err


def test_an_empty_requests_file_is_an_error(capsys, tmp_path):
    empty = tmp_path / "none.jsonl"
    empty.write_text("\n\n")
    assert main(["generate", "--requests", str(empty)]) == 2
    assert f"--requests {empty}: no requests in the file" in capsys.readouterr().err
