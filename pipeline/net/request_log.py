"""One log line per request, as llama.cpp's and vLLM's servers print: who, how long, how fast; or why it was refused
or failed (every error the server answers, a refused message included), or that its client went away.

`speclane serve` shows it on stderr (logger `speclane.requests` at INFO); a library user of `Server` sees it only
when their logging says so. Times come from the engine's lane: submit (tokenizing included) to first token, and
the decode rate after it.
"""

from __future__ import annotations

import logging

from speclane.stages.contract.events import DoneEvent

log = logging.getLogger("speclane.requests")


def log_done(engine, client_id, ev: DoneEvent) -> None:
    """Log the request that `ev` ends (its lane is among the engine's most recently retired)."""
    if not log.isEnabledFor(logging.INFO):
        return
    lane = next((lane for lane in reversed(engine.retired) if lane.rid == ev.rid), None)
    usage, spec = ev.usage, ev.spec or {}
    parts = [
        ev.finish_reason,
        f"prompt {usage.get('prompt_tokens', 0)} + completion {usage.get('completion_tokens', 0)} tokens",
    ]
    if lane is not None and lane.t_first and lane.t_done:
        decoded = max(0, usage.get("completion_tokens", 0) - 1)
        span = lane.t_done - lane.t_first
        parts.append(f"ttft {lane.t_first - lane.t_submit:.2f} s")
        if decoded and span > 0:
            parts.append(f"{decoded / span:.1f} tok/s")
    if spec.get("rounds"):
        parts.append(f"{spec['tokens_per_round']:.2f} tokens/round")
    log.info("request %r: %s", client_id, ", ".join(parts))


def log_error(msg) -> None:
    """Log a request refused or failed: an error message (`protocol.Error`) the server sends."""
    if not log.isEnabledFor(logging.INFO):
        return
    where = f" on field {msg.field!r}" if msg.field else ""
    text = msg.message if len(msg.message) <= 200 else msg.message[:197] + "..."
    log.info("request %r: error %s%s: %s", msg.id, msg.code, where, text)


def log_gone(client_id) -> None:
    """Log a request cancelled because its client went away (nothing else is sent for it)."""
    log.info("request %r: cancelled, its client went away", client_id)
