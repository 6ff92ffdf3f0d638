"""The PNG plots of a bench result (the JSON `speclane bench` writes): speedup against draft tokens, acceptance per
position, speedup against lanes and against prompt length, and speclane's tokens per second beside the peers'.

Every plot carries a footer that names the machine (CPU model, torch's CPU capability and the compute route with
the ISA the C kernels were built for, as the result recorded them), the code (commit, or the package version outside
a checkout) and the samples behind each point; every point with repeats draws its spread (median, bars from min to
max); and whatever a section skipped (a drafter, a peer) is written in the plot with its reason, never left out
silently. matplotlib is imported only here and only when plotting (the `bench` extra); `plotting_missing` says,
before a run, when it cannot be. Not here: the text tables and the derived figures (bench/report.py); measuring.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from speclane.bench.report import PEER_KEYS

FOOTER_CHARS = 120  # a footer line's wrap width: 6 pt text across the narrowest figure (6 in) holds about this many
FOOTER_PT = 6.0


def plotting_missing() -> str | None:
    """Why `plots` cannot draw here (matplotlib does not import), naming the package and its install; None when
    it can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return (
            f"--plot needs the matplotlib package, which does not import here ({exc}): install it with "
            "`pip install matplotlib` (or `pip install -e '.[bench]'`), or leave out --plot"
        )
    return None


def code_of(machine: dict) -> str:
    """The code a result measured: 'commit <hash>', or the package version a run outside a git checkout recorded
    ('speclane 0.1.0'), or says that the result holds neither."""
    commit = machine.get("commit")
    if not commit or commit == "unknown":
        return "commit not recorded"
    return commit if commit.startswith("speclane ") else f"commit {commit}"


def samples_of(ns: set[int]) -> str:
    """'n=4 per point' (or 'n=2 to 4 per point') from the sample counts of the spreads a plot draws."""
    if not ns:
        return "samples per point not recorded"
    lo, hi = min(ns), max(ns)
    return f"n={lo} per point" if lo == hi else f"n={lo} to {hi} per point"


SPREAD = "median, bars min to max"


def _wrap(line: str) -> list[str]:
    """A footer line in lines of FOOTER_CHARS, broken at spaces only (a command or a package name stays whole)."""
    return textwrap.wrap(line, FOOTER_CHARS, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


def stamp(res: dict, ns: set[int], how: str = SPREAD) -> list[str]:
    """The footer's lines: machine, compute route, code, command and the sample count behind each point (`how`
    says what a point and its bars are)."""
    m = res.get("machine", {})
    threads = m.get("torch_threads", "?")
    lines = [
        f"machine: {m.get('cpu', 'not recorded')}, {m.get('cores', '?')} cores; torch {m.get('torch', '?')} on "
        f"{threads} thread(s), {m.get('dtype', '?')}",
        f"compute: {m.get('compute', 'CPU capability and kernel build not recorded in this result')}",
        f"code: {code_of(m)}; {samples_of(ns)} ({how}); {res.get('command', '')}".rstrip("; "),
    ]
    return [w for line in lines for w in _wrap(line)]


def skipped_lines(skipped: dict[str, str]) -> list[str]:
    """One 'name: skipped (why)' line a skipped drafter or peer, wrapped to the footer's width."""
    return [w for name, why in skipped.items() for w in _wrap(f"{name}: skipped ({why})")]


def _err(spreads: list[dict]) -> list[list[float]]:
    """errorbar's yerr from spreads: distances from the median down to min and up to max."""
    return [[s["median"] - s["min"] for s in spreads], [s["max"] - s["median"] for s in spreads]]


def _finish(fig, res: dict, ns: set[int], skipped: list[str], how: str = SPREAD, notes: dict | None = None) -> None:
    """Write the footer (skips first, in red, then `notes`, then the stamp) and lay the axes out above it."""
    stamp_lines = [w for name, note in (notes or {}).items() for w in _wrap(f"{name}: {note}")] + stamp(res, ns, how)
    line_in = FOOTER_PT * 1.35 / 72  # a line's height in inches
    height = fig.get_figheight()
    y = 0.08 / height
    fig.text(0.01, y, "\n".join(stamp_lines), fontsize=FOOTER_PT, va="bottom", ha="left", color="0.25")
    y += len(stamp_lines) * line_in / height
    if skipped:
        fig.text(0.01, y, "\n".join(["not shown:", *skipped]), fontsize=FOOTER_PT, va="bottom", color="firebrick")
        y += (len(skipped) + 1) * line_in / height
    fig.tight_layout(rect=(0, y + 0.02, 1, 1))


def _draft_tokens(plt, res: dict) -> dict:
    fig, ax = plt.subplots(figsize=(6, 4.8))
    fig2, ax2 = plt.subplots(figsize=(6, 4.8))
    ns: set[int] = set()
    runs: set[int] = set()
    skipped: dict[str, str] = {}
    for w, sec in res["draft_tokens"].items():
        skipped |= {f"{b} on {w}": why for b, why in sec.get("skipped", {}).items()}
        by: dict[str, list] = {}
        for r in sec["rows"].values():
            if r["backend"] != "off":
                by.setdefault(r["backend"], []).append(r)
        for b, rs in by.items():
            rs.sort(key=lambda r: r["k"])
            spreads = [r["speedup"] for r in rs]
            ns |= {s["n"] for s in spreads}
            ks = [r["k"] for r in rs]
            ax.errorbar(
                ks, [s["median"] for s in spreads], yerr=_err(spreads), marker="o", capsize=3, label=f"{b}, {w}"
            )
            top = max(rs, key=lambda r: r["k"])
            runs.add(top["decode_tps"]["n"])
            acc = top["accepted_per_position"][: top["k"]]
            ax2.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{b}, {w} (k={top['k']})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="draft tokens k", ylabel="decode speedup vs off", title="Speedup against draft tokens")
    ax.legend(fontsize=7)
    ax2.set(xlabel="draft position", ylabel="accepted | earlier accepted", title="Acceptance per position")
    ax2.set_ylim(0, 1.05)
    ax2.legend(fontsize=7)
    lines = skipped_lines(skipped)
    _finish(fig, res, ns, lines)
    _finish(fig2, res, runs, lines, how="runs pooled: one rate per position over all their rounds, no per-run spread")
    return {"speedup_vs_draft_tokens.png": fig, "acceptance_per_position.png": fig2}


