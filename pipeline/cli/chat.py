"""`speclane chat`: an interactive conversation in the terminal, as llama.cpp's conversation mode.

Reads a line, answers it through the model's chat template with the whole conversation so far, streaming the
answer; `/reset` forgets the conversation, `/exit` or Ctrl-D ends the session, Ctrl-C stops the answer being
written (and at the prompt, ends the session). Works the same on piped stdin, one turn a line. Running the
requests (steps, Ctrl-C between steps, timings) is pipeline/cli/drive.py's; this module keeps the conversation.
"""
from __future__ import annotations

import argparse
import sys
from typing import IO

import attrs

from speclane.pipeline.cli import drive
from speclane.pipeline.cli.common import add_model_flags, add_spec_flags, engine_from_args
from speclane.pipeline.cli.generate import add_sampling_flags, sampling_defaults
from speclane.pipeline.cli.progress import Progress
from speclane.pipeline.runtime.request import GenerateRequest, parse_request
from speclane.stages.contract.errors import RequestError
from speclane.stages.contract.events import TokenEvent
from speclane.kernels import cpu_build

HELP = "/reset forgets the conversation, /exit (or Ctrl-D) ends it, Ctrl-C stops an answer"


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="an interactive conversation with the model (reads stdin a line a turn)")
    p.add_argument("--system", default=None, help="system message at the start of the conversation")
    add_sampling_flags(p)
    add_model_flags(p)
    add_spec_flags(p)
    p.set_defaults(func=run)


@attrs.define
class Conversation:
    """The turns so far, and the request for the next answer."""
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


def run(args: argparse.Namespace) -> int:
    conv = Conversation(args.system, sampling_defaults(args))
    conv.request("check")  # bad sampling flags are refused before the model loads
    progress = Progress()
    engine = engine_from_args(args, progress=progress)
    compute = f"{args.dtype}{'+int8' if args.quant == 'int8' else ''}, {cpu_build.describe()}"
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"speclane chat: {HELP}", file=sys.stderr)
    while (line := _read(sys.stdin, interactive)) is not None:
        user = line.strip()
        if not user:
            continue
        if user == "/exit":
            break
        if user == "/reset":
            conv.reset()
            progress.line("(conversation forgotten)")
            continue
        try:
            answer = _answer(engine, conv.request(user), progress, compute, sys.stdout)
        except RequestError as exc:  # the conversation outgrew --max-len, say: this turn fails, the session not
            print(f"speclane chat: {exc} (/reset starts afresh)", file=sys.stderr)
            continue
        conv.answered(user, answer)
    return 0


def _read(stream: IO[str], interactive: bool) -> str | None:
    """The next line, or None at the end of input (Ctrl-D)."""
    if interactive:
        try:
            return input("> ")
        except EOFError:
            print(file=sys.stderr)
            return None
    line = stream.readline()
    return line if line else None


def _answer(engine, request: GenerateRequest, progress: Progress, compute: str, out: IO[str]) -> str:
    """Stream one answer to `out`; Ctrl-C ends it where it is. Returns its text."""

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
    progress.line(done.line(compute))
    if done.done.finish_reason == "error":
        raise RequestError(f"the answer failed inside the engine: {done.done.error}")
    return done.done.text
