"""`speclane chat`: an interactive conversation in the terminal, as llama.cpp's conversation mode.

Reads a turn, answers it through the model's chat template with the whole conversation so far, streaming the
answer. On a terminal the turn is read with line editing, a history kept across sessions in
`$SPECLANE_CACHE/chat_history` and multi-line input (prompt_toolkit); piped stdin is one turn a line. A line that
begins with `/` is a command, never sent to the model (`/help` lists them): settings for the next answers
(`/set`), timings (`/stats`), `/reset` and `/exit`. Running the requests (steps, Ctrl-C between steps, timings)
is pipeline/cli/drive.py's; this module keeps the conversation and its commands.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import IO, Any

import attrs

from speclane.pipeline.cli import drive
from speclane.pipeline.cli.common import add_model_flags, add_spec_flags, engine_from_args
from speclane.pipeline.cli.generate import add_sampling_flags, sampling_defaults
from speclane.pipeline.cli.progress import Progress
from speclane.pipeline.runtime.request import GenerateRequest, parse_request
from speclane.stages.contract.errors import RequestError, did_you_mean
from speclane.stages.contract.events import TokenEvent
from speclane.stages.contract.lanes import MAX_DRAFT_TOKENS
from speclane.stages.drafters import SPEC_BACKENDS

BANNER = "speclane chat: /help lists the commands; Ctrl-D ends the session, Ctrl-C stops an answer"
HELP = f"""\
/set                    the settings the next answers take
/set temperature X      0 is greedy (the default); above 0 samples
/set max_tokens N       the longest answer, in tokens
/set top_p X | top_k N | seed N
/set spec off|on|N      speculation off, on, or at most N draft tokens a round (1 to {MAX_DRAFT_TOKENS})
/stats                  the last answer's timing and the conversation's totals
/reset                  forget the conversation
/exit                   end the session (as Ctrl-D)
//text                  send text that begins with '/'
Enter sends; Alt-Enter (Esc, Enter) or Ctrl-J starts a new line; Ctrl-C stops an answer or clears the line"""
# The sampling settings `/set` takes, with how its text becomes the request field's value.
NUMBERS: dict[str, type] = {"temperature": float, "max_tokens": int, "top_p": float, "top_k": int, "seed": int}


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
        return parse_request({"id": self.count, "messages": head + self.turns + [{"role": "user", "content": user}],
                              **self.sampling})

    def answered(self, user: str, answer: str) -> None:
        self.turns += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]

    def reset(self) -> None:
        self.turns.clear()

    def set(self, name: str, text: str) -> None:
        """`/set name text`: checked as a request field before it is kept; a RequestError names the setting."""
        kind = NUMBERS.get(name)
        if kind is None and name != "spec":
            raise RequestError(f"/set: no setting '{name}'{did_you_mean(name, [*NUMBERS, 'spec'])}; the settings "
                               f"are {', '.join([*NUMBERS, 'spec'])}", field=name)
        try:
            value = _spec_setting(text) if kind is None else kind(text)
        except ValueError:
            raise RequestError(f"/set {name}: '{text}' is not {'a number' if kind is float else 'a whole number'}"
                               if kind else f"/set spec: '{text}' is not off, on, or a number of draft tokens",
                               field=name) from None
        _check(name, {**self.sampling, name: value})
        self.sampling[name] = value


def _spec_setting(text: str) -> dict:
    """`/set spec` as a request's `spec` field: off, on (the session's drafts) or at most N draft tokens a round."""
    if text in ("on", "off"):
        return {"enabled": text == "on"}
    if text in SPEC_BACKENDS:
        raise RequestError(f"/set spec: the drafter is chosen when chat starts (--spec-backend {text}); here: off, "
                           f"on, or at most N draft tokens a round (1 to {MAX_DRAFT_TOKENS})", field="spec")
    if not 1 <= int(text) <= MAX_DRAFT_TOKENS:
        raise RequestError(f"/set spec: draft tokens go from 1 to {MAX_DRAFT_TOKENS} (off: none), got {text}",
                           field="spec")
    return {"draft_tokens": int(text)}


def _check(name: str, fields: dict) -> None:
    """Refuse what a request would refuse, in a line that names the setting."""
    try:
        parse_request({"prompt": "-", **fields})
    except RequestError as exc:
        reason = str(exc).split(": ", 1)[-1] if str(exc).startswith("field '") else str(exc)
        raise RequestError(f"/set {name}: {reason[:1].lower()}{reason[1:]}", field=name) from None


def stats(answers: list[drive.Finished], max_len: int) -> list[str]:
    """`/stats`: the last answer's timing line, and the conversation's totals over `answers`."""
    if not answers:
        return ["no answer yet"]
    outs = [f.done.usage.get("completion_tokens", 0) for f in answers]
    decoded, decoding = sum(max(0, n - 1) for n in outs), sum(f.decode_s for f in answers)
    rate = f" ({decoded / decoding:.1f} tok/s)" if decoding > 0 else ""
    lines = [f"last answer   {answers[-1].line()}",
             f"conversation  {len(answers)} answer(s), {sum(outs)} tokens out: "
             f"{sum(f.ttft for f in answers):.2f} s to first tokens, {decoding:.2f} s decoding{rate}",
             f"context       {answers[-1].done.usage.get('total_tokens', 0)} of {max_len} tokens (--max-len)"]
    spec = [(f.done.spec, n - 1) for f, n in zip(answers, outs) if f.spec_on]
    if spec:
        rounds, drafted = sum(s["rounds"] for s, _ in spec), sum(s["drafted"] for s, _ in spec)
        lines.append(f"speculation   {sum(n for _, n in spec) / rounds:.2f} tok/round, "
                     f"{sum(s['accepted'] for s, _ in spec) / drafted * 100:.0f} % of {drafted} drafted tokens "
                     "accepted")
    return lines


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
            if not _command(user, conv, engine, answers, progress):
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


def _command(line: str, conv: Conversation, engine, answers: list, progress: Progress) -> bool:
    """Carry out one `/command`; False ends the session. Replies asked for (/help, /stats) and errors go to stderr
    even when it is not a terminal; acknowledgements only on a terminal."""
    name, *rest = line.split()
    if name == "/exit":
        return False
    if name == "/reset":
        conv.reset()
        progress.line("(conversation forgotten)")
    elif name == "/help":
        print(HELP, file=sys.stderr)
    elif name == "/stats":
        print("\n".join(stats(answers, engine.max_len)), file=sys.stderr)
    elif name == "/set" and not rest:
        print(_settings(conv, engine), file=sys.stderr)
    elif name == "/set" and len(rest) == 2:
        try:
            conv.set(*rest)
        except RequestError as exc:
            print(f"speclane chat: {exc}", file=sys.stderr)
        else:
            progress.line(f"({_settings(conv, engine)})")
    elif name == "/set":
        print("speclane chat: /set takes a setting and a value, as /set temperature 0.7 (/help lists them)",
              file=sys.stderr)
    else:
        print(f"speclane chat: no command {name}; /help lists them (//text sends text that begins with '/')",
              file=sys.stderr)
    return True


def _settings(conv: Conversation, engine) -> str:
    """The settings the next answer takes, the defaults included."""
    req = parse_request({"prompt": "-", **conv.sampling})
    drafts = engine.draft_tokens if engine.drafter is not None else 0
    spec = ("off (started without a drafter)" if not drafts else "off" if not req.spec.enabled else
            f"on, at most {min(req.spec.draft_tokens or drafts, drafts)} draft tokens a round")
    seed = "" if req.seed is None else f", seed {req.seed}"
    return (f"temperature {req.temperature:g}, max_tokens {req.max_tokens}, top_p {req.top_p:g}, "
            f"top_k {req.top_k}{seed}; spec {spec}")


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

    session: PromptSession = PromptSession(history=_history(), multiline=True, key_bindings=keys,
                                           output=create_output(stdout=sys.stderr),
                                           prompt_continuation=lambda width, *_: "." * (width - 1) + " ")

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
        print(f"speclane chat: history kept for this session only: cannot write {path} ({exc.strerror})",
              file=sys.stderr)
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
