"""The OpenAI-compatible gateway of `speclane serve --http`, driven by the official `openai` client against a real
server process: models, chat and text completions streamed and not (the same text and usage both ways, equal to
the ZeroMQ protocol's answer), errors in OpenAI's shape with their HTTP status, the API key, and a client that
hangs up mid-stream getting its request cancelled."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from speclane.pipeline.net.client import Client
from speclane.pipeline.net.openai_api import HttpError, read_json
from tests.server.conftest import KEY, MODEL, post_json, wait_until

openai = pytest.importorskip("openai")  # the `test` extra; the gateway itself needs the `http` extra

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway[0], api_key=KEY, max_retries=0, timeout=120)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_streamed_and_not_agree_with_each_other_and_the_zmq_protocol(client, gateway):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12)
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens > 0 and whole.usage.total_tokens == (
        whole.usage.prompt_tokens + whole.usage.completion_tokens
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    with Client(gateway[1], timeout=120, api_key=KEY) as zmq_client:
        stream = zmq_client.generate(messages=QUESTION, max_tokens=12)
        stream.wait()
    assert stream.text == text


def test_completions_take_stop_seed_token_ids_and_the_spec_field(client):
    plain = client.completions.create(
        model=MODEL, prompt="One, two, three, four,", max_tokens=16, extra_body={"speclane": {"enabled": False}}
    )
    assert plain.object == "text_completion" and plain.model_extra["speclane"]["drafted"] == 0
    cut = client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=16, stop=[","])
    assert cut.choices[0].finish_reason == "stop" and "," not in cut.choices[0].text
    assert plain.choices[0].text.startswith(cut.choices[0].text)
    sampled = [
        client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=7)
        .choices[0]
        .text
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]
    ids = client.completions.create(model=MODEL, prompt=[504, 3575, 282], max_tokens=4, stream=True)
    pieces = list(ids)
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    "call, status, param",
    [
        (dict(kind="completions", prompt="x", max_tokens=4, temperature=-1.0), 400, "temperature"),
        (dict(kind="completions", prompt="x", max_tokens=4, extra_body={"logit_bias": {"1": 5}}), 400, "logit_bias"),
        (dict(kind="completions", prompt="x", max_tokens=4, n=17), 400, "n"),
        (dict(kind="completions", prompt="x", max_tokens=100_000), 400, "max_tokens"),
        (dict(kind="chat", messages=[{"role": "tool", "content": "x"}], max_tokens=4), 400, "messages.0.role"),
        (dict(kind="chat", messages=QUESTION, model="gpt-4o"), 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_field(client, call, status, param):
    call = dict(call)
    kind = call.pop("kind")
    call.setdefault("model", MODEL)
    api = client.completions if kind == "completions" else client.chat.completions
    with pytest.raises(openai.APIStatusError) as err:
        api.create(**call)
    assert err.value.status_code == status
    body = err.value.body
    assert body["param"] == param and body["message"] and body["type"]


# (route, body beside `model`, status, param, what the message says). One defect each, sent as raw JSON: a value of
# the wrong type is refused, never converted; the field named is the one the body has, whichever part of speclane
# (the body, the request model, the engine) finds the fault.
RAW_CASES = [
    ("chat/completions", {"messages": QUESTION, "max_tokens": "16"}, 400, "max_tokens", "valid integer"),
    ("chat/completions", {"messages": QUESTION, "ignore_eos": "yes"}, 400, "ignore_eos", "valid boolean"),
    ("chat/completions", {"messages": QUESTION, "stream": "yes"}, 400, "stream", "valid boolean"),
    ("chat/completions", {"messages": []}, 400, "messages", "field 'messages': messages is empty"),
    (
        "chat/completions",
        {"messages": QUESTION, "stop": 123},
        400,
        "stop",
        "field 'stop': give str or list[str], got int",
    ),
    ("chat/completions", {"messages": QUESTION, "stop": ["x"] * 17}, 400, "stop", "at most 16 stop strings"),
    ("chat/completions", {"messages": QUESTION, "stop": ["x" * 257]}, 400, "stop.0", "at most 256 bytes"),
    (
        "chat/completions",
        {"messages": QUESTION, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
        "field 'max_completion_tokens': Input should be greater than or equal to 1",
    ),
    (
        "chat/completions",
        {"messages": QUESTION, "max_completion_tokens": 100_000},
        400,
        "max_completion_tokens",
        "lower max_completion_tokens to at most",
    ),
    (
        "chat/completions",
        {"messages": QUESTION, "max_tokens": 4, "max_completion_tokens": 5},
        400,
        "max_completion_tokens",
        "not both",
    ),
    ("completions", {"prompt": [1, 10**9]}, 400, "prompt.1", "prompt[1] = 1000000000 is outside the vocabulary"),
    (
        "completions",
        {"prompt": "x", "speclane": {"draft_tokens": 9}},
        400,
        "speclane.draft_tokens",
        "field 'speclane.draft_tokens'",
    ),
    # an unknown field, at the top or inside `speclane`: the page named is the HTTP one, never the ZeroMQ protocol's
    ("completions", {"prompt": "x", "best_off": 1}, 400, "best_off", "remove it (see docs/http.md)"),
    ("completions", {"prompt": "x", "speclane": {"draft_token": 3}}, 400, "speclane.draft_token", "docs/http.md"),
    # under the server's 1 MiB as a body (UTF-8), over it as a message (JSON escapes each é in 6 bytes)
    ("completions", {"prompt": "\u00e9" * 350_000}, 413, "prompt", "--max-message-bytes"),
]


@pytest.mark.parametrize("route, body, status, param, says", RAW_CASES, ids=[f"{c[3]}: {c[4][:24]}" for c in RAW_CASES])
def test_wrong_types_and_bounds_are_refused_naming_the_field_the_body_has(gateway, route, body, status, param, says):
    got, answer = post_json(gateway[0], f"/v1/{route}", {"model": MODEL, **body}, key=KEY)
    error = answer["error"]
    assert (got, error["param"]) == (status, param), error
    assert says in error["message"], error
    assert "protocol.md" not in error["message"], error  # the ZeroMQ door's page is not where HTTP fields are


class _Body:
    """An HTTP request's body as the gateway reads it: headers and a stream of chunks (counted as read)."""

    def __init__(self, chunks: list[bytes], declared: bool):
        self.headers = {"content-type": "application/json"}
        if declared:
            self.headers["content-length"] = str(sum(map(len, chunks)))
        self.chunks, self.read = chunks, 0

    async def stream(self):
        for chunk in self.chunks:
            self.read += 1
            yield chunk


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_past_the_limit_is_refused_before_it_is_all_read(declared):
    import asyncio

    body = _Body([b'{"prompt": "', b"x" * 600, b"x" * 600, b'"}'], declared)
    with pytest.raises(HttpError) as err:
        asyncio.run(read_json(body, 1000))
    assert (err.value.status, err.value.param) == (413, "body") and body.read == (0 if declared else 3)
    assert asyncio.run(read_json(_Body([b'{"a": ', b"1}"], declared), 1000)) == {"a": 1}
    with pytest.raises(HttpError, match="not JSON"):
        asyncio.run(read_json(_Body([b"[" * 900], declared), 1000))


