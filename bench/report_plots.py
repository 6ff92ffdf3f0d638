"""The PNG plots of a bench result (the JSON `speclane bench` writes): speedup against draft tokens, acceptance per
position, speedup against lanes and against prompt length, and speclane's tokens per second beside the peers'.

matplotlib is imported only here and only when plotting (the `bench` extra); `plotting_missing` says, before a
run, when it cannot be. Not here: the text tables and the derived figures (bench/report.py); measuring anything.
"""

from __future__ import annotations

from pathlib import Path

from speclane.bench.report import PEER_KEYS


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


def plots(res: dict, directory: Path) -> list[Path]:
    """speedup vs draft tokens per workload, speedup vs lanes per row budget, acceptance per position, and our
    tokens per second beside the peers'. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        path = directory / name
        fig.tight_layout()
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)

    if res.get("draft_tokens"):
        fig, ax = plt.subplots(figsize=(6, 4))
        fig2, ax2 = plt.subplots(figsize=(6, 4))
        for w, sec in res["draft_tokens"].items():
            by: dict[str, list] = {}
            for r in sec["rows"].values():
                if r["backend"] != "off":
                    by.setdefault(r["backend"], []).append(r)
            for b, rs in by.items():
                rs.sort(key=lambda r: r["k"])
                ax.errorbar(
                    [r["k"] for r in rs],
                    [r["speedup"]["median"] for r in rs],
                    yerr=[
                        [r["speedup"]["median"] - r["speedup"]["min"] for r in rs],
                        [r["speedup"]["max"] - r["speedup"]["median"] for r in rs],
                    ],
                    marker="o",
                    capsize=3,
                    label=f"{b}, {w}",
                )
                top = max(rs, key=lambda r: r["k"])
                acc = top["accepted_per_position"][: top["k"]]
                ax2.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{b}, {w} (k={top['k']})")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xlabel="draft tokens k", ylabel="decode speedup vs off", title="Speedup against draft tokens")
        ax.legend(fontsize=7)
        ax2.set(
            xlabel="draft position",
            ylabel="accepted | earlier accepted",
            title="Acceptance per position",
            ylim=(0, 1.05),
        )
        ax2.legend(fontsize=7)
        save(fig, "speedup_vs_draft_tokens.png")
        save(fig2, "acceptance_per_position.png")
    if res.get("lanes"):
        fig, ax = plt.subplots(figsize=(6, 4))
        by = {}
        for r in res["lanes"]["rows"]:
            if "speedup" in r:
                by.setdefault(r["config"], []).append(r)
        for cfg, rs in by.items():
            ax.plot([r["lanes"] for r in rs], [r["speedup"]["median"] for r in rs], marker="o", label=f"ngram {cfg}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(
            xscale="log",
            xlabel="lanes",
            ylabel="aggregate speedup vs off",
            title=f"Speedup against lanes ({res['lanes']['workload']})",
        )
        ax.set_xticks(sorted({r["lanes"] for r in res["lanes"]["rows"]}), labels=None)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(fontsize=7)
        save(fig, "speedup_vs_lanes.png")
    if res.get("lengths"):
        fig, ax = plt.subplots(figsize=(6, 4))
        buckets = list(res["lengths"])
        first = res["lengths"][buckets[0]]["rows"]
        for name in (n for n in first if n != "off"):
            for n in first[name]["speedup"]:
                ys = [
                    res["lengths"][b]["rows"].get(name, {}).get("speedup", {}).get(n, {}).get("median") for b in buckets
                ]
                ax.plot(
                    buckets,
                    [y if y is not None else float("nan") for y in ys],
                    marker="o",
                    label=f"{name}, {n} new tokens",
                )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xlabel="prompt tokens (bucket)", ylabel="decode speedup vs off", title="Speedup against prompt length")
        ax.legend(fontsize=7)
        save(fig, "speedup_vs_prompt_length.png")
    work = [w for w in res.get("peers", {}) if w not in PEER_KEYS]
    if work:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(res["peers"][work[0]])
        width = 0.8 / len(work)
        for j, w in enumerate(work):
            ax.bar(
                [i + j * width for i in range(len(names))],
                [res["peers"][w][n]["decode_tps"]["median"] for n in names],
                width,
                label=w,
            )
        ax.set_xticks([i + width * (len(work) - 1) / 2 for i in range(len(names))], names, rotation=20, fontsize=8)
        ax.set(ylabel="decode tokens/s (median)", title="speclane beside its peers")
        ax.legend(fontsize=7)
        save(fig, "peers.png")
    return written
