"""The soak's report (bench/soak.py): the lines printed from `soak.run`'s result. Per hostile kind the inputs sent
and the replies received beside what is expected; whether the server is still up and answering at the end; how
many normal streams equal their solo run; per normal stream the median and max gap between token messages and the
max's ratio to the calm phase's median gap, flagged past `FLAG_RATIO` (a figure, not a pass/fail).

Measures nothing. Not here: running the soak (bench/soak.py), its clients (bench/soak_clients.py).
"""

from __future__ import annotations

import statistics

from speclane.bench import hostile, hostile_http

FLAG_RATIO = 3.0  # a stream whose max gap is past this many calm median gaps is flagged
EXPECTED = {**hostile.EXPECTED, **hostile_http.EXPECTED}  # what each hostile kind should get back


def lines(res: dict) -> list[str]:
    """The report, from `run`'s result."""
    a, af = res["args"], res["after"]
    out = [
        f"soak: {a['seconds']:g} s asked; calm {res['calm_s']:.1f} s ({a['clients']} normal clients alone), hostile "
        f"{res['hostile_s']:.1f} s (beside them at most {a['hostile_rate']:g} hostile inputs/s a door); "
        f"{a['dtype']}, {a['max_tokens']} tokens a stream, speculation {'on' if a['spec'] else 'off'} for normal "
        f"streams, --max-message-bytes {a['max_message_bytes']}, HTTP {'off' if a['no_http'] else 'on'}",
        res["machine"],
        "",
        f"{'hostile kind':<18} {'sent':>5} {'replies':>7} {'unansw':>6} {'failed':>6} {'internal':>8}  "
        f"{'got (most common)':<42} expected",
    ]
    for kind, r in res["tally"].items():
        got = ", ".join(f"{k} {n}" for k, n in r["got"].most_common(3)) or "-"
        internal = r["got"]["internal"] + r["got"]["500"]
        out.append(
            f"{kind:<18} {r['sent']:>5} {r['replies']:>7} {r['unanswered']:>6} {r['failed']:>6} "
            f"{internal:>8}  {got:<42} {EXPECTED[kind]}"
        )
        if r["failure"]:
            out.append(f"{'':<18} last unanswered or failed: {r['failure']}")
    sent = sum(r["sent"] for r in res["tally"].values())
    out += [
        "",
        f"faults survived: {sent} hostile inputs; server up at the end: {'yes' if af['alive'] else 'NO'}; "
        f"stats: {af['finished']}; a generate after: {af['generate']}"
        + (f"; an HTTP completion after: {af['http']}" if "http" in af else "")
        + f"; tracebacks in its log: {af['tracebacks']}; exit status after SIGTERM: {af['exit']}",
    ]
    streams, calm = res["streams"], res["calm_median_gap"]
    exact = sum(r["exact"] for r in streams)
    out.append(
        f"normal streams exact: {exact} / {len(streams)} (token ids equal to the prompt's solo run); "
        f"failed: {sum(r['error'] is not None for r in streams)}"
    )
    out.append(f"calm median gap: {calm * 1e3:.1f} ms" if calm else "calm median gap: none (no calm stream ended)")
    out.append(
        f"{'#':>3} {'client':>6} {'phase':<7} {'prompt':<12} {'tokens':>6} {'exact':<5} {'ttft s':>6} "
        f"{'gap med ms':>10} {'gap max ms':>10} {'max/calm med':>12}"
    )
    ratios = {"calm": [], "hostile": []}
    for i, r in enumerate(streams):
        gaps = r["gaps"]
        med, top = (statistics.median(gaps), max(gaps)) if gaps else (float("nan"), float("nan"))
        ratio = top / calm if calm and gaps else float("nan")
        if gaps:
            ratios[r["phase"]].append(ratio)
        flag = "  past 3x" if ratio > FLAG_RATIO else ""
        ttft = f"{r['ttft']:6.2f}" if r["ttft"] is not None else f"{'-':>6}"
        out.append(
            f"{i:>3} {r['client']:>6} {r['phase']:<7} {r['prompt']:<12} {r['tokens']:>6} "
            f"{'yes' if r['exact'] else 'NO':<5} {ttft} {med * 1e3:10.1f} {top * 1e3:10.1f} {ratio:12.2f}{flag}"
            + (f"  error: {r['error']}" if r["error"] else "")
        )
    for phase, rs in ratios.items():
        if rs:
            out.append(
                f"{phase} streams with a max gap past {FLAG_RATIO:g}x the calm median: "
                f"{sum(x > FLAG_RATIO for x in rs)} / {len(rs)}; max/calm median: median "
                f"{statistics.median(rs):.2f}, largest {max(rs):.2f}"
            )
    return out
