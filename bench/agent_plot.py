"""The agent replay's report: each backend's speed over `none`'s and `ngram`'s (`ratios`, `report`), the share of the
oracle's gain over ngram it reaches (`ceiling_share`), and a plot of tokens per round against turn, one line per
configuration, as a plain SVG file (no plotting package needed). Not here: the replay itself
(bench/agent_replay.py)."""

from __future__ import annotations

import statistics


def svg_plot(rows: list[dict], path: str) -> None:
    """Tokens per round against turn, one line per configuration, as a plain SVG file."""
    lines = {}
    for r in rows:
        key = (r["backend"], r["lanes"])
        lines.setdefault(key, []).append([t["decoded"] / max(1, t["rounds"]) for t in r["agents"]["per_turn"]])
    series = {k: [statistics.median(v) for v in zip(*runs)] for k, runs in lines.items()}
    turns = max(len(v) for v in series.values())
    top = max(max(v) for v in series.values()) * 1.1 or 1.0
    w, h, pad = 640, 400, 50
    x = lambda i: pad + (w - 2 * pad) * i / max(1, turns - 1)  # noqa: E731
    y = lambda v: h - pad - (h - 2 * pad) * v / top  # noqa: E731
    colors = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">']
    out.append(f'<rect width="{w}" height="{h}" fill="white"/>')
    out.append(f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>')
    out.append(f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>')
    for i in range(turns):
        out.append(f'<text x="{x(i):.0f}" y="{h - pad + 15}" text-anchor="middle">{i + 1}</text>')
    for j in range(5):
        v = top * j / 4
        out.append(f'<text x="{pad - 5}" y="{y(v):.0f}" text-anchor="end">{v:.1f}</text>')
    out.append(f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">turn</text>')
    out.append(
        f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" text-anchor="middle">tokens per round</text>'
    )
    for n, ((backend, lanes), vals) in enumerate(sorted(series.items())):
        c, dash = colors[n % len(colors)], "" if lanes == 1 else ' stroke-dasharray="5,3"'
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(vals))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{w - pad + 4 - 120}" y="{pad + 14 * n}" fill="{c}">{backend}, {lanes} lane(s)</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def ratios(rows: list[dict], backend: str, base: str, lanes: int, part: str) -> tuple[float, list[float]]:
    """`backend`'s decode speed over `base`'s: the ratio of the totals, and each group's ratio (groups paired by
    position: the same conversations, run one after the other)."""
    pick = lambda b: [r[part] for r in rows if r["backend"] == b and r["lanes"] == lanes and part in r]  # noqa: E731
    mine, theirs = pick(backend), pick(base)
    total = sum(m["tokens_per_s"] for m in mine) / max(1e-9, sum(t["tokens_per_s"] for t in theirs))
    each = [
        (g["decoded"] / g["seconds"]) / (h["decoded"] / h["seconds"])
        for m, t in zip(mine, theirs)
        for g, h in zip(m["groups"], t["groups"])
        if g["seconds"] > 0 and h["seconds"] > 0 and g["decoded"] and h["decoded"]
    ]
    return total, each


def ceiling_share(rows: list[dict], backend: str, oracle: str, lanes: int, part: str) -> float | None:
    """How much of the oracle's gain over ngram `backend` reaches, from the totals: (backend - ngram) / (oracle -
    ngram) in decode tokens per second. The oracle drafts every recorded answer at its width, so its speed is what
    any drafter could reach on this machine's passes, and the share reads a drafter against that ceiling rather
    than against ngram alone. None where the oracle is not faster than ngram."""
    gain, ceiling = ratios(rows, backend, "ngram", lanes, part)[0], ratios(rows, oracle, "ngram", lanes, part)[0]
    return (gain - 1.0) / (ceiling - 1.0) if ceiling > 1.0 else None


def report(rows: list[dict], args) -> None:
    """Per lane count and workload, each backend's tokens per round and speed over `none`'s and `ngram`'s: the
    ratio of the totals, then the median of the per-group ratios [first quartile, third quartile]; with an oracle
    and ngram in the run, each drafter's share of the oracle's gain over ngram (`ceiling_share`)."""
    oracle = next((b for b in args.backends if b.split(":")[0] == "oracle"), None)
    for n in args.lanes:
        for part in ("agents", "prose") if args.prose else ("agents",):
            print(f"{n} lane(s), {part}:")
            for b in args.backends:
                mine = [r[part] for r in rows if r["backend"] == b and r["lanes"] == n]
                cells = [f"{b:>14}: {statistics.median(m['tokens_per_round'] for m in mine):.2f} tok/round"]
                for base in ("none", "ngram"):
                    if base in args.backends and base != b:
                        total, each = ratios(rows, b, base, n, part)
                        q = statistics.quantiles(each, n=4) if len(each) > 1 else each * 3
                        cells.append(f"{total:.2f}x {base} (groups {q[1]:.2f} [{q[0]:.2f}, {q[2]:.2f}])")
                if oracle and "ngram" in args.backends and b not in ("none", "ngram", oracle):
                    share = ceiling_share(rows, b, oracle, n, part)
                    if share is not None:
                        cells.append(f"{share:.0%} of the oracle's gain over ngram")
                print("  " + "; ".join(cells))
