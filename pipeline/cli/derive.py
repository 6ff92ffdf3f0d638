"""A --profile's speculation settings derived for the model and flags a command was given.

Owns `derivation_from_args` (the figures gathered: the profile's, or on a CPU profile the pass-cost probe of the model
on this machine, a MoE model's copy probe and the round probe of speculation off and each backend (rounds, proposals,
acceptance, on the text given or the probe's own); the model's and its drafters'; a MoE target's routing;
then pipeline/runtime/derivation.py's choice), `derived_knobs`, which the commands that run a model call (before the
weights load for a profile that states its figures, after, `target` given, for one whose figures the probes measure;
the line saying what was derived goes to stderr once; with --memory the choice is the best-rated candidate whose
configuration as it runs fits, `_fitting`, and the line names what memory left out), and the derivation as `plan`
prints it (`table`, `as_json`).
Not here: the arithmetic (pipeline/runtime/round_model.py).
"""

from __future__ import annotations

import argparse
import math
import sys

import attrs
import torch

from speclane.pipeline.cli.memory import ENGINE_FLAGS, _drafter_options, parse_size, plan_of, setting
from speclane.pipeline.framework.knobs import knob_value
from speclane.pipeline.framework.spec import load_spec
from speclane.pipeline.runtime import copy_probe, drafter_probe
from speclane.pipeline.runtime import plan_figures as pf
from speclane.pipeline.runtime.derivation import OFF, Candidate, Derivation, derive, lane_counts
from speclane.pipeline.runtime.memory_plan import Model, refusal
from speclane.pipeline.runtime.model_bytes import Build
from speclane.pipeline.runtime.profiles import Profile, load_profile, merge
from speclane.pipeline.runtime.request import SpecKnobs
from speclane.pipeline.runtime.round_model import FLOOR, Machine
from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.errors import ConfigError
from speclane.stages.models.artifact import resolve
from speclane.stages.models.expert_cache import DEFAULT_POLICY
from speclane.stages.models.pass_cost import PROBE_ROWS, pass_costs
from speclane.stages.models.tokenizer import Tokenizer

FLAG_DEFAULTS = {
    "model": None,
    "dtype": "bfloat16",
    "quant": "none",
    "device": "cpu",
    "spec": "verify",
    "max_len": 4096,
    "memory": None,
    "expert_cache": None,
    "checkpoint_memory": 512,
    "checkpoint_interval": 1024,
    "spec_draft_head": None,
}
RAM_SOURCE = "MemTotal of /proc/meminfo on the machine this runs on"


