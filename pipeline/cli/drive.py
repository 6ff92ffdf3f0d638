"""Running requests on an engine in this process for the front doors that watch them (generate, chat).

Owns the step loop a person sees: a prefill bar while long prompts are read, tokens handed to the caller as they
come, Ctrl-C ending the answers in flight between two steps (never inside one: a round leaves its state whole),
each request's timings from its lane, and the compute line a run shows once above them. The engine's own offline
loop (`Engine.generate`) stays the one for programs; what a round does is the engine's and the spec's.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from speclane.pipeline.cli.progress import Progress, timing_line

if TYPE_CHECKING:  # imported by `run`: the commands' parsers import this module, and these import torch
    from speclane.stages.contract.events import DoneEvent, TokenEvent


@attrs.define
class Finished:
    """One request's end: the engine's done event and the times read from its lane."""

    done: DoneEvent
    ttft: float  # submit -> first token (prefill, and queueing behind other lanes)
    decode_s: float  # first token -> last token

    def line(self) -> str:
        return timing_line(self.done.usage, self.ttft, self.decode_s, self.done.spec if self.spec_on else None)

    @property
    def spec_on(self) -> bool:
        return bool(self.done.spec.get("drafted"))


def compute_line(args: Any) -> str:
    """The compute path of a run (dtype, quantization, CPU and kernel routes), said once above its timing lines."""
    from speclane.kernels import cpu_build

    return f"compute: {args.dtype}{'+int8' if args.quant == 'int8' else ''}, {cpu_build.describe()}"


@contextlib.contextmanager
def interrupt_flag() -> Iterator[threading.Event]:
    """While the block runs, Ctrl-C sets the yielded event instead of raising (main thread only)."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda *_: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def run(
    engine,
    requests: Iterable,
    *,
    chat: bool = False,
    on_token: Callable[[TokenEvent], None] | None = None,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
) -> list[Finished]:
    """Run `requests` to completion as concurrent lanes; results in input order. When `stop` is set, every
    request still running is cancelled (it ends with finish_reason 'cancelled' and the tokens it had)."""
    from speclane.stages.contract.events import DoneEvent, TokenEvent

    progress = progress or Progress(enabled=False)
    pending = collections.deque(requests)
    order = {req.id: i for i, req in enumerate(pending)}
    lanes: dict[Any, Any] = {}
    done: dict[Any, DoneEvent] = {}
    cancelled = streamed = False
    with contextlib.ExitStack() as bar:
        advance = None  # a prefill bar, opened once a prompt takes more than one step to read
        while pending or engine.busy():
            while pending and len(engine.queue) < engine.max_queue:
                req = pending.popleft()
                lanes[req.id] = engine.submit(req, chat)
            if stop is not None and stop.is_set() and not cancelled:
                cancelled = True
                pending.clear()
                for rid in lanes:
                    engine.cancel(rid)
            events = engine.step()
            streams = any(isinstance(ev, TokenEvent) for ev in events)
            # The bar is drawn (and at its end erased) on the terminal the answer streams to: it closes before
            # the first token is written, and none opens once tokens have gone out, so it never erases output.
            read, total = _prompt_read(lanes.values())
            if advance is None and read < total and progress.enabled and not streamed:
                advance = bar.enter_context(
                    progress.task(
                        f"prefill ({total} prompt tokens)", total, done=f"prefill: {total} prompt tokens in {{s}} s"
                    )
                )
            if advance is not None:
                advance(read, total)
                if read >= total or streams:
                    bar.close()
                    advance = None
            streamed = streamed or streams
            for ev in events:
                if isinstance(ev, TokenEvent) and on_token is not None:
                    on_token(ev)
                elif isinstance(ev, DoneEvent):
                    done[ev.rid] = ev
    return [_finished(done[rid], lanes[rid]) for rid in sorted(order, key=order.get) if rid in done]


def _prompt_read(lanes: Iterable) -> tuple[int, int]:
    """Prompt tokens in the KV cache, and in all, over the lanes (a finished lane counts as read)."""
    read = total = 0
    for lane in lanes:
        n = len(lane.prompt_ids)
        total += n
        read += n if lane.finish_reason is not None or lane.out_ids else min(lane.kv_len, n)
    return read, total


def _finished(ev: DoneEvent, lane) -> Finished:
    ttft = lane.t_first - lane.t_submit if lane.t_first else 0.0
    decode = lane.t_done - lane.t_first if lane.t_first and lane.t_done else 0.0
    return Finished(ev, max(0.0, ttft), max(0.0, decode))
