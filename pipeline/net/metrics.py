"""The server's metrics in Prometheus' text format, named as vLLM's (`vllm:` becomes `speclane:`), so the dashboards
vLLM users keep read them with a changed prefix.

Owns the registry of one server (never prometheus_client's global one) and what is counted when: tokens, drafts
and latencies as the serve loop sees each step's events, and the live figures (requests by finish reason, lanes,
queue, prompt checkpoints) read from the server when a scrape asks. A scrape is rendered on the serve loop (the
`metrics` message of the ZeroMQ protocol, which the HTTP door's `GET /metrics` sends), so it reads the engine
between two steps, never during one. Not here: the routes (http.py), the messages (protocol.py).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from speclane.stages.contract.events import DoneEvent, TokenEvent

# vLLM's buckets for the two latency histograms, in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)


class Metrics:
    """One server's metrics. `begin` when a generate request is taken, `on_events` with each engine step's events,
    `render(server)` for a scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.prompt_tokens = Counter("speclane:prompt_tokens", "Prompt tokens of ended requests", registry=reg)
        self.generation_tokens = Counter("speclane:generation_tokens", "Tokens generated", registry=reg)
        self.ttft = Histogram(
            "speclane:time_to_first_token_seconds",
            "From a request's arrival at the server to its first token",
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "speclane:inter_token_latency_seconds",
            "Between two steps that gave a request tokens (one observation a step: a round's accepted drafts "
            "arrive together)",
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.drafted = Counter(
            "speclane:spec_decode_num_draft_tokens_per_pos",
            "Drafts proposed at each draft position (0: the first draft of a round), counted as requests end",
            ["position"],
            registry=reg,
        )
        self.accepted = Counter(
            "speclane:spec_decode_num_accepted_tokens_per_pos",
            "Drafts accepted at each draft position, counted as requests end",
            ["position"],
            registry=reg,
        )
        self._start: dict[Any, float] = {}  # engine rid -> when the server took it
        self._last: dict[Any, float] = {}  # engine rid -> when its latest tokens arrived
        self._live = _Live()
        reg.register(self._live)

    def begin(self, rid: Any) -> None:
        self._start[rid] = time.perf_counter()

    def forget(self, rid: Any) -> None:
        """`rid` ended without reaching the engine's end (refused as it was queued, or aborted)."""
        self._start.pop(rid, None)
        self._last.pop(rid, None)

    def on_events(self, events: list, engine: Any) -> None:
        """Count one step's events: latencies for the tokens, totals and drafts for the requests that ended."""
        now, seen, tokens = time.perf_counter(), set(), 0
        for ev in events:
            if isinstance(ev, TokenEvent):
                tokens += 1
                if ev.rid in seen:
                    continue
                seen.add(ev.rid)
                if ev.index == 0 and ev.rid in self._start:
                    self.ttft.observe(now - self._start[ev.rid])
                elif ev.rid in self._last:
                    self.itl.observe(now - self._last[ev.rid])
                self._last[ev.rid] = now
            elif isinstance(ev, DoneEvent):
                self._start.pop(ev.rid, None)
                self._last.pop(ev.rid, None)
                self.prompt_tokens.inc(ev.usage.get("prompt_tokens", 0))
                lane = next((lane for lane in reversed(getattr(engine, "retired", ())) if lane.rid == ev.rid), None)
                for i, (offered, accepted) in enumerate(zip(lane.offered_at, lane.accepted_at) if lane else ()):
                    self.drafted.labels(str(i)).inc(offered)
                    self.accepted.labels(str(i)).inc(accepted)
        if tokens:
            self.generation_tokens.inc(tokens)

    def render(self, server: Any) -> str:
        """The text a scrape answers, with the live figures of `server` (read now, on the serve loop)."""
        self._live.server = server
        try:
            return generate_latest(self.registry).decode()
        finally:
            self._live.server = None


class _Live:
    """Figures read from the server at scrape time, where they already have one home."""

    server: Any = None

    def describe(self) -> list:
        return []

    def collect(self):
        server = self.server
        if server is None:
            return
        ended = CounterMetricFamily(
            "speclane:request_success",
            "Requests ended, by finish reason (stop, length, cancelled, and the error codes that ended one)",
            labels=["finished_reason"],
        )
        for reason, n in sorted(server.finished.items()):
            ended.add_metric([reason], n)
        yield ended
        eng = server.engine
        yield GaugeMetricFamily("speclane:num_requests_running", "Requests in a lane", value=len(eng.lanes.active))
        yield GaugeMetricFamily(
            "speclane:num_requests_waiting", "Requests taken but not yet in a lane", value=len(server.waiting())
        )
        passes = CounterMetricFamily(
            "speclane:target_passes",
            "Target passes run, by kind: verify (a round alone), one_pass (a round with prompt rows), prefill",
            labels=["kind"],
        )
        for kind, n in sorted(getattr(eng, "passes", {}).items()):
            passes.add_metric([kind], n)
        yield passes
        store = getattr(eng, "checkpoints", None)
        if store is None:
            return
        stats = store.stats()
        for name, key, what in (
            ("hits", "hits", "Requests that started from a kept prompt checkpoint"),
            ("misses", "misses", "Requests that found no prompt checkpoint to start from"),
            ("reused_tokens", "tokens_reused", "Prompt tokens restored from checkpoints instead of prefilled"),
        ):
            yield CounterMetricFamily(f"speclane:checkpoint_{name}", what, value=stats[key])
        yield GaugeMetricFamily(
            "speclane:checkpoint_bytes",
            "Bytes of prompt checkpoints held on the model's device",
            value=stats["bytes_held"],
        )
        yield GaugeMetricFamily(
            "speclane:checkpoint_host_bytes",
            "Bytes of prompt checkpoints held in host memory",
            value=stats["host_bytes_held"],
        )
