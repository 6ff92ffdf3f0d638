"""Progress bars and closing timing lines on stderr, drawn with rich, for the commands a person watches.

`Progress` is on only when stderr is a terminal and the command is not asked for `--json`, so pipes, scripts and
tests see none of it. What is measured (tokens, times) comes from the engine's lanes; this module only shows it.
Not here: the stdout a command answers with, and the per-request log lines of `speclane serve` (logging).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as _Bars


class Progress:
    """Bars and lines on `stream` (default stderr) when `enabled` (default: the stream is a terminal)."""

    def __init__(self, enabled: bool | None = None, stream: IO[str] | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.console = Console(file=self.stream, highlight=False, force_terminal=self.enabled or None)

    @classmethod
    def for_args(cls, args: Any) -> "Progress":
        """Off under `--json` (the output is for a program), else on when stderr is a terminal."""
        return cls(enabled=False) if getattr(args, "json", None) else cls()

    def line(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, markup=False, soft_wrap=True)

    @contextlib.contextmanager
    def task(self, label: str, total: int | None = None, done: str | None = None) -> Iterator[Callable[..., None]]:
        """A bar for `label` while the block runs; yields `advance(completed, total=None, label=None)`. At the end
        prints `done` (formatted with `{s}`, the seconds) or '<label>: <s> s'."""
        start = time.perf_counter()
        if not self.enabled:
            yield _ignore
            return
        bars = _Bars(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        with bars:
            tid = bars.add_task(label, total=total)

            def advance(completed: int, total: int | None = None, label: str | None = None) -> None:
                update: dict[str, Any] = {"completed": completed}
                if total is not None:
                    update["total"] = total
                if label is not None:
                    update["description"] = label
                bars.update(tid, **update)

            yield advance
        seconds = time.perf_counter() - start
        self.line(done.format(s=f"{seconds:.1f}") if done else f"{label}: {seconds:.1f} s")

    def loader(self) -> Callable[[str, int, int | None], None]:
        """A `(what, done, total)` callback for speclane.stages.models.loading.load_model: one bar per `what`, ended
        when `done == total`. Conversion reports tensors; the weights' load reports 0 of 1, then 1 of 1."""
        if not self.enabled:
            return _ignore
        open_tasks: dict[str, tuple[contextlib.ExitStack, Callable[..., None]]] = {}

        def report(what: str, done: int, total: int | None) -> None:
            if what not in open_tasks:
                stack = contextlib.ExitStack()
                open_tasks[what] = (stack, stack.enter_context(self.task(what, total)))
            stack, advance = open_tasks[what]
            advance(done, total)
            if total is not None and done >= total:
                del open_tasks[what]
                stack.close()

        return report


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _ignore(*_args: Any, **_kw: Any) -> None:
    return None


def timing_line(usage: dict[str, int], ttft: float, decode_s: float, spec: dict[str, Any] | None) -> str:
    """The closing line of an answer: tokens in (the prompt) and out, time to first token, decode tokens per second,
    and tokens per round and acceptance when speculating. It fits 80 columns up to 999,999 tokens in, 99,999 out,
    1,000 s to the first token and 10,000 tok/s; the compute path is said once a run, on a line of its own."""
    out = usage.get("completion_tokens", 0)
    parts = [f"{usage.get('prompt_tokens', 0)} in, {out} out"]
    if out > 0:  # an answer stopped before its first token has no time to it
        parts.append(f"ttft {_figure(ttft, 2, 3)} s")
    decoded = out - 1  # the first token comes from prefill
    if decoded > 0 and decode_s > 0:
        parts.append(f"{_figure(decoded / decode_s, 1, 4)} tok/s")
    if spec and spec.get("drafted"):
        rate = spec["accepted"] / spec["drafted"]
        parts.append(f"{spec['tokens_per_round']:.2f} tok/round, {rate * 100:.0f} % accepted")
    return " | ".join(parts)


def _figure(x: float, decimals: int, digits: int) -> str:
    """`x` with `decimals` places, fewer once it has more than `digits - decimals` whole digits."""
    whole = len(str(int(x)))
    return f"{x:.{max(0, min(decimals, digits - whole))}f}"
