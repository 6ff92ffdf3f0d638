"""`speclane chat` as a person types it, in a pseudo-terminal (tests/terminal.py): a turn sent with Enter, a
multi-line turn (Alt-Enter and Ctrl-J start a new line), `/help` answered on the spot, the history kept in
`$SPECLANE_CACHE/chat_history` and recalled with the Up arrow in the next session, and Ctrl-C clearing a line
(and, on an empty one, ending the session)."""

from __future__ import annotations

import re

import pytest

from speclane.stages.models.artifact import cache_root
from tests.terminal import Terminal

CHAT = ["chat", "--max-tokens", "8", "--dtype", "float32", "--threads", "1"]
TIMING = re.compile(r"^\d+ in, \d+ out \|")  # the timing line after each answer
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


def test_turns_are_edited_kept_and_recalled_in_the_next_session(cache):
    first = Terminal(CHAT, env={"SPECLANE_CACHE": str(cache)})
    first.wait_for(prompts(1))
    first.send(f"Say one{ALT_ENTER}word{CTRL_J}only.\r")  # one turn of three lines
    first.wait_for(answers(1))
    first.send("/help\r")
    first.wait_for("/stats")
    first.send("What is the capital of France?\r")
    first.wait_for(answers(2))
    first.send(CTRL_D)
    assert first.close() == 0
    shown = first.screen()
    at = shown.index("> Say one")
    assert shown[at + 1 : at + 3] == [". word", ". only."]  # the continuation lines
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
    second.send(CTRL_C)  # on an empty line: the end
    assert second.close() == 0
    shown = second.screen()
    assert "Paris" in "\n".join(shown[shown.index("> What is the capital of France?") :])
    assert "never sent" not in _history(cache)


def _history(cache) -> str:
    """The turns in the history file, lines joined as typed (prompt_toolkit's FileHistory: '+' before each)."""
    return "\n".join(line[1:] for line in (cache / "chat_history").read_text().splitlines() if line.startswith("+"))
