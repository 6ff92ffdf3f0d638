"""`speclane generate` without --max-lanes/--max-len sizes the engine for its requests: a lane a request (up to the
default's), the longest prompt + max_tokens (up to --max-len's default, past which a request is refused as before);
the tokens are those of the large explicit sizes."""

import argparse
import json

import pytest

from speclane.pipeline.cli import build_parser, common, main
from speclane.pipeline.cli.generate import read_requests, size_for
from speclane.pipeline.cli.progress import Progress
from speclane.stages.models.artifact import resolve
from speclane.stages.models.chat import ChatTemplate
from speclane.stages.models.tokenizer import Tokenizer

REQUESTS = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12},
    {"prompt": "def fib(n):", "max_tokens": 20},
]


@pytest.fixture(scope="module")
def tokenizer():
    try:
        return Tokenizer.load(resolve(None))
    except Exception as exc:  # noqa: BLE001  (no embedded model installed)
        pytest.skip(f"the default model is not installed ({exc})")


def _args(path, *extra):
    return build_parser().parse_args(["generate", "--requests", str(path), *extra])


def _need(tokenizer, req) -> int:
    if "messages" in req:
        ids = tokenizer.encode(ChatTemplate.from_tokenizer(tokenizer).render(req["messages"]))
    else:
        ids = tokenizer.encode(req["prompt"], add_special=True)
    return len(ids) + req["max_tokens"]


@pytest.mark.parametrize(
    "requests, flags, lanes, max_len",
    [
        (REQUESTS, (), 2, None),  # None: the longest request's need
        (REQUESTS * 3, (), 4, None),  # six requests: the default's 4 lanes
        (REQUESTS, ("--max-lanes", "3", "--max-len", "300"), 3, 300),  # given: kept
        ([{"prompt": "Hello", "max_tokens": 5000}], (), 1, 4096),  # past the default: refused by the engine
    ],
)
def test_sizes_follow_the_requests(tmp_path, tokenizer, requests, flags, lanes, max_len):
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    args = _args(path, *flags)
    size_for(args, read_requests(args), Progress(enabled=False))
    assert args.max_lanes == lanes
    assert args.max_len == (max_len or max(_need(tokenizer, r) for r in requests))


def test_the_sized_engine_gives_the_tokens_of_the_large_one(tmp_path, capsys, monkeypatch, tokenizer):
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    built = []
    make = common.engine_from_args

    def engine_from_args(args: argparse.Namespace, **kwargs):
        engine = make(args, **kwargs)
        built.append((engine.lanes.max_lanes, engine.max_len))
        return engine

    monkeypatch.setattr("speclane.pipeline.cli.generate.engine_from_args", engine_from_args)
    results = []
    for flags in ((), ("--max-lanes", "4", "--max-len", "4096")):
        assert main(["generate", "--requests", str(path), "--json", "--spec-backend", "ngram", *flags]) == 0
        results.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    assert built == [(2, max(_need(tokenizer, r) for r in REQUESTS)), (4, 4096)]
    assert [r["tokens"] for r in results[0]] == [r["tokens"] for r in results[1]]
    assert all(r["finish_reason"] in ("stop", "length") and r["tokens"] for r in results[0])