def _lanes(plt, matplotlib, res: dict) -> dict:
    sec = res["lanes"]
    fig, ax = plt.subplots(figsize=(6, 4.8))
    by: dict[str, list] = {}
    for r in sec["rows"]:
        if "speedup" in r:
            by.setdefault(r["config"], []).append(r)
    ns: set[int] = set()
    for cfg, rs in by.items():
        spreads = [r["speedup"] for r in rs]
        ns |= {s["n"] for s in spreads}
        xs = [r["lanes"] for r in rs]
        ax.errorbar(xs, [s["median"] for s in spreads], yerr=_err(spreads), marker="o", capsize=3, label=f"ngram {cfg}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(
        xscale="log",
        xlabel="lanes",
        ylabel="aggregate speedup vs off",
        title=f"Speedup against lanes ({sec['workload']})",
    )
    ax.set_xticks(sorted({r["lanes"] for r in sec["rows"]}), labels=None)
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    _finish(fig, res, ns, skipped_lines(sec.get("skipped", {})))
    return {"speedup_vs_lanes.png": fig}


def _lengths(plt, res: dict) -> dict:
    fig, ax = plt.subplots(figsize=(6, 4.8))
    buckets = list(res["lengths"])
    first = res["lengths"][buckets[0]]["rows"]
    ns: set[int] = set()
    skipped = {f"{name} at {b}": why for b in buckets for name, why in res["lengths"][b].get("skipped", {}).items()}
    nan = {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    for name in (n for n in first if n != "off"):
        for n in first[name]["speedup"]:
            spreads = [res["lengths"][b]["rows"].get(name, {}).get("speedup", {}).get(n) or nan for b in buckets]
            ns |= {s["n"] for s in spreads if "n" in s}
            ys = [s["median"] for s in spreads]
            ax.errorbar(buckets, ys, yerr=_err(spreads), marker="o", capsize=3, label=f"{name}, {n} new tokens")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="prompt tokens (bucket)", ylabel="decode speedup vs off", title="Speedup against prompt length")
    ax.legend(fontsize=7)
    _finish(fig, res, ns, skipped_lines(skipped))
    return {"speedup_vs_prompt_length.png": fig}


def _peers(plt, res: dict) -> dict:
    pe = res["peers"]
    work = [w for w in pe if w not in PEER_KEYS]
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ns: set[int] = set()
    if work:
        names = list(pe[work[0]])
        width = 0.8 / len(work)
        for j, w in enumerate(work):
            spreads = [pe[w][n]["decode_tps"] for n in names]
            ns |= {s["n"] for s in spreads}
            xs = [i + j * width for i in range(len(names))]
            ax.bar(xs, [s["median"] for s in spreads], width, yerr=_err(spreads), capsize=3, label=w)
        ax.set_xticks([i + width * (len(work) - 1) / 2 for i in range(len(names))], names, rotation=20, fontsize=8)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no workload measured", transform=ax.transAxes, ha="center", va="center")
    ax.set(ylabel="decode tokens/s (median)", title="speclane beside its peers")
    _finish(fig, res, ns, skipped_lines(pe.get("skipped", {})), notes=pe.get("notes"))
    return {"peers.png": fig}


def figures(res: dict) -> dict:
    """The figures of every section `res` holds, by file name, each with its footer; not saved, not closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict = {}
    if res.get("draft_tokens"):
        out |= _draft_tokens(plt, res)
    if res.get("lanes"):
        out |= _lanes(plt, matplotlib, res)
    if res.get("lengths"):
        out |= _lengths(plt, res)
    if res.get("peers"):
        out |= _peers(plt, res)
    return out


def plots(res: dict, directory: Path) -> list[Path]:
    """speedup vs draft tokens per workload, speedup vs lanes per row budget, acceptance per position, speedup vs
    prompt length, and our tokens per second beside the peers'. Returns the files written."""
    figs = figures(res)  # selects the Agg backend before pyplot is imported here
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figs.items():
        path = directory / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
