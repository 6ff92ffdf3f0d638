"""Does `speclane plan` recommend what a measurement shows? The check, cell by cell.

A cell is one lane count (and whatever else a section varies, `Measured.cell`: a fast tier's size, a workload), in
which several speculation settings were measured side by side. In each cell `check` compares the measured best
setting with the plan's pick among the settings measured there (the one the plan predicts fastest): they agree when
the pick is the measured best, or when the two overlap within the measurement's interval (the pick's highest sample
at or above the best's lowest: the measurement cannot tell them apart). With the plan's overall `choice` (the one
setting a profile derives for every lane count) it also says, per cell, whether that setting is the measured best or
within its interval there. Settings are compared by their effect: a row budget of 0 is the backend's default.

`check_experts` runs the check on the `experts` section's cells, one per fast-tier share and lane count (bench/
experts.py calls it on the plan of the profile it names). `cells_from_defaults` reads the `defaults` section of a
`speclane bench --json` result; `python -m speclane.bench.plan_check --defaults RESULT.json --profile cpu` checks
such a result against the profile's plan on this machine (`--acceptance measured` also replays the measured
acceptance, to check the cost side alone).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

from speclane.bench.defaults import DEFAULT_K


@attrs.frozen
class Measured:
    """One measured setting in one cell: tokens per second (`tps`, the median) and its interval [low, high]."""

    backend: str
    draft_tokens: int
    row_budget: int
    lanes: int
    tps: float
    low: float
    high: float
    cell: str = ""
    tokens_per_round: float | None = None


def _key(m: Measured) -> tuple[str, int, int]:
    from speclane.pipeline.runtime.derivation import Candidate

    if m.backend == "none":
        return ("none", 0, 0)
    return (m.backend, m.draft_tokens, Candidate(m.backend, m.draft_tokens, m.row_budget).rows)


def _agree(pick: Measured, best: Measured) -> str | None:
    """'best', 'within' (intervals overlap) or None."""
    if _key(pick) == _key(best):
        return "best"
    return "within" if pick.high >= best.low else None


def check(
    measured: Iterable[Measured],
    predict: Callable[[str, int, int, int], float],
    choice: tuple[str, int, int] | None = None,
) -> list[dict]:
    """Per cell (sorted by `cell`, then lanes): the measured best, the plan's pick (`predict(backend, draft_tokens,
    row_budget, lanes)` the plan's tokens per second) with its measured figures, `agrees` ('best', 'within' or
    None) and, with `choice` (backend, draft_tokens, row_budget), `choice_agrees` the same for that setting (None
    where it was not measured in the cell: `choice_measured` False)."""
    cells: dict[tuple[str, int], list[Measured]] = {}
    for m in measured:
        cells.setdefault((m.cell, m.lanes), []).append(m)
    out = []
    want = None if choice is None else _key(Measured(*choice, lanes=0, tps=0.0, low=0.0, high=0.0))
    for (cell, lanes), ms in sorted(cells.items()):
        best = max(ms, key=lambda m: m.tps)
        predicted = {_key(m): predict(m.backend, m.draft_tokens, m.row_budget, m.lanes) for m in ms}
        pick = max(ms, key=lambda m: predicted[_key(m)])
        row = {
            "cell": cell,
            "lanes": lanes,
            "measured_best": _describe(best),
            "plan_pick": {**_describe(pick), "predicted_tps": predicted[_key(pick)]},
            "predicted": {"/".join(map(str, k)): v for k, v in predicted.items()},
            "agrees": _agree(pick, best),
        }
        if want is not None:
            mine = next((m for m in ms if _key(m) == want), None)
            row["choice_measured"] = mine is not None
            row["choice_agrees"] = None if mine is None else _agree(mine, best)
        out.append(row)
    return out


def _describe(m: Measured) -> dict:
    return {
        "backend": m.backend,
        "draft_tokens": m.draft_tokens,
        "row_budget": m.row_budget,
        "tps": m.tps,
        "interval": [m.low, m.high],
    }


def cells_from_defaults(result: dict, cell: str = "") -> list[Measured]:
    """The measured settings of a `speclane bench --json` result's `defaults` section: off, and each backend at the
    section's draft tokens and its default row budget; the `none` control (off's work through the verify graph) is
    left out."""
    out = []
    for r in result["defaults"]["rows"]:
        if r["config"] == "none":
            continue
        backend = "none" if r["config"] == "off" else r["config"]
        s = r["aggregate_tps"]
        k = 0 if backend == "none" else DEFAULT_K
        tau = r.get("tokens_per_round")
        out.append(Measured(backend, k, 0, r["lanes"], s["median"], s["min"], s["max"], cell, tau))
    return out


def share_cell(share: float) -> str:
    """The cell name of a fast tier holding `share` of the routed experts (1.0: every expert resident)."""
    return "resident" if share >= 1.0 else f"fast {share:.0%}"


def check_experts(records: Iterable[dict], predict: Callable[[str, int, int, int, float], float]) -> list[dict]:
    """`check` of the experts section's `measured_cells` records, a cell per fast-tier share and lane count:
    `predict(backend, draft_tokens, row_budget, lanes, fast_share)` the plan's tokens per second with that share's
    slots. Records of a backend `predict` raises a KeyError for (one the plan skipped) are left out."""
    by_share: dict[float, list[Measured]] = {}
    for r in records:
        low, high = r["interval"]
        m = Measured(
            r["backend"],
            r["draft_tokens"],
            r["row_budget"],
            r["lanes"],
            r["tokens_per_s"],
            low,
            high,
            share_cell(r["fast_share"]),
        )
        try:
            predict(m.backend, m.draft_tokens, m.row_budget, m.lanes, r["fast_share"])
        except KeyError:
            continue
        by_share.setdefault(r["fast_share"], []).append(m)
    out = []
    for share, ms in sorted(by_share.items()):
        out += check(ms, lambda b, k, rows, n, share=share: predict(b, k, rows, n, share))
    return out


def tally(rows: list[dict]) -> dict[str, int]:
    """How many cells of `check`'s rows agree as the best, within the interval, or disagree."""
    out = {"best": 0, "within": 0, "disagree": 0}
    for r in rows:
        out[r["agrees"] or "disagree"] += 1
    return out


def measured_acceptance(result: dict) -> dict[str, tuple[float, ...]]:
    """Per backend, P(drafts 1..j accepted), the form the round model reads (pipeline/runtime/round_model.py `tau`),
    from a defaults result's 1-lane rows. Their `accepted_per_position` is each position's acceptance given the
    drafts before it were accepted (stages/contract/lanes.py `spec_stats`: accepted over rounds that reached it), so
    P(1..j) is the running product. A position no round reached reads 0 there: trailing zeros are dropped, so the
    round model carries the last measured ratio on past them, as it does past any measurement's end."""
    out = {}
    for r in result["defaults"]["rows"]:
        if r["lanes"] == 1 and r["config"] not in ("off", "none") and r.get("accepted_per_position"):
            given = list(r["accepted_per_position"])
            while given and given[-1] == 0.0:
                given.pop()
            chain, p = [], 1.0
            for c in given:
                p *= c
                chain.append(p)
            if chain:
                out[r["config"]] = tuple(chain)
    return out


def lines(rows: list[dict]) -> list[str]:
    def name(d: dict) -> str:
        if d["backend"] == "none":
            return "off"
        return f"{d['backend']} k{d['draft_tokens']}" + (f" b{d['row_budget']}" if d.get("row_budget") else "")

    out = []
    for r in rows:
        b, p = r["measured_best"], r["plan_pick"]
        verdict = {"best": "agrees (the best)", "within": "agrees (within the interval)", None: "DISAGREES"}[
            r["agrees"]
        ]
        line = (
            f"{r['cell'] or '-':<10} {r['lanes']} lane(s): measured best {name(b)} {b['tps']:.1f} "
            f"[{b['interval'][0]:.1f}, {b['interval'][1]:.1f}]; plan picks {name(p)} (measured {p['tps']:.1f} "
            f"[{p['interval'][0]:.1f}, {p['interval'][1]:.1f}]): {verdict}"
        )
        if "choice_agrees" in r:
            line += "; profile's choice " + (
                "not measured here"
                if not r["choice_measured"]
                else {"best": "is the best", "within": "within the interval", None: "BELOW the best"}[
                    r["choice_agrees"]
                ]
            )
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    from speclane.pipeline.cli.derive import derivation_from_args
    from speclane.pipeline.runtime.derivation import Candidate

    p = argparse.ArgumentParser(description="check a bench defaults result against the profile's plan")
    p.add_argument("--defaults", type=Path, nargs="+", required=True, help="`speclane bench --json` results")
    p.add_argument("--profile", default="cpu")
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-lanes", type=int, default=4)
    p.add_argument("--acceptance", choices=("plan", "measured"), default="plan")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    d = derivation_from_args(
        argparse.Namespace(profile=args.profile, model=args.model, dtype=args.dtype), args.max_lanes
    )
    report = {"choice": d.choice.as_dict(), "files": {}}
    for path in args.defaults:
        result = json.loads(path.read_text())
        cell = f"{result['defaults']['workload']}"
        drafters = dict(d.drafters)
        if args.acceptance == "measured":
            for b, acc in measured_acceptance(result).items():
                drafters[b] = attrs.evolve(drafters[b], accept=acc, accept_source=f"measured in {path.name}")
        der = attrs.evolve(d, drafters=drafters)

        def predict(b: str, k: int, r: int, n: int, der=der) -> float:
            return der.predict(Candidate(b, k, r), n).tps

        choice = (d.choice.backend, d.choice.draft_tokens, d.choice.row_budget)
        rows = check(cells_from_defaults(result, cell), predict, choice)
        report["files"][str(path)] = rows
        print(f"{path} (acceptance: {args.acceptance}; profile {args.profile}'s choice {d.choice.as_dict()})")
        print("\n".join(lines(rows)))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
