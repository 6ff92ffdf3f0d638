"""`speclane fit-drafter`: fit a dflash2 or mtp drafter to a target on offline text (see stages/fitting/fit.py)."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from speclane.stages.contract.errors import ConfigError

# The drafters with weights to fit: the keys of stages/models/drafter_weights.py's CONFIGS, written here because that
# module imports torch and the parser does not (tests/pipeline/test_cli_startup.py holds the two equal).
BACKENDS = ("dflash2", "mtp")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fit-drafter",
        help="fit a dflash2 or mtp drafter to a target (distilled from its own "
        "greedy answers); resumes from its last checkpoint",
    )
    p.add_argument("--backend", choices=BACKENDS, required=True)
    p.add_argument("--model", default=None, help="target artifact (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument(
        "--corpus",
        nargs="+",
        required=True,
        help="directories of *.py (code), text files (prose), or py:module.attr (e.g. py:pydoc_data.topics.topics)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="directory to write <backend>.safetensors and <backend>.json into "
        "(the artifact's directory, to graft the drafter into it)",
    )
    p.add_argument("--work", default=None, help="data and checkpoints (default <out>/.fit)")
    for name, kind in (
        ("seed", int),
        ("prompts", int),
        ("write-prompts", int),
        ("heldout-prompts", int),
        ("forced", int),
        ("forced-len", int),
        ("max-new", int),
        ("steps", int),
        ("time-limit-s", float),
        ("stop-at", int),
        ("lr", float),
        ("anchors", int),
        ("depth", int),
        ("decay", float),
        ("checkpoint-every", int),
        ("threads", int),
        ("version", int),
    ):
        p.add_argument(f"--{name}", type=kind, default=None)
    p.add_argument(
        "--loss",
        choices=("ce", "kl"),
        default=None,
        help="fit the target's greedy token (ce, the default) or its whole next-token distribution (kl)",
    )
    p.add_argument(
        "--init",
        default=None,
        help="go on fitting the <backend>.safetensors in this directory (a warm "
        "start; its own record is kept in the new file's fit.init) instead of a fresh drafter",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from speclane.pipeline.cli.progress import Progress
    from speclane.stages.fitting.fit import FitSettings, fit

    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("func", "command")}
    try:
        settings = FitSettings(**given)
    except ValidationError as exc:
        raise ConfigError(f"fit-drafter: {exc}") from exc
    progress = Progress()  # a bar when stderr is a terminal; the fit's own lines every 10 steps otherwise
    with progress.task(
        f"fit-drafter {settings.backend}", settings.steps, done=f"fit-drafter {settings.backend}: {{s}} s"
    ) as advance:
        path = fit(settings, (lambda step, total, label: advance(step, total, label)) if progress.enabled else None)
    print(path)
    return 0