def test_a_wrong_api_key_is_refused(gateway):
    bad = openai.OpenAI(base_url=gateway[0], api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.models.list()
    assert err.value.status_code == 401 and "API key" in err.value.body["message"]


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_hangs_up_has_its_request_cancelled(gateway, stream):
    url, endpoint, log = gateway
    with Client(endpoint, timeout=60, api_key=KEY) as zmq_client:
        before = zmq_client.stats().finished.get("cancelled", 0)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 2000, "ignore_eos": True, "stream": stream}
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps(body),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    if stream:  # hang up after the first event
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
    else:  # hang up while the whole answer is being written (2000 tokens: minutes)
        with Client(endpoint, timeout=60, api_key=KEY) as zmq_client:
            wait_until(lambda: zmq_client.stats().lanes["active"] == 1, "the request running")
    conn.close()

    def cancelled():
        with Client(endpoint, timeout=60, api_key=KEY) as zmq_client:
            stats = zmq_client.stats()
        return stats.finished.get("cancelled", 0) > before and stats.lanes["active"] == 0

    wait_until(cancelled, "the abandoned request cancelled and its lane freed", 60)
    lines = [line for line in log.read_text().splitlines() if "speclane.requests" in line and "'cmpl-" in line]
    assert any("': cancelled, prompt " in line for line in lines)
    ids = [line.split("'")[1] for line in lines]
    assert len(ids) == len(set(ids))  # one line a request: the server's, never the gateway's too


def test_the_python_block_of_docs_http_runs(gateway, capsys):
    page = (Path(__file__).resolve().parents[2] / "docs" / "http.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert 'base_url="http://127.0.0.1:8000/v1", api_key="sk-local"' in code
    exec(code.replace("http://127.0.0.1:8000/v1", gateway[0]).replace("sk-local", KEY), {})
    out = capsys.readouterr().out
    assert "Paris" in out.splitlines()[0]


@pytest.mark.parametrize(
    "address, allow, message",
    [
        ("0.0.0.0:8000", False, "'0.0.0.0' is not a loopback address"),
        ("8000", False, "use HOST:PORT"),
        ("127.0.0.1:http", False, "use HOST:PORT"),
    ],
)
def test_http_address_is_checked_before_anything_loads(address, allow, message):
    pytest.importorskip("fastapi")
    from speclane.pipeline.net.http_door import http_socket
    from speclane.stages.contract.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        http_socket(address, allow)
    sock = http_socket("127.0.0.1:0", False)
    assert sock.getsockname()[0] == "127.0.0.1"
    sock.close()


def test_health_answers_without_a_key_and_models_says_when_it_started(client, gateway):
    import time

    parts = urlsplit(gateway[0])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b""
    finally:
        conn.close()
    created = client.models.list().data[0].created
    assert 0 < created <= time.time()
