"""Turning a bench result (the JSON `speclane bench` writes) into text tables.

Owns the derived figures: fractions of the roofline floor and of the oracle ceiling, and the predicted speedup
(tokens per round x plain round time / speculative round time split into draft, verify pass and bookkeeping,
all from per-stage timings of the same runs) beside the measured one. Measures nothing. Not here: the plots
(bench/report_plots.py), the defaults section's lines (bench/defaults.py).
"""

from __future__ import annotations

from speclane.bench import defaults

PEER_KEYS = ("skipped", "notes", "lookup")  # the peers section's keys that are not workloads


def _s(x: dict, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    """'median [min, max]' of a spread."""
    if not x or x.get("n", 1) == 0:
        return "-"
    return f"{fmt.format(x['median'] * scale)} [{fmt.format(x['min'] * scale)}, {fmt.format(x['max'] * scale)}]"


def floor_tps(res: dict) -> float | None:
    lim = res.get("limits")
    # The best copy, not the median: the floor is the fastest a pass could be; neighbours only slow copies down.
    return lim["bandwidth"]["bytes_per_s_best"] / lim["pass_bytes"]["total"] if lim else None


def predicted(off_stages: dict, spec_stages: dict, tau: float) -> dict | None:
    """tau x (plain round seconds) / (draft + verify pass + bookkeeping seconds of a speculative round)."""
    plain, spec = sum(off_stages.values()), sum(spec_stages.values())
    if not plain or not spec:
        return None
    draft, verify = spec_stages.get("draft", 0.0), spec_stages.get("target_pass", 0.0)
    return {
        "speedup": tau * plain / spec,
        "plain_round_s": plain,
        "draft_s": draft,
        "verify_s": verify,
        "bookkeeping_s": spec - draft - verify,
    }


def draft_rows(res: dict, workload: str) -> list[dict]:
    """The draft-token rows of one workload with the derived columns (prediction, fraction of the oracle)."""
    sec = res["draft_tokens"][workload]["rows"]
    first = next(iter(res["draft_tokens"]))
    oracle = {
        r["k"]: r["speedup"]["median"] for r in res["draft_tokens"][first]["rows"].values() if r["backend"] == "oracle"
    }
    out = []
    for name, r in sec.items():
        row = dict(r, name=name)
        if r["backend"] != "off":
            row["predicted"] = predicted(sec["off"]["stage_s_per_round"], r["stage_s_per_round"], r["tokens_per_round"])
            if r["k"] in oracle and r["backend"] != "oracle":
                row["of_oracle"] = r["speedup"]["median"] / oracle[r["k"]]
        out.append(row)
    return out


def tables(res: dict) -> str:
    m = res["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} on {m['torch_threads']} thread(s), "
        f"{m['dtype']}; load average at start {', '.join(f'{x:.2f}' for x in m['load_avg_at_start'])}",
        f"compute: {m.get('compute', 'not recorded (before the C kernels)')}",
        f"command: {res.get('command', '')} (commit {m.get('commit', 'not recorded')})",
        "figures: median [min, max] over prompts x alternating repeats",
        "",
    ]
    if "limits" in res:
        lim = res["limits"]
        bw, pb = lim["bandwidth"], lim["pass_bytes"]
        lines += [
            f"bandwidth (copy {bw['mib']} MiB): {bw['bytes_per_s_median'] / 1e9:.1f} GB/s median, "
            f"{bw['bytes_per_s_best'] / 1e9:.1f} best; a 1-row pass reads {pb['total'] / 1e6:.0f} MB "
            f"(weights {pb['weights'] / 1e6:.0f}, KV at {lim['context']} positions {pb['kv'] / 1e6:.1f}): "
            f"floor (best copy) {floor_tps(res):.1f} tok/s",
            "",
            f"verify pass, one lane at {res['settings']['pass_context']} committed positions:",
            "rows  ms      x 1 row",
        ]
        lines += [f"{n:>4}  {v['seconds'] * 1e3:6.1f}  {v['vs_one_row']:5.2f}" for n, v in lim["verify_pass"].items()]
        lines.append("")
    if "null" in res:
        nl = res["null"]
        lines += [
            "null drafter (EOS ignored, fixed length): decode tok/s, and the paired ratio to the minimal loop",
            f"  minimal loop      {_s(nl['loop']['decode_tps'])}",
        ]
        for name, label in (("decode", "plain round"), ("null", "verify + none")):
            lines.append(
                f"  {label:<16}  {_s(nl[name]['decode_tps'])}  x loop {_s(nl[name]['vs_loop'], fmt='{:.3f}')}"
                f"  same tokens: {nl[name]['same_tokens_as_loop']}"
            )
        lines.append("")
    floor = floor_tps(res)
    for w, sec in res.get("draft_tokens", {}).items():
        lines.append(f"draft tokens on {w} (prompts {', '.join(sec['prompts'])}):")
        for b, why in sec["skipped"].items():
            lines.append(f"  {b}: skipped ({why})")
        lines.append(
            f"  {'config':<10} {'decode tok/s':<22} {'speedup':<20} {'pred':>5} {'meas/pred':>9} "
            f"{'of oracle':>9} {'tau':>5}  {'ttft s':<6} acceptance per position; first bf16 divergence"
        )
        for r in draft_rows(res, w):
            if r["backend"] == "off":
                frac = f" ({r['decode_tps']['median'] / floor:.0%} of the floor)" if floor else ""
                lines.append(
                    f"  {'off':<10} {_s(r['decode_tps'], fmt='{:.1f}'):<22}{frac}  ttft "
                    f"{r['ttft_s']['median']:.2f} s, engine memory {r['memory_bytes'] / 1e6:.0f} MB"
                )
                continue
            p = r.get("predicted")
            pred = f"{p['speedup']:5.2f} {r['speedup']['median'] / p['speedup']:9.2f}" if p else f"{'-':>5} {'-':>9}"
            frac = f"{r['of_oracle']:9.2f}" if "of_oracle" in r else f"{'-':>9}"
            acc = " ".join(f"{a:.2f}" for a in r["accepted_per_position"][: r["k"]])
            lines.append(
                f"  {r['name']:<10} {_s(r['decode_tps'], fmt='{:.1f}'):<22} {_s(r['speedup']):<20} {pred} "
                f"{frac} {r['tokens_per_round']:5.2f}  {r['ttft_s']['median']:<6.2f} {acc}; "
                f"{r['first_divergence']}"
            )
        lines.append("")
    if "lanes" in res:
        ln = res["lanes"]
        lines.append(f"lanes on {ln['workload']}: aggregate decode tok/s, speedup against off at the same lanes")
        for b, why in ln["skipped"].items():
            lines.append(f"  {b}: skipped ({why})")
        for r in ln["rows"]:
            extra = f"  x off {_s(r['speedup'])}  tau {r['tokens_per_round']:.2f}" if "speedup" in r else ""
            lines.append(
                f"  {r['lanes']} lanes {r['config']:<8} {_s(r['aggregate_tps'], fmt='{:.1f}'):<22} per lane "
                f"{r['lane_tps']['median']:5.1f}  mem {r['memory_bytes'] / 1e6:.0f} MB{extra}"
            )
        lines.append("")
    lines += defaults.lines(res)
    lines += length_lines(res)
    if "peers" in res:
        pe = res["peers"]
        for name, why in pe["skipped"].items():
            lines.append(f"peer {name}: skipped ({why})")
        for name, note in pe.get("notes", {}).items():
            lines.append(f"peer {name}: {note}")
        for w in (w for w in pe if w not in PEER_KEYS):
            lines.append(
                f"peers on {w} (lookup/ngram k = {pe['lookup']}): decode tok/s, time to first token and prefill rate "
                "(prompt tokens / ttft); speclane's same mode / this"
            )
            for name, r in pe[w].items():
                lines.append(
                    f"  {name:<22} {_s(r['decode_tps'], fmt='{:.1f}'):<22} ttft {r['ttft_s']['median']:.2f} s"
                    + (f"  prefill {r['prefill_tps']['median']:.0f} tok/s" if r.get("prefill_tps") else "")
                    + f"  speclane / this {_s(r['speclane_over_this'])}"
                    + (f"  int8 / this {_s(r['int8_over_this'])}" if r.get("int8_over_this") else "")
                    + f"  first divergence from speclane {r['first_divergence_from_speclane']}"
                )
            lines.append("")
    if "exactness" in res:
        lines.append("float32 exactness: first divergence from plain greedy per prompt (None: identical)")
        for b, v in res["exactness"]["float32"].items():
            lines.append(f"  {b}: {v}")
        lines.append("")
    lines.append(f"peak RSS {res['peak_rss_bytes'] / 1e9:.2f} GB; {res['seconds']:.0f} s in all")
    if res.get("section_seconds"):  # results written before sections were timed have none
        lines.append("seconds by section: " + ", ".join(f"{k} {v:.0f}" for k, v in res["section_seconds"].items()))
    return "\n".join(lines)


def length_lines(res: dict) -> list[str]:
    """The prompt-length buckets: per bucket, each configuration's decode speed and speedup at each answer length."""
    lines = []
    for b, sec in res.get("lengths", {}).items():
        ns = list(next(iter(sec["rows"].values()))["decode_tps"])
        lines.append(
            f"prompt bucket {b} (prompts {', '.join(sec['prompts'])}: {sec['prompt_tokens']} tokens; "
            f"EOS ignored): decode tok/s and speedup against off at {' and '.join(ns)} new tokens"
        )
        for name, why in sec["skipped"].items():
            lines.append(f"  {name}: skipped ({why})")
        for name, r in sec["rows"].items():
            cells = "  ".join(
                f"@{n}: {_s(r['decode_tps'][n], fmt='{:.1f}'):<20}"
                + (f" x off {_s(r['speedup'][n])}" if "speedup" in r else "")
                for n in ns
            )
            tau = f"  tau {r['tokens_per_round']:.2f}" if "tokens_per_round" in r else ""
            lines.append(f"  {name:<10} ttft {r['ttft_s']['median']:6.2f} s  {cells}{tau}")
        lines.append("")
    return lines
