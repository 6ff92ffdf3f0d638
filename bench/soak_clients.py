"""The soak's clients (bench/soak.py): normal clients, each running greedy streams one after another and stamping
each token message's arrival, judged against the prompt's solo run; and the driver that sends a door's hostile
kinds in turn at a bounded rate, tallying inputs, replies and failures per kind.

Not here: the hostile inputs themselves (bench/hostile.py, bench/hostile_http.py), the server and the phases
(bench/soak.py), the report (bench/soak_report.py).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time

from speclane.bench import hostile, workloads
from speclane.pipeline.net.client import Client


def normal_prompts(n: int) -> list[dict]:
    """`n` prompts, the workloads taken in turn (code_edit-00, code_gen-00, prose-00, code_edit-01, ...)."""
    rows = workloads.load()
    per = [workloads.pick(rows, w, n) for w in workloads.WORKLOADS]
    return [p for group in itertools.zip_longest(*per) for p in group if p is not None][:n]


def one_stream(endpoint: str, prompt: dict, args, client_no: int = -1) -> dict:
    """One greedy stream: its token ids (from the token messages and from `done`), arrival stamps, or its error."""
    row = {
        "client": client_no,
        "prompt": prompt["id"],
        "ids": [],
        "done_ids": None,
        "stamps": [],
        "error": None,
        "start": time.monotonic(),
    }
    try:
        with Client(endpoint, timeout=args.timeout) as client:
            stream = client.generate(
                messages=[{"role": "user", "content": prompt["user"]}],
                max_tokens=args.max_tokens,
                ignore_eos=True,
                spec={"enabled": args.spec},
            )
            for tok in stream:
                row["stamps"].append(time.monotonic())
                row["ids"].append(tok.token_id)
            row["done_ids"] = list(stream.done.token_ids)
    except Exception as exc:  # noqa: BLE001 - a failed normal stream is a finding, reported with the others
        row["error"] = f"{type(exc).__name__}: {exc}"[:160]
    row["end"] = time.monotonic()
    return row


def normal_client(no: int, endpoint: str, prompts: list[dict], args, until: threading.Event, out: list) -> None:
    """Streams one after another, prompts in turn from the `no`-th, until `until` is set."""
    for k in itertools.count(no):
        if until.is_set():
            return
        out.append(one_stream(endpoint, prompts[k % len(prompts)], args, no))


def judge(row: dict, solo: dict[str, list[int]]) -> None:
    """Exactness against the solo run, and the gaps between token messages (seconds)."""
    ref = solo.get(row["prompt"])
    row["exact"] = row["error"] is None and ref is not None and row["ids"] == ref and row["done_ids"] == ref
    row["gaps"] = [b - a for a, b in zip(row["stamps"], row["stamps"][1:])]
    row["ttft"] = row["stamps"][0] - row["start"] if row["stamps"] else None
    row["tokens"] = len(row["ids"])


# --- hostile clients ------------------------------------------------------------------------------------------
def drive(door: hostile.Door, kinds: dict, rate: float, until: threading.Event, tally: dict) -> None:
    """Each kind in turn, at most `rate` inputs a second, until `until` is set and every kind was tried once (on a
    loaded machine the calm phase can take most of a short soak). This thread alone writes the tally rows of
    `kinds`."""
    for tried, name in enumerate(itertools.cycle(kinds)):
        if until.is_set() and tried >= len(kinds):
            return
        t0, row, got = time.monotonic(), tally[name], []
        try:
            got = kinds[name](door)
            row["sent"] += 1
        except hostile.AtBound as exc:
            row["at_bound"] += 1
            got = exc.labels
        except Exception as exc:  # noqa: BLE001 - no reply, or a reset or timeout on our side: counted, and on
            row["sent"] += 1
            row["unanswered" if isinstance(exc, hostile.Unanswered) else "failed"] += 1
            row["failure"] = f"{type(exc).__name__}: {exc}"[:120]
        row["replies"] += len(got)
        row["got"].update(got)
        until.wait(max(0.0, 1.0 / rate - (time.monotonic() - t0)))


def new_tally(kinds) -> dict:
    return {
        k: {
            "sent": 0,
            "replies": 0,
            "unanswered": 0,
            "failed": 0,
            "at_bound": 0,
            "failure": "",
            "got": collections.Counter(),
        }
        for k in kinds
    }
