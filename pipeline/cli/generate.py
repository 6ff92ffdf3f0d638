"""`speclane generate`: run prompts or a JSONL file of requests as concurrent lanes, streaming or as JSON.

Without --max-lanes and --max-len the engine is sized for the requests it is given (`size_for`): a lane a request, up
to the profile's lanes or 4, and the longest request's prompt + max_tokens, up to --max-len's default (a request
past it is refused, as with the flag); what a run needs is what it holds. Output does not depend on the sizes.

Ctrl-C ends the answers between two steps: what they had is printed (a streamed answer's line ended), then the
timing so far, and the command exits 130.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from speclane.pipeline.cli import drive
from speclane.pipeline.cli.common import add_model_flags, add_spec_flags, engine_from_args, max_lanes_from_args
from speclane.pipeline.cli.progress import Progress
from speclane.pipeline.runtime.request import GenerateRequest, parse_request
from speclane.stages.contract.errors import RequestError, SpeclaneError
from speclane.stages.models.artifact import resolve
from speclane.stages.models.chat import ChatTemplate
from speclane.stages.models.tokenizer import Tokenizer

if TYPE_CHECKING:  # the parser (and --help) builds without torch, which these import
    from speclane.stages.contract.events import DoneEvent, TokenEvent

SAMPLING_FLAGS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for prompts (streams to the terminal, or --json)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    src.add_argument(
        "--requests",
        type=Path,
        help="JSONL file: one request a line (id, prompt | prompt_ids | messages, sampling fields, spec)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="send --prompt as a user message through the model's chat template (as `speclane client --chat`)",
    )
    p.add_argument("--system", default=None, help="system message for --chat")
    add_sampling_flags(p)
    p.add_argument("--json", action="store_true", help="one JSON object a request, in input order")
    p.add_argument("--stage-times", action="store_true", help="print each stage's share of round time")
    p.add_argument("--check-contracts", action="store_true", help="check every port's contract each round")
    add_model_flags(p)
    add_spec_flags(p)
    # None: sized for the requests (size_for), at most --max-len's default
    p.set_defaults(func=run, max_len=None, max_len_cap=p.get_default("max_len"))


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """The sampling flags of the commands that run a model here (generate, chat)."""
    p.add_argument("--max-tokens", type=int, default=None, help="tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (the default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None, help="makes sampled output reproducible")
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def sampling_defaults(args) -> dict:
    return {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}


def read_requests(args) -> list[GenerateRequest]:
    """The requests the flags ask for, validated before any model loads (an empty prompt or file is an error)."""
    defaults = sampling_defaults(args)
    if args.system is not None and args.prompt is None:
        raise RequestError(
            "--system goes with --prompt and --chat (a requests file gives its own messages)", field="system"
        )
    if args.requests is None:
        if args.prompt is not None:
            return [parse_request({"id": 0, **prompt_fields(args.prompt, args.chat, args.system), **defaults})]
        try:
            ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError as exc:
            raise RequestError(
                f"--prompt-ids: '{args.prompt_ids}' is not a comma-separated list of integers", field="prompt_ids"
            ) from exc
        return [parse_request({"id": 0, "prompt_ids": ids, **defaults})]
    out = []
    try:
        lines = args.requests.read_text().splitlines()
    except OSError as exc:
        raise RequestError(f"--requests: cannot read {args.requests}: {exc.strerror}", field="requests") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RequestError(f"{args.requests}:{n}: not JSON ({exc.msg})", field="requests") from exc
        if isinstance(data, dict):
            data = {**defaults, "id": len(out), **data}
        try:
            out.append(parse_request(data))
        except RequestError as exc:
            raise RequestError(f"{args.requests}:{n}: {exc}", field=exc.field) from exc
    if not out:
        raise RequestError(
            f"--requests {args.requests}: no requests in the file (one JSON object a line)", field="requests"
        )
    ids = [r.id for r in out]
    if len(set(ids)) != len(ids):
        raise RequestError(f"{args.requests}: request ids must be unique", field="id")
    return out


def prompt_fields(text: str, chat: bool, system: str | None) -> dict:
    """--prompt as request fields: the raw text, or with --chat a user message (after --system's, if given)."""
    if system is not None and not chat:
        raise RequestError("--system needs --chat (a system message goes through the chat template)", field="system")
    if not chat:
        if text == "":
            raise RequestError(
                "--prompt is empty; give some text (or --chat, which adds the chat template)", field="prompt"
            )
        return {"prompt": text}
    return {
        "messages": ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    }


def size_for(args: argparse.Namespace, requests: list[GenerateRequest], progress: Progress) -> None:
    """Fill --max-lanes and --max-len where they are not given: a lane a request (at most the profile's lanes or
    4) and the longest prompt + max_tokens (at most `args.max_len_cap`), the prompts tokenized as the engine will
    (a request that cannot be counted here takes the cap, and is refused or run by the engine as before)."""
    if args.max_lanes is None:
        args.max_lanes = min(len(requests), max_lanes_from_args(args))
    if args.max_len is not None:
        return
    tokenizer, chat, need = Tokenizer.load(resolve(args.model, progress=progress.loader())), None, 1
    for req in requests:
        try:
            messages = req.conversation(args.chat)
            if messages is not None:
                chat = chat or ChatTemplate.from_tokenizer(tokenizer)
                n = len(tokenizer.encode(chat.render(messages)))
            else:
                n = (
                    len(req.prompt_ids)
                    if req.prompt_ids is not None
                    else len(tokenizer.encode(req.prompt, add_special=True))
                )
        except SpeclaneError:
            n = args.max_len_cap
        need = max(need, n + req.max_tokens)
    args.max_len = min(need, args.max_len_cap)


def run(args: argparse.Namespace) -> int:
    from speclane.kernels import cpu_build

    requests = read_requests(args)
    progress = Progress.for_args(args)
    size_for(args, requests, progress)
    engine = engine_from_args(args, check_contracts=args.check_contracts, progress=progress)
    engine.time_stages = args.stage_times
    stream = not args.json and len(requests) == 1

    def on_token(ev: TokenEvent) -> None:
        if stream:
            sys.stdout.write(ev.text)
            sys.stdout.flush()

    start = time.perf_counter()
    with drive.interrupt_flag() as stop:
        finished = drive.run(engine, requests, chat=args.chat, on_token=on_token, progress=progress, stop=stop)
    elapsed = time.perf_counter() - start
    results = [f.done for f in finished]
    stopped = any(r.finish_reason == "cancelled" for r in results)
    for res in results:
        if args.json:
            print(json.dumps(result_json(res)))
        elif stream:
            print()
        else:
            print(f"[{res.rid}] {res.text}")
    if stopped:
        progress.line("(stopped)")
    if progress.enabled:
        progress.line(drive.compute_line(args))
    for f in finished:
        progress.line(("" if len(finished) == 1 else f"[{f.done.rid}] ") + f.line())
    if args.json or args.stage_times:
        summary = {
            "requests": len(results),
            "seconds": round(elapsed, 3),
            "completion_tokens": sum(r.usage["completion_tokens"] for r in results),
            "spec": engine.stats(engine.retired),
            "compute": {"dtype": args.dtype, "quant": args.quant, "path": cpu_build.describe()},
            "checkpoints": engine.checkpoints.stats() if engine.checkpoints is not None else None,
        }
        experts = engine.target.expert_stats()
        if experts is not None:  # a MoE target with --expert-cache: its fast tier's counters since load
            summary["experts"] = experts.as_dict()
        print(json.dumps({"summary": summary}), file=sys.stderr)
    if args.stage_times:
        print_stage_times("verify round", engine.times)
        print_stage_times("prefill pass", engine.prefill_times)
    if stopped:
        return 130  # as a shell reports a command that Ctrl-C ended
    return 0 if all(r.finish_reason != "error" for r in results) else 1


def result_json(res: DoneEvent) -> dict:
    out = {
        "id": res.rid,
        "tokens": list(res.tokens),
        "text": res.text,
        "finish_reason": res.finish_reason,
        "usage": res.usage,
        "spec": res.spec,
    }
    if res.error:
        out["error"] = res.error
    return out


def print_stage_times(title: str, times) -> None:
    total = sum(times.seconds.values())
    print(f"{title + ' stage':<24} share    ({total:.3f} s in all)", file=sys.stderr)
    for name, share in sorted(times.shares().items(), key=lambda kv: -kv[1]):
        print(f"  {name:<22} {share * 100:5.1f} %", file=sys.stderr)
