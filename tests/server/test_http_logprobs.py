"""`logprobs`, `top_logprobs` and `n` through the OpenAI-compatible gateway of a real `speclane serve --http`, with
the official client: OpenAI's shapes, streamed and not, the same values with speculation on and off, the ZeroMQ
protocol's token fields, and n choices that share one prefill."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from speclane.pipeline.net.client import Client
from tests.server.conftest import KEY, MODEL, post_json

openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
TOL = 1e-4  # float32 log_softmax of one row computed in passes of different row counts


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway[0], api_key=KEY, max_retries=0, timeout=120)


def chat_entries(client, spec, stream=False, **fields):
    call = dict(model=MODEL, messages=QUESTION, max_tokens=10, logprobs=True, top_logprobs=3, **fields)
    call["extra_body"] = {"speclane": spec}
    if not stream:
        answer = client.chat.completions.create(**call)
        return answer.choices[0].message.content, answer.choices[0].logprobs.content
    text, entries = "", []
    for chunk in client.chat.completions.create(stream=True, **call):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            entries += chunk.choices[0].logprobs.content
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    return text, entries


def test_chat_logprobs_are_the_same_with_speculation_on_and_off_streamed_or_not(client):
    text, plain = chat_entries(client, {"enabled": False})
    assert len(plain) == 10 and all(len(e.top_logprobs) == 3 for e in plain)
    for e in plain:
        assert e.logprob <= 0 and e.bytes == list(e.token.encode())
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True) and e.logprob <= tops[0] + TOL
        assert sum(math.exp(t) for t in tops) <= 1 + TOL
    assert "".join(e.token for e in plain) == text  # greedy, no special token: the tokens spell the text
    for spec, stream in (({"draft_tokens": 4}, False), ({"draft_tokens": 4}, True), ({"enabled": False}, True)):
        got_text, got = chat_entries(client, spec, stream)
        assert got_text == text
        assert [e.token for e in got] == [e.token for e in plain]
        assert [[t.token for t in e.top_logprobs] for e in got] == [[t.token for t in e.top_logprobs] for e in plain]
        for g, w in zip(got, plain):
            assert g.logprob == pytest.approx(w.logprob, abs=TOL)
            assert [t.logprob for t in g.top_logprobs] == pytest.approx([t.logprob for t in w.top_logprobs], abs=TOL)


def test_completion_logprobs_take_the_legacy_shape(client, gateway):
    call = dict(model=MODEL, prompt="One, two, three,", max_tokens=6, logprobs=2)
    whole = client.completions.create(**call).choices[0]
    lp = whole.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == whole.text and lp.text_offset[0] == 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[token] == value and 2 <= len(top) <= 3  # the chosen token is always in its entry
    streamed = [c.choices[0].logprobs for c in client.completions.create(stream=True, **call) if c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert [v for s in streamed for v in s.token_logprobs] == pytest.approx(lp.token_logprobs, abs=TOL)
    # vLLM's return_tokens_as_token_ids names the tokens by id; the ZeroMQ protocol carries the same values
    ids = client.completions.create(**call, extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs
    assert all(t.startswith("token_id:") for t in ids.tokens)
    with Client(gateway[1], timeout=120, api_key=KEY) as zmq_client:
        stream = zmq_client.generate(prompt="One, two, three,", max_tokens=6, logprobs=True, top_logprobs=2)
        tokens = list(stream)
    assert [f"token_id:{t.token_id}" for t in tokens] == ids.tokens
    assert [t.logprob for t in tokens] == pytest.approx(lp.token_logprobs, abs=TOL)
    assert [len(t.top_logprobs) for t in tokens] == [2] * 6 and tokens[0].prompt_tokens > 0


def test_logprob_fields_are_checked(client, gateway):
    status, body = post_json(
        gateway[0], "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "top_logprobs": 2}, key=KEY
    )
    assert status == 400 and body["error"]["param"] == "top_logprobs" and "logprobs" in body["error"]["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, logprobs=21)
    assert err.value.body["param"] == "logprobs" and "20" in err.value.body["message"]


def test_n_choices_share_one_prefill_and_count_the_prompt_once(client, gateway):
    with Client(gateway[1], timeout=120, api_key=KEY) as zmq_client:
        before = zmq_client.stats().checkpoints
    prompt = "Write a short list of fruits, one a line, starting with apple and then banana:"
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, n=2, temperature=1.0, seed=11)
    with Client(gateway[1], timeout=120, api_key=KEY) as zmq_client:
        after = zmq_client.stats().checkpoints
    assert [c.index for c in answer.choices] == [0, 1]
    single = [
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=1.0, seed=s).choices[0].text
        for s in (11, 12)
    ]
    assert [c.text for c in answer.choices] == single  # choice i is seeded seed + i
    one = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert answer.usage.prompt_tokens == one.usage.prompt_tokens
    assert answer.usage.completion_tokens == 16 and answer.usage.total_tokens == one.usage.prompt_tokens + 16
    # the second choice started from the first one's prompt, one token short of its end
    assert after["hits"] > before["hits"]
    assert after["tokens_reused"] - before["tokens_reused"] >= one.usage.prompt_tokens - 1
    streamed = {0: "", 1: ""}
    for chunk in client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, n=2, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, n=2)
    assert [c.message.content for c in whole.choices] == [streamed[0], streamed[1]]
    assert streamed[0] == streamed[1]  # greedy: both choices are the one answer


def test_the_curl_lines_of_docs_http_run(gateway):
    page = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()
    lines = [line[2:] for line in page.splitlines() if line.startswith("$ curl ")]
    assert len(lines) == 3
    base = gateway[0].removesuffix("/v1")
    outs = [
        subprocess.run(
            line.replace("http://127.0.0.1:8000", base).replace("sk-local", KEY),
            shell=True,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        for line in lines
    ]
    assert outs[0].startswith("speclane:num_requests_running ")
    entries = json.loads(outs[1])["choices"][0]["logprobs"]["content"]
    assert len(entries) == 4 and all(len(e["top_logprobs"]) == 2 for e in entries)
    chunks = [json.loads(line[6:]) for line in outs[2].splitlines() if line.startswith("data: {")]
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}
    assert all("usage" in c for c in chunks) and chunks[-1]["usage"]["completion_tokens"] == 8
