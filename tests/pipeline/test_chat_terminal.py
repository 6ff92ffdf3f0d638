"""`speclane chat` as a person types it, in a pseudo-terminal (tests/terminal.py): a turn sent with Enter, a
multi-line turn (Alt-Enter and Ctrl-J start a new line), `/help` answered on the spot, the history kept in
`$SPECLANE_CACHE/chat_history` and recalled with the Up arrow in the next session, and Ctrl-C clearing a line
(and, on an empty one, ending the session). Each session's first answer stays on the screen whole, word for word
the answer `generate --json` gives to the same turn with the same settings away from a terminal (no progress bar
erases its first word)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from speclane.stages.models.artifact import cache_root
from tests.terminal import Terminal

# One lane and a fixed length, so `generate` below runs each turn as the chat's engine does.
SETTINGS = ["--max-tokens", "8", "--dtype", "float32", "--threads", "1", "--max-lanes", "1", "--max-len", "512"]
CHAT = ["chat", *SETTINGS]
FIRST_TURNS = ["Say one\nword\nonly.", "What is the capital of France?"]  # each session's first turn
TIMING = re.compile(r"^\d+ in, \d+ out \|")  # the timing line after each answer
PREFILL = re.compile(r"^prefill: \d+ prompt tokens in [\d.]+ s$")  # the prefill bar's closing line
UP, ALT_ENTER, CTRL_J, CTRL_C, CTRL_D = "\x1b[A", "\x1b\r", "\n", "\x03", "\x04"


@pytest.fixture
def cache(tmp_path):
    """A cache of its own, so the history starts empty, sharing the conversions and kernels already made."""
    real = cache_root()
    for entry in real.iterdir() if real.is_dir() else ():
        if entry.name != "chat_history":
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def prompts(n: int):
    """The screen shows the `> ` prompt `n` times."""
    return lambda lines: sum(line == ">" or line.startswith("> ") for line in lines) >= n


def answers(n: int):
    return lambda lines: sum(bool(TIMING.match(line)) for line in lines) >= n


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    """The answer to each first turn (a conversation of that one user message), from `generate --json` run with
    its output piped: no terminal, no progress."""
    requests = tmp_path_factory.mktemp("turns") / "turns.jsonl"
    requests.write_text(
        "".join(
            json.dumps({"id": i, "messages": [{"role": "user", "content": t}]}) + "\n"
            for i, t in enumerate(FIRST_TURNS)
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "speclane.pipeline.cli", "generate", "--requests", str(requests), *SETTINGS, "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    texts = [json.loads(line)["text"] for line in done.stdout.splitlines()]
    assert len(texts) == len(FIRST_TURNS) and all(t.strip() for t in texts), texts
    return dict(zip(FIRST_TURNS, texts))


def answer_after(shown: list[str], at: int) -> str:
    """The answer on the screen after the turn whose last line is `shown[at]`: the lines up to its timing line,
    after the line a long prompt's prefill bar leaves when it ends (stderr, written before the first token)."""
    start = at + 1 + bool(PREFILL.match(shown[at + 1]))
    end = next(i for i in range(start, len(shown)) if TIMING.match(shown[i]))
    return "\n".join(shown[start:end]).strip()


def as_shown(text: str) -> str:
    """A text as the screen keeps it: each line without its trailing blanks."""
    return "\n".join(line.rstrip() for line in text.strip().split("\n"))


def test_turns_are_edited_kept_and_recalled_in_the_next_session(cache, expected):
    first = Terminal(CHAT, env={"SPECLANE_CACHE": str(cache)})
    first.wait_for(prompts(1))
    first.send(f"Say one{ALT_ENTER}word{CTRL_J}only.\r")  # one turn of three lines
    first.wait_for(answers(1))
    # Keys are sent only once the prompt is drawn again: typed earlier, they meet the terminal in cooked mode, where
    # Enter arrives as Ctrl-J (a new line in the editor) and Ctrl-D as the end of input.
    first.wait_for(prompts(2))
    first.send("/help\r")
    first.wait_for("/stats")
    first.wait_for(prompts(3))
    first.send("What is the capital of France?\r")
    first.wait_for(answers(2))
    first.wait_for(prompts(4))
    first.send(CTRL_D)
    assert first.close() == 0
    shown = first.screen()
    at = shown.index("> Say one")
    assert shown[at + 1 : at + 3] == [". word", ". only."]  # the continuation lines
    assert answer_after(shown, at + 2) == as_shown(expected[FIRST_TURNS[0]])  # every word of the first answer
    assert sum(bool(TIMING.match(line)) for line in shown) == 2  # one answer a turn; /help none
    assert "Say one\nword\nonly." in _history(cache)

    second = Terminal(CHAT, env={"SPECLANE_CACHE": str(cache)})
    second.wait_for(prompts(1))
    second.send("never sent")
    second.wait_for("> never sent")
    second.send(CTRL_C)  # clears what was typed
    second.wait_for(lambda lines: lines[-1] == ">")
    second.send(UP)  # the last turn of the last session
    second.wait_for("> What is the capital of France?")
    second.send("\r")
    second.wait_for(answers(1))
    second.wait_for(prompts(2))
    second.send(CTRL_C)  # on an empty line: the end
    assert second.close() == 0
    shown = second.screen()
    at = shown.index("> What is the capital of France?")
    assert answer_after(shown, at) == as_shown(expected[FIRST_TURNS[1]])
    assert "never sent" not in _history(cache)


def _history(cache) -> str:
    """The turns in the history file, lines joined as typed (prompt_toolkit's FileHistory: '+' before each)."""
    return "\n".join(line[1:] for line in (cache / "chat_history").read_text().splitlines() if line.startswith("+"))
