"""The `experts` section's tables and plot: the policy study (hit rate and copies per lookup per policy against
Belady's), the paired speed ratios of the 25 % tier, and per cell decode tokens per second, expert bytes copied per
committed token and the live hit rate per fast-tier size, and the plan check (the plan's pick against the measured
best, cell by cell).

The plot is SVG written here (no plotting package needed). Not here: measuring (bench/experts.py).
"""

from __future__ import annotations

from pathlib import Path

from speclane.bench import plan_check

POLICY_ORDER = ("lru", "per_layer_lru", "lfu", "decay", "static", "per_layer", "next_use", "next_use+pf2", "belady")
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _pct(x: float) -> str:
    return f"{x * 100:.0f}"


def lines(sec: dict) -> list[str]:
    """The section as text lines."""
    out = [f"experts: {sec['target']}; one expert {sec['expert_bytes'] / 1024:.0f} KiB, {sec['experts']} in all"]
    m = sec["moefied"]
    out.append(
        f"  fit: router recall {m['router_recall_mean']:.2f}, activation energy kept {m['kept_energy_mean']:.2f}, "
        f"look-ahead hit {m['lookahead_hit_mean']:.2f}; live policy {sec['kept_policy']}; model {sec['model_dir']}"
    )
    sizes = list(sec["slots"])
    out.append(
        f"  policy study, held-out decode lookups ({sec['study_tokens']} tokens a prompt; prefill warms the slots): "
        "hit rate % / copies a lookup"
    )
    out.append("  " + " " * 18 + "".join(f"{p:>14}" for p in POLICY_ORDER))
    for setting, by_size in sec["study"].items():
        for n in sizes:
            st = by_size[n]
            row = "".join(
                f"{_pct(st[p]['hit_rate']) + ' / ' + format(st[p]['copies'], '.2f'):>14}" for p in POLICY_ORDER
            )
            out.append(f"  {setting:<12}{n:>5} {row}")
        tuned = by_size[sizes[0]]["tuned"]
        out.append(f"  {'':<12}tuned on the training trace: decay {tuned['decay']}, fade {tuned['fade']}")
    out.append("  decode tokens/s at 1 lane, 25 % tier / every expert resident (median [min, max] of paired runs):")
    for name, sp in sec["speed"].items():
        parts = [f"{m} {r['median']:.2f} [{r['min']:.2f}, {r['max']:.2f}]" for m, r in sp["ratio"].items()]
        same = "same tokens" if sp["identical"] else "TOKENS DIFFER"
        out.append(
            f"  {name:<6} resident {sp['tps']['resident']['median']:.1f} tok/s; " + "; ".join(parts) + f"; {same}"
        )
    head = "  lanes setting    " + "".join(f"{'tok/s ' + n:>12}" for n in ["resident", *sizes])
    out.append(head + "".join(f"{'MB/tok ' + n:>11}" for n in sizes) + "".join(f"{'hit ' + n:>8}" for n in sizes))
    for c in sec["cells"]:
        row = f"  {c['lanes']:>5} {c['setting']:<10}" + "".join(
            f"{c['tps'][n]['median']:>12.2f}" for n in ["resident", *sizes]
        )
        row += "".join(f"{c['copied'][n] / 1e6:>11.2f}" for n in sizes)
        out.append(
            row + "".join(f"{_pct(c['hit_rate_live'][n]):>8}" for n in sizes) + ("" if c["identical"] else " DIFFER")
        )
    for name, why in sec.get("skipped", {}).items():
        out.append(f"  skipped {name}: {why}")
    return out + plan_lines(sec.get("plan_check"))


def plan_lines(pc: dict | None) -> list[str]:
    """The plan check (bench/experts_plan.py `plan_agreement`) as text lines: the tally, then a line a cell."""
    if pc is None:
        return []
    if "error" in pc:
        return [f"  plan check: not run ({pc['error']})"]
    t, c = pc["tally"], pc["choice"]
    out = [
        f"  plan check, profile {pc['profile']} (its choice: {c['backend']} k {c['draft_tokens']} rows "
        f"{c['row_budget']}): {t['best']} cell(s) the best, {t['within']} within the interval, "
        f"{t['disagree']} disagree"
    ]
    return out + ["    " + line for line in plan_check.lines(pc["cells"])] + copy_lines(pc)