def machine_ram() -> int | None:
    """This machine's RAM in bytes (MemTotal), None where /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return None


def fast_memory(args: argparse.Namespace, profile: Profile) -> tuple[int, str]:
    """(bytes, source) of the fast memory: --memory where given, else the profile's, else this machine's RAM."""
    if getattr(args, "memory", None) is not None:
        return parse_size(args.memory, "--memory"), "--memory"
    if profile.fast_memory is not None:
        return int(profile.fast_memory.gb * 1e9), profile.fast_memory.source
    ram = machine_ram()
    if ram is None:
        raise ConfigError("--profile: this machine's RAM is unknown (no /proc/meminfo); give --memory")
    return ram, RAM_SOURCE


def derivation_from_args(
    args: argparse.Namespace, most_lanes: int, target=None, prompts: list[list[int]] | None = None, tokens: int = 0
) -> Derivation:
    """The derivation for --profile, --model and the spec flags, weighing lane counts 1, 2, 4, ... up to
    `most_lanes`; `target`, where loaded, is probed for a CPU profile (else the model is loaded for it), its rounds
    and acceptance on `prompts` (token ids of the workload the plan is for; None: the round probe's own), `tokens`
    a lane (0: the probe's default)."""
    # a command without the model flags (graph) plans the default model
    given = {k: v for k, v in vars(args).items() if v is not None or k not in FLAG_DEFAULTS}
    args = argparse.Namespace(**{**FLAG_DEFAULTS, **given})
    profile = load_profile(args.profile)
    directory = resolve(args.model)
    model = Model(directory)
    cfg = model.cfg
    build = Build(getattr(torch, args.dtype), torch.device(profile.device), args.quant)
    spec = load_spec(args.spec)
    base = setting(args, spec, most_lanes, args.max_len, directory)
    base = attrs.evolve(
        base, build=build, expert_cache_bytes=base.expert_cache_bytes if profile.device == "cpu" else None
    )
    memory, memory_source = fast_memory(args, profile)
    trace = getattr(args, "routing", None)  # a routing trace recorded on text (plan --routing)
    routing = pf.routing(directory, cfg, args.dtype, DEFAULT_POLICY, trace) if any(cfg.moe_layers) else None
    figures_t = pf.target_figures(cfg, build, routing)
    figures = {"fast_memory_bytes": {"value": memory, "source": memory_source}}
    if profile.probe is not None:
        if target is None:
            from speclane.stages.models.loading import load_model

            target, _ = load_model(
                args.model, args.dtype, "cpu", args.quant, expert_cache_bytes=base.expert_cache_bytes
            )
        costs = RoundCosts()
        pass_costs(target, costs, PROBE_ROWS[-1])
        link = copy_probe.link_figure(directory, cfg, args.dtype, figures) if routing is not None else None
        machine = pf.probe_machine(costs.rows, costs.seconds, figures_t, link)
        where = f"{profile.probe.source}; this table: {costs.source}"
        figures["pass_seconds"] = {"value": dict(zip(costs.rows, costs.seconds)), "source": where}
        fitted = "fitted to the pass-cost probe (a pass of r rows = a + b r)"
        figures["fast_bandwidth_bytes_per_s"] = {
            "value": machine.bandwidth,
            "source": f"bytes a pass reads / a, {fitted}",
        }
        figures["compute_flop_per_s"] = {"value": machine.compute, "source": f"FLOPs a row / b, {fitted}"}
    else:
        figures = {**profile.figures(), **figures}  # --memory, where given, in place of the profile's
        machine = Machine(
            bandwidth=profile.fast_bandwidth.gb_per_s * 1e9,
            link=profile.link.bytes_per_s if profile.link else None,
            compute=profile.compute.tflops * 1e12 if profile.compute else None,
        )
    head = args.spec_draft_head or knob_value(spec, "draft_head") or "full"
    lanes = lane_counts(most_lanes)

    def probed(backend: str) -> drafter_probe.Probed:
        p = drafter_probe.probe(target, Tokenizer.load(directory), backend, lanes, prompts, tokens)
        for name, table in [x for x in (("round", p.rounds), ("proposal", p.proposals)) if x[1]]:
            value = {f"{n} lane(s), {w} draft(s)": sec for n, w, sec in table}
            figures[f"{backend}_{name}_seconds"] = {"value": value, "source": f"{drafter_probe.SOURCE}; {p.where}"}
        return p

    if profile.probe is not None:
        slots = getattr(getattr(target, "experts", None), "slots", None)
        machine = attrs.evolve(machine, rounds=probed("none").rounds, probe_slots=slots)

    def drafter_for(backend: str):
        d = pf.drafter_figures(backend, directory, cfg, build, head, _drafter_options(spec, backend))
        if profile.probe is None or d is None:
            return d
        p, source = probed(backend), "measured by the round probe (pipeline/runtime/drafter_probe.py)"
        got = {"accept": p.accept, "probed": p.proposals, "rounds": p.rounds, "offered": p.offered}
        return attrs.evolve(d, accept_source=f"{source} on {p.where}", **got)

    name = str(args.profile)
    return derive(name, model, base, memory, machine, figures_t, drafter_for, figures, lanes)


def derived_knobs(args: argparse.Namespace, most_lanes: int, target=None) -> SpecKnobs | None:
    """The settings --profile derives (None without one, or before the weights load for a profile the probe
    measures); derived once a command, its line written to stderr."""
    if not getattr(args, "profile", None):
        return None
    done = getattr(args, "_derivation", None)
    if done is None:
        if load_profile(args.profile).probe is not None and target is None:
            return None
        done, why = _fitting(args, derivation_from_args(args, most_lanes, target), most_lanes, target)
        args._derivation = done
        device = str(getattr(args, "device", None) or "cpu").split(":")[0]
        where = load_profile(args.profile).device
        elsewhere = f" (its figures describe a {where} machine; this runs on {device})" if device != where else ""
        print(done.line() + elsewhere + why, file=sys.stderr)
    return done.knobs


def _what(c: Candidate) -> str:
    return "speculation off" if c == OFF else f"{c.backend} at {c.draft_tokens} draft tokens, {c.rows or 'no'} rows"


def _fitting(args: argparse.Namespace, d: Derivation, most_lanes: int, target) -> tuple[Derivation, str]:
    """`d`, or with --memory or --host-memory given and the configuration that would run not fitting them, `d` with
    the best-rated candidate whose configuration fits as its choice; and the words that say what memory left out
    (empty where nothing). The configuration that runs: the candidate with the --spec-* flags given over it, laid
    out for the engine's device, lanes and context, beside the expert slots `target` already holds where it is
    loaded (a profile the probe measures). A ConfigError (the plan's refusal, naming what to change) where no
    rated candidate fits."""
    if getattr(args, "memory", None) is None and getattr(args, "host_memory", None) is None:
        return d, ""
    from speclane.pipeline.cli.common import spec_from_args  # the flags' spec, as the engine gets it

    spec, given = spec_from_args(args), _flag_knobs(args)
    slots = None if target is None or getattr(target, "experts", None) is None else target.experts.slots
    rated = [c for c, r in sorted(d.rated.items(), key=lambda kv: -(kv[1] or 0.0)) if r is not None]
    first = None
    for c in [d.choice, *(c for c in rated if c != d.choice)]:
        model, plan = plan_of(args, spec, merge(c.knobs(), given), most_lanes, slots)
        first = first or (model, plan)
        if plan.fits is not False:
            break
    else:
        raise ConfigError(refusal(*first, ENGINE_FLAGS))
    off = d.off()

    def vs_off(s) -> float:
        return math.exp(sum(math.log(r.tps / off.rounds[n].tps) for n, r in s.rounds.items()) / len(s.rounds))

    mine = d.rated.get(c) or 1.0
    words = []
    if c != d.choice:
        words.append(f"{_what(d.choice)} does not fit --memory as it runs here ({'; '.join(first[1].problems)})")
    out = [s for s in d.scored if not s.fits and vs_off(s) > mine * (1 + 1e-9)]
    if out:
        best = max(out, key=vs_off)
        words.append(f"{_what(best.candidate)}, predicted {vs_off(best):.2f}x speculation off, does not fit --memory")
    return attrs.evolve(d, choice=c, score=mine), "".join(f"; {w}" for w in words)


def _flag_knobs(args: argparse.Namespace) -> SpecKnobs:
    """The --spec-* flags given (None where not), which win over the derived settings."""
    return SpecKnobs.from_flags(
        **{k: getattr(args, f"spec_{k}", None) for k in ("backend", "draft_tokens", "draft_rows", "draft_head")},
        draft_plan=getattr(args, "spec_draft_plan", None),
    )


def _si(value: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


UNITS = {"fast_memory_bytes": "B", "fast_bandwidth_bytes_per_s": "B/s", "link_bytes_per_s": "B/s"}


def as_json(d: Derivation) -> dict:
    """`speclane plan --profile --json`'s keys: the figures with their sources, where acceptance comes from, the
    lane counts weighed, every candidate's predictions and the choice."""
    off = d.off()
    cands = []
    for s in d.scored:
        by_lanes = {
            str(n): {
                "tokens_per_s": r.tps,
                "vs_off": r.tps / off.rounds[n].tps,
                "drafts_per_lane": r.drafts,
                "tokens_per_round": r.tokens,
                "round_seconds": r.parts,
            }
            for n, r in s.rounds.items()
        }
        score = d.rated.get(s.candidate)
        cands.append(
            {**s.candidate.as_dict(), "fits": s.fits, "expert_slots": s.slots, "by_lanes": by_lanes, "score": score}
        )
    return {
        "profile": d.profile,
        "model": d.model,
        "figures": d.figures,
        "acceptance": d.acceptance,
        "skipped": d.skipped,
        "notes": list(d.notes),
        "lanes_weighed": list(d.lanes),
        "candidates": cands,
        "choice": {**d.choice.as_dict(), "score": d.score},
    }


def table(d: Derivation) -> list[str]:
    """The derivation as `speclane plan --profile` prints it."""
    out = [f"{'profile':<16} {d.profile} ({d.model})", "figures"]
    for name, f in d.figures.items():
        value = f["value"]
        shown = (
            ", ".join(f"{r}: {s * 1e3:.3g} ms" for r, s in value.items())
            if isinstance(value, dict)
            else _si(value, UNITS.get(name, "FLOP/s"))
        )
        out.append(f"  {name:<28} {shown}  [{f['source']}]" + (f" ({f['note']})" if f.get("note") else ""))
    out += [f"  acceptance of {b:<14} {src}" for b, src in d.acceptance.items()]
    out += [f"  {b}: skipped ({why})" for b, why in d.skipped.items()]
    lanes = "".join(f"{f'{n} lane(s)':>17}" for n in d.lanes)
    out.append(f"candidates: tokens/s predicted (drafts a lane){'':<2}{lanes}   vs off  fits")
    for s in d.scored:
        c = s.candidate
        name = f"  {c.backend:<8} k {c.draft_tokens}  rows {c.rows or '-':<3}"
        cells = "".join(f"{f'{r.tps:.4g} ({r.drafts})':>17}" for r in s.rounds.values())
        vs = d.rated.get(c)
        mark = f"{vs:.3f}x" if vs is not None else "  -   "
        slots = f"  {s.slots} expert slots" if s.slots is not None else ""
        out.append(f"{name:<47}{cells}   {mark}  {'yes' if s.fits else 'no'}{slots}")
    c = d.choice
    what = (
        "speculation off"
        if c.backend == "none"
        else f"{c.backend}, {c.draft_tokens} draft tokens, {c.rows or 'no'} row budget"
    )
    out.append(
        f"{'choice':<16} {what} ({d.score:.3f}x speculation off, geometric mean over {', '.join(map(str, d.lanes))} "
        f"lanes; never below {FLOOR}x off at any of them)"
    )
    out += [f"{'note':<16} {n}" for n in d.notes]
    return out
