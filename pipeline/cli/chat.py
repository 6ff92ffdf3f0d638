"""`speclane chat`: an interactive conversation in the terminal, as llama.cpp's conversation mode.

Reads a turn, answers it through the model's chat template with the whole conversation so far, streaming the
answer. On a terminal the turn is read with line editing, a history kept across sessions in
`$SPECLANE_CACHE/chat_history` and multi-line input (prompt_toolkit); piped stdin is one turn a line. A line that
begins with `/` is a command, never sent to the model (`/help` lists them): settings for the next answers
(`/set`), timings (`/stats`), `/reset` and `/exit`. Running the requests (steps, Ctrl-C between steps, timings)
is pipeline/cli/drive.py's; what each command does is pipeline/cli/chat_commands.py's; this module keeps the
conversation, reads the turns and answers them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import attrs

from speclane.pipeline.cli import chat_commands, drive
from speclane.pipeline.cli.common import add_model_flags, add_spec_flags, engine_from_args
from speclane.pipeline.cli.generate import add_sampling_flags, sampling_defaults
from speclane.pipeline.cli.progress import Progress
from speclane.pipeline.runtime.request import GenerateRequest, parse_request
from speclane.stages.contract.errors import RequestError

if TYPE_CHECKING:  # the parser (and --help) builds without torch, which this imports
    from speclane.stages.contract.events import TokenEvent

BANNER = "speclane chat: /help lists the commands; Ctrl-D ends the session, Ctrl-C stops an answer"


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="an interactive conversation with the model (/help lists its commands)")
    p.add_argument("--system", default=None, help="system message at the start of the conversation")
    add_sampling_flags(p)
    add_model_flags(p)
    add_spec_flags(p)
    p.set_defaults(func=run)


@attrs.define
class Conversation:
    """The turns so far, the request fields of the next answer (the flags', then `/set`'s), and its request."""

    system: str | None = None
    sampling: dict = attrs.field(factory=dict)
    turns: list[dict[str, str]] = attrs.field(factory=list)
    count: int = 0

    def request(self, user: str) -> GenerateRequest:
        head = [{"role": "system", "content": self.system}] if self.system else []
        self.count += 1
        return parse_request(
            {"id": self.count, "messages": head + self.turns + [{"role": "user", "content": user}], **self.sampling}
        )

    def answered(self, user: str, answer: str) -> None:
        self.turns += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]

    def reset(self) -> None:
        self.turns.clear()

    def set(self, name: str, text: str) -> None:
        """`/set name text`: checked as a request field before it is kept; a RequestError names the setting."""
        self.sampling[name] = chat_commands.setting(name, text, self.sampling)


def run(args: argparse.Namespace) -> int:
    conv = Conversation(args.system, sampling_defaults(args))
    conv.request("check")  # bad sampling flags are refused before the model loads
    progress = Progress()
    engine = engine_from_args(args, progress=progress)
    read = _reader()
    if progress.enabled:
        progress.line(drive.compute_line(args))
    if sys.stdin.isatty():
        print(BANNER, file=sys.stderr)
    answers: list[drive.Finished] = []
    while (line := read()) is not None:
        user = line.strip()
        if not user:
            continue
        if user.startswith("/") and not user.startswith("//"):
            if not chat_commands.command(user, conv, engine, answers, progress):
                break
            continue
        user = user[1:] if user.startswith("//") else user
        try:
            finished = _answer(engine, conv.request(user), progress, sys.stdout)
        except RequestError as exc:  # the conversation outgrew --max-len, say: this turn fails, the session not
            print(f"speclane chat: {exc} (/reset starts afresh)", file=sys.stderr)
            continue
        answers.append(finished)
        conv.answered(user, finished.done.text)
    return 0


def _reader() -> Callable[[], str | None]:
    """A callable that returns the next turn, or None at the end of input (Ctrl-D): edited with prompt_toolkit
    when stdin and stderr are terminals, else read as a line (piped stdin: one turn a line)."""
    if not sys.stdin.isatty():
        return lambda: sys.stdin.readline() or None
    if sys.stderr.isatty():
        return _line_editor()

    def plain() -> str | None:
        try:
            return input("> ")
        except EOFError:
            print(file=sys.stderr)  # the prompt's line ends
            return None

    return plain


def _line_editor() -> Callable[[], str | None]:
    """prompt_toolkit on stderr (stdout keeps only the answers): Enter sends, Alt-Enter or Ctrl-J starts a new line,
    Ctrl-C clears the line (on an empty one, ends the session, as Ctrl-D does)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.output import create_output

    keys = KeyBindings()

    @keys.add("enter")
    def _send(event: Any) -> None:
        event.current_buffer.validate_and_handle()

    @keys.add("escape", "enter")
    @keys.add("c-j")
    def _new_line(event: Any) -> None:
        event.current_buffer.newline(copy_margin=False)

    @keys.add("c-c")
    def _clear(event: Any) -> None:
        if event.current_buffer.text:
            event.current_buffer.reset()
        else:
            event.app.exit(exception=EOFError)

    session: PromptSession = PromptSession(
        history=_history(),
        multiline=True,
        key_bindings=keys,
        output=create_output(stdout=sys.stderr),
        prompt_continuation=lambda width, *_: "." * (width - 1) + " ",
    )

    def read() -> str | None:
        try:
            return session.prompt("> ")
        except EOFError:
            return None

    return read


def _history():
    """The turns typed in earlier sessions, in `$SPECLANE_CACHE/chat_history`; this session's only when that file
    cannot be written."""
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    from speclane.stages.models.artifact import cache_root

    path = cache_root() / "chat_history"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.open("a").close()
    except OSError as exc:
        print(
            f"speclane chat: history kept for this session only: cannot write {path} ({exc.strerror})", file=sys.stderr
        )
        return InMemoryHistory()
    return FileHistory(str(path))


def _answer(engine, request: GenerateRequest, progress: Progress, out: IO[str]) -> drive.Finished:
    """Stream one answer to `out`; Ctrl-C ends it where it is."""

    def on_token(ev: TokenEvent) -> None:
        out.write(ev.text)
        out.flush()

    with drive.interrupt_flag() as stop:
        finished = drive.run(engine, [request], on_token=on_token, progress=progress, stop=stop)
    out.write("\n")
    out.flush()
    done = finished[0]
    if done.done.finish_reason == "cancelled":
        progress.line("(stopped)")
    progress.line(done.line())
    if done.done.finish_reason == "error":
        raise RequestError(f"the answer failed inside the engine: {done.done.error}")
    return done