def copy_lines(pc: dict) -> list[str]:
    """The copy check (bench/experts_plan.py `copy_agreement`): per cell and tier, expert MB copied a committed token
    and the copies' ms a token, predicted against measured (ms measured only where the speed part ran it)."""
    if not pc.get("copies"):
        return []
    out = [
        f"  expert copies, round model (link {pc['link'] / 1e9:.2f} GB/s from the copy probe) / measured: MB a token;"
        " ms a token (measured: 1/tok/s copying - 1/tok/s in place, speed part)"
    ]
    for r in pc["copies"]:
        ms = f"{r['predicted_s'] * 1e3:.2f}" + (f" / {r['measured_s'] * 1e3:.2f}" if "measured_s" in r else "")
        out.append(
            f"    {r['lanes']} x {r['setting']:<9} {r['tier']:>4}: {r['predicted_bytes'] / 1e6:6.2f} / "
            f"{r['measured_bytes'] / 1e6:6.2f} MB; {ms} ms"
        )
    return out


def _svg(title: str, xlabels: list[str], series: dict[str, list[float]], ylabel: str) -> str:
    """A line chart: one polyline per series over the categories `xlabels`."""
    w, h, left, bottom, top = 640, 320, 60, 70, 30
    values = [v for vs in series.values() for v in vs if v == v]
    hi = max(values, default=1.0) * 1.1 or 1.0
    x = lambda i: left + (w - left - 20) * (i + 0.5) / max(1, len(xlabels))  # noqa: E731
    y = lambda v: h - bottom - (h - bottom - top) * v / hi  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10">',
        f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="12">{title}</text>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
        f'<text x="12" y="{(h - bottom + top) / 2}" transform="rotate(-90 12 {(h - bottom + top) / 2})" '
        f'text-anchor="middle">{ylabel}</text>',
    ]
    for t in range(5):
        v = hi * t / 4
        parts.append(f'<text x="{left - 4}" y="{y(v) + 3:.1f}" text-anchor="end">{v:.3g}</text>')
    for i, label in enumerate(xlabels):
        parts.append(
            f'<text x="{x(i):.1f}" y="{h - bottom + 12}" transform="rotate(40 {x(i):.1f} {h - bottom + 12})">'
            f"{label}</text>"
        )
    for j, (name, vs) in enumerate(series.items()):
        colour = COLOURS[j % len(COLOURS)]
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(vs) if v == v)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        parts.append(f'<text x="{w - 120}" y="{top + 12 * j}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def plot(sec: dict, directory: Path) -> list[Path]:
    """experts_tps.svg (median tokens per second per cell and fast-tier size) and experts_hit_rate_<size>.svg (hit
    rate per study setting under each policy and Belady's, at the two smallest tiers)."""
    directory.mkdir(parents=True, exist_ok=True)
    cells = sec["cells"]
    labels = [f"{c['lanes']}x {c['setting']}" for c in cells]
    sizes = list(sec["slots"])
    tps = {n: [c["tps"][n]["median"] for c in cells] for n in ["resident", *sizes]}
    written = []
    path = directory / "experts_tps.svg"
    path.write_text(_svg("Decode tokens/s by fast tier (share of experts)", labels, tps, "tokens/s"))
    written.append(path)
    settings = list(sec["study"])
    for n in sizes[:2]:
        hits = {p: [sec["study"][s][n][p]["hit_rate"] for s in settings] for p in POLICY_ORDER}
        path = directory / f"experts_hit_rate_{n.rstrip('%')}.svg"
        path.write_text(_svg(f"Hit rate, fast tier {n} of the experts", settings, hits, "hit rate"))
        written.append(path)
    return written
