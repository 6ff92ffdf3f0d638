"""The drafters' controls (issue 18): does dflash2 learn what it can see? Each run prints its figures and settings.

    python -m speclane.bench.drafter_controls copy        # dflash2 on answers that repeat a span of the prompt
    python -m speclane.bench.drafter_controls first-row   # dflash2 fitted on block row 1's loss alone against mtp
    python -m speclane.bench.drafter_controls first-row --dflash2 width=7 decay=4 --mtp depth=3   # their own losses
    python -m speclane.bench.drafter_controls heldout --width 7 [--weights DIR]   # a fitted file on the same anchors

copy: `--train` sequences of `--prompt-len` random distinct tokens of the default model's vocabulary followed
by a `--span`-token stretch of them copied verbatim, run through the target for its taps; dflash2 is fitted on
them from scratch (its usual loss: rows 1..7 weighted exp(-(j - 1) / 4)) and its acceptance per block position
and tokens a round at k = 7 measured on `--heldout` fresh ones. A working induction path drafts the copy: at least
5 tokens a round.
first-row: teacher-forced corpus text (`fit-drafter --forced`; with `--prompts`, also the target's answers to
training prompts) to fit on and the target's answers to held-out prompts to measure on, all cached in `--work`;
dflash2 with the loss of block row 1 alone and mtp with depth 1, the same sequences in the same order, steps,
seed, learning rate and schedule, and the same `--anchors` answer positions of each sequence fitted by both (the
output head's product over 49k tokens is most of a step). Printed: first-draft acceptance of both on the same
held-out anchors, every `--every` steps. Holding everything mtp sees, dflash2 should reach at least mtp's.
Knobs of either fit (`speclane.stages.fitting.controls.ControlFit`) are given as name=value after `--dflash2` / `--mtp`.
Everything runs on the threads given (`--threads`, default 1). Owns these commands only; the loop and the copy
task are `stages/fitting/controls.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import torch

from speclane.stages.fitting import controls as ctl
from speclane.stages.fitting.datasets import build_data, build_forced
from speclane.stages.fitting.fit import FitSettings
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.loading import load_model

CORPUS = [sysconfig.get_paths()["stdlib"], "/usr/share/common-licenses", "py:pydoc_data.topics.topics"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m speclane.bench.drafter_controls", description=__doc__.split("\n\n")[0])
    p.add_argument("control", choices=("copy", "first-row", "heldout"))
    p.add_argument(
        "--weights",
        type=Path,
        default=None,
        help="heldout: the directory of the dflash2 files to measure (default: the shipped ones, stages/models/assets)",
    )
    p.add_argument("--work", type=Path, required=True, help="a directory for the controls' cached data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--every", type=int, default=100, help="held-out acceptance every this many steps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--train", type=int, default=96, help="copy: training sequences")
    p.add_argument("--heldout", type=int, default=16, help="copy: held-out sequences")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--span", type=int, default=96)
    p.add_argument(
        "--vocab",
        type=int,
        default=4096,
        help="copy: token ids 200 .. 200 + this; the head drafts "
        "among them (its product over the whole vocabulary would cost most of a step)",
    )
    p.add_argument(
        "--anchors",
        type=int,
        default=32,
        help="first-row: answer positions a step, the same ones for both drafters (0: all of them)",
    )
    p.add_argument("--forced", type=int, default=48, help="first-row: teacher-forced training sequences")
    p.add_argument("--heldout-prompts", type=int, default=16, help="first-row: held-out prompts (answers generated)")
    p.add_argument(
        "--prompts",
        type=int,
        default=0,
        help="first-row: training prompts whose answers the target "
        "generates, fitted beside the teacher-forced sequences (fit-drafter's --prompts)",
    )
    p.add_argument(
        "--width",
        type=int,
        default=1,
        help="first-row: drafts a held-out anchor is measured on (1: the first alone; 7: tokens a round at k = 7)",
    )
    p.add_argument(
        "--fits",
        nargs="+",
        default=["dflash2", "mtp"],
        choices=("dflash2", "mtp"),
        help="first-row: which of the two fits to run",
    )
    p.add_argument("--dflash2", nargs="*", default=[], help="dflash2's ControlFit knobs, name=value")
    p.add_argument("--mtp", nargs="*", default=[], help="mtp's ControlFit knobs, name=value")
    p.add_argument(
        "--version",
        type=int,
        default=5,
        choices=(2, 3, 4, 5),
        help="dflash2's file version: 5 (4 with prompt lookup's candidates in the block rows; "
        "fit-drafter's), 4 (block input fused as mtp's), 2 (the first shipped format) or 3 "
        "(window entries pair row q - 1's feature with token q)",
    )
    p.add_argument(
        "--init-target-layers",
        action="store_true",
        help="dflash2's layers start as the target's top "
        "layers (built with the target's intermediate size, so all of each layer; fc and the mask "
        "embeddings as drawn)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    return p.parse_args(argv)


def knobs(pairs: list[str], **base) -> ctl.ControlFit:
    types = {
        "width": int,
        "anchors": int,
        "depth": int,
        "decay": float,
        "warmup": int,
        "shape": str,
        "lr": float,
        "same_anchors": lambda v: v in ("1", "true", "True"),
        "autocast": lambda v: v in ("1", "true", "True"),
    }
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in types:
            raise SystemExit(f"knob '{name}': not one of {sorted(types)} (write name=value)")
        base[name] = types[name](value)
    return ctl.ControlFit(**base)


def _cached(path: Path, make):
    if path.is_file():
        return torch.load(path)
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(value, path)
    return value


def copy_control(a, target, embed, head) -> dict:
    vocab = (200, 200 + a.vocab)
    embed, head = embed[vocab[0] : vocab[1]], head[vocab[0] : vocab[1]]
    key = f"copy-{a.seed}-{a.prompt_len}-{a.span}-{a.vocab}"
    train = _cached(
        a.work / f"{key}-train{a.train}.pt",
        lambda: ctl.copy_sequences(target, a.train, a.seed, vocab, a.prompt_len, a.span),
    )
    held = _cached(
        a.work / f"{key}-held{a.heldout}.pt",
        lambda: ctl.copy_sequences(target, a.heldout, a.seed + 1, vocab, a.prompt_len, a.span),
    )
    c = knobs(a.dflash2, backend="dflash2", steps=a.steps, lr=a.lr, seed=a.seed)
    net = new_net("dflash2", target, a)
    curve = []

    def check(step):
        curve.append({"step": step, **ctl.acceptance("dflash2", net, held, embed, head)})
        _log(f"copy step {step}: {json.dumps(curve[-1])}")

    check(0)
    ctl.run_fit(c, net, train, embed, head, a.every, check, _log)
    if curve[-1]["step"] != c.steps:
        check(c.steps)
    return {"control": "copy", "fit": str(c), "train": len(train), "heldout": len(held), "curve": curve}


def _anchor_settings(a, forced: int) -> FitSettings:
    """The data settings `first-row` and `heldout` share (the same `--work`, `--seed` and prompt counts), so both
    measure on the same held-out anchors."""
    return FitSettings(
        backend="dflash2",
        corpus=CORPUS,
        out=str(a.work),
        work=str(a.work),
        seed=a.seed,
        prompts=a.prompts,
        heldout_prompts=a.heldout_prompts,
        forced=forced,
    )


def first_row_control(a, target, tokenizer, embed, head) -> dict:
    s = _anchor_settings(a, a.forced)
    generated, held = build_data(s, target, tokenizer, a.work)
    train = generated + build_forced(s, target, tokenizer, a.work)
    result = {"control": "first-row", "train": len(train), "heldout": len(held), "fits": {}}
    for backend, pairs, base in (
        ("dflash2", a.dflash2, {"width": 1, "anchors": a.anchors}),
        ("mtp", a.mtp, {"depth": 1, "anchors": a.anchors, "same_anchors": True}),
    ):
        if backend not in a.fits:
            continue
        c = knobs(pairs, backend=backend, steps=a.steps, lr=a.lr, seed=a.seed, **base)
        net, curve = new_net(backend, target, a), []

        def check(step, net=net, backend=backend, curve=curve):
            curve.append({"step": step, **ctl.acceptance(backend, net, held, embed, head, width=a.width)})
            _log(f"first-row {backend} step {step}: {json.dumps(curve[-1])}")

        ctl.run_fit(c, net, train, embed, head, a.every, check, _log)
        if not curve or curve[-1]["step"] != c.steps:
            check(c.steps)
        result["fits"][backend] = {"fit": str(c), "curve": curve}
    return result


def heldout_control(a, target, tokenizer, embed, head) -> dict:
    """A fitted dflash2 file's acceptance on the held-out anchors `first-row` measures on (the same `--work`,
    `--prompts`, `--heldout-prompts` and `--width`), per kind and over all: a before/after on the same positions."""
    _, held = build_data(_anchor_settings(a, forced=0), target, tokenizer, a.work)
    weights, config = dw.files("dflash2", a.weights or dw.ASSETS)
    net, _ = dw.load("dflash2", weights, config, target.cfg, torch.float32, "cpu")
    result = {"control": "heldout", "weights": str(weights), "version": net.cfg.version, "heldout": len(held)}
    for kind in ("code", "prose", "all"):
        seqs = [q for q in held if kind in ("all", q["kind"])]
        if seqs:
            result[kind] = ctl.acceptance("dflash2", net, seqs, embed, head, width=a.width)
    return result


def new_net(backend: str, target, a):
    torch.manual_seed(a.seed)
    net = dw.new_net(backend, target.cfg, **({"version": a.version} if backend == "dflash2" else {}))
    if backend == "dflash2" and a.init_target_layers:  # built with the target's MLP width, so the MLP copies too
        net = type(net)(net.cfg.model_copy(update={"intermediate_size": target.cfg.intermediate_size}))
        for p in (net.fc.weight, net.mask_embedding):  # as dw.new_net draws them; the layers are copied
            torch.nn.init.normal_(p, std=0.02)
        ctl.init_from_target(net, target)
    return net.float().train()


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    # The target runs in bf16 (its passes make the data, as fit-drafter's do); the fits run in float32: this
    # machine's CPU (AVX2, no bf16 hardware) runs torch's bf16 products about 6x slower than float32 ones.
    target, tokenizer = load_model(None, "bfloat16")
    target.hidden_taps = dw.fit_taps(target.cfg)
    embed, head = target.weights.embed.float(), target.weights.lm_head.float()
    _log(f"machine: {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, {a.threads} thread(s)")
    if a.control == "copy":
        result = copy_control(a, target, embed, head)
    elif a.control == "heldout":
        result = heldout_control(a, target, tokenizer, embed, head)
    else:
        result = first_row_control(a, target, tokenizer, embed, head)
    result.update(machine=torch.backends.cpu.get_cpu_capability(), torch=torch.__version__, argv=argv or sys.argv[1:])
    print(json.dumps(result, indent=1))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
