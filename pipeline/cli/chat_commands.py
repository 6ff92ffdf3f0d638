"""`speclane chat`'s slash commands: what each `/command` line does, and the text it answers with.

Owns the command words (`/help`, `/set`, `/stats`, `/reset`, `/exit`) and their help text, the `/set` settings and
how a setting's text becomes a request field's value (checked as a request would check it, refused in a line that
names the setting), the settings line, and the `/stats` lines. Not here: reading turns, the conversation itself
and answering a turn (chat.py); running the requests and their timings (drive.py).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from speclane.pipeline.cli import drive
from speclane.pipeline.cli.progress import Progress
from speclane.pipeline.runtime.request import parse_request
from speclane.stages.contract.errors import RequestError, did_you_mean
from speclane.stages.contract.lanes import MAX_DRAFT_TOKENS
from speclane.stages.drafters import SPEC_BACKENDS

if TYPE_CHECKING:
    from speclane.pipeline.cli.chat import Conversation

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


def setting(name: str, text: str, sampling: dict) -> Any:
    """`/set name text`'s value, checked as a request field with the other `sampling` fields; a RequestError names
    the setting."""
    kind = NUMBERS.get(name)
    if kind is None and name != "spec":
        raise RequestError(
            f"/set: no setting '{name}'{did_you_mean(name, [*NUMBERS, 'spec'])}; the settings "
            f"are {', '.join([*NUMBERS, 'spec'])}",
            field=name,
        )
    try:
        value = _spec_setting(text) if kind is None else kind(text)
    except ValueError:
        raise RequestError(
            f"/set {name}: '{text}' is not {'a number' if kind is float else 'a whole number'}"
            if kind
            else f"/set spec: '{text}' is not off, on, or a number of draft tokens",
            field=name,
        ) from None
    _check(name, {**sampling, name: value})
    return value


def _spec_setting(text: str) -> dict:
    """`/set spec` as a request's `spec` field: off, on (the session's drafts) or at most N draft tokens a round."""
    if text in ("on", "off"):
        return {"enabled": text == "on"}
    if text in SPEC_BACKENDS:
        raise RequestError(
            f"/set spec: the drafter is chosen when chat starts (--spec-backend {text}); here: off, "
            f"on, or at most N draft tokens a round (1 to {MAX_DRAFT_TOKENS})",
            field="spec",
        )
    if not 1 <= int(text) <= MAX_DRAFT_TOKENS:
        raise RequestError(
            f"/set spec: draft tokens go from 1 to {MAX_DRAFT_TOKENS} (off: none), got {text}", field="spec"
        )
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
    lines = [
        f"last answer   {answers[-1].line()}",
        f"conversation  {len(answers)} answer(s), {sum(outs)} tokens out: "
        f"{sum(f.ttft for f in answers):.2f} s to first tokens, {decoding:.2f} s decoding{rate}",
        f"context       {answers[-1].done.usage.get('total_tokens', 0)} of {max_len} tokens (--max-len)",
    ]
    spec = [(f.done.spec, n - 1) for f, n in zip(answers, outs) if f.spec_on]
    if spec:
        rounds, drafted = sum(s["rounds"] for s, _ in spec), sum(s["drafted"] for s, _ in spec)
        lines.append(
            f"speculation   {sum(n for _, n in spec) / rounds:.2f} tok/round, "
            f"{sum(s['accepted'] for s, _ in spec) / drafted * 100:.0f} % of {drafted} drafted tokens "
            "accepted"
        )
    return lines


def command(line: str, conv: Conversation, engine, answers: list, progress: Progress) -> bool:
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
        print(settings(conv, engine), file=sys.stderr)
    elif name == "/set" and len(rest) == 2:
        try:
            conv.set(*rest)
        except RequestError as exc:
            print(f"speclane chat: {exc}", file=sys.stderr)
        else:
            progress.line(f"({settings(conv, engine)})")
    elif name == "/set":
        print(
            "speclane chat: /set takes a setting and a value, as /set temperature 0.7 (/help lists them)",
            file=sys.stderr,
        )
    else:
        print(
            f"speclane chat: no command {name}; /help lists them (//text sends text that begins with '/')",
            file=sys.stderr,
        )
    return True


def settings(conv: Conversation, engine) -> str:
    """The settings the next answer takes, the defaults included."""
    req = parse_request({"prompt": "-", **conv.sampling})
    drafts = engine.draft_tokens if engine.drafter is not None else 0
    spec = (
        "off (started without a drafter)"
        if not drafts
        else "off"
        if not req.spec.enabled
        else f"on, at most {min(req.spec.draft_tokens or drafts, drafts)} draft tokens a round"
    )
    seed = "" if req.seed is None else f", seed {req.seed}"
    return (
        f"temperature {req.temperature:g}, max_tokens {req.max_tokens}, top_p {req.top_p:g}, "
        f"top_k {req.top_k}{seed}; spec {spec}"
    )
