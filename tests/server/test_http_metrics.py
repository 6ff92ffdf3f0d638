"""`GET /metrics` read by Prometheus' own text parser after real requests; vLLM's `stream_options` and extra
request fields as docs/http.md's table says (honoured, ignored or refused naming the field); one log line a
request, the ones refused included, at either door."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from speclane.pipeline.net.client import Client, ServerError
from tests.server.conftest import KEY, MODEL, post_json, wait_until

openai = pytest.importorskip("openai")


def get(url: str, path: str, key: str | None = None) -> tuple[int, str, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type", ""), resp.read().decode()
    finally:
        conn.close()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    status, kind, text = get(url, "/metrics")
    assert status == 200 and kind.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_count_real_requests(gateway):
    url = gateway[0]
    before = scrape(url)
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=120)
    prompt = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,"
    prompt_tokens = 0
    for text in (prompt, prompt + " 4, 5,"):  # the second begins with the first: a checkpoint hit
        answer = client.completions.create(model=MODEL, prompt=text, max_tokens=12, extra_body={"ignore_eos": True})
        assert answer.choices[0].finish_reason == "length"
        prompt_tokens += answer.usage.prompt_tokens
    after = scrape(url)

    def grew(name, labels=(), by=None):
        old, new = before.get((name, labels), 0.0), after[(name, labels)]
        assert new > old if by is None else new - old == by, (name, labels, old, new)

    grew("speclane:request_success_total", (("finished_reason", "length"),), by=2)
    grew("speclane:prompt_tokens_total", by=prompt_tokens)
    grew("speclane:generation_tokens_total", by=24)
    grew("speclane:time_to_first_token_seconds_count", by=2)
    grew("speclane:inter_token_latency_seconds_count")
    grew("speclane:spec_decode_num_draft_tokens_per_pos_total", (("position", "0"),))
    grew("speclane:spec_decode_num_accepted_tokens_per_pos_total", (("position", "0"),))
    grew("speclane:checkpoint_hits_total")
    grew("speclane:checkpoint_reused_tokens_total")
    grew("speclane:target_passes_total", (("kind", "verify"),))  # one request at a time: rounds alone
    grew("speclane:target_passes_total", (("kind", "prefill"),), by=2)
    assert after[("speclane:checkpoint_bytes", ())] > 0
    assert after[("speclane:num_requests_running", ())] == 0 and after[("speclane:num_requests_waiting", ())] == 0
    assert after[("speclane:time_to_first_token_seconds_bucket", (("le", "+Inf"),))] >= 2
    with Client(gateway[1], timeout=60, api_key=KEY) as zmq_client:  # the ZeroMQ door answers the same text
        assert "speclane:request_success_total" in zmq_client.metrics()


def test_continuous_usage_rides_on_every_chunk(gateway):
    body = {
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    parts = urlsplit(gateway[0])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    conn.request("POST", "/v1/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    events = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    conn.close()
    assert resp.status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" in c for c in chunks)
    done = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert done == sorted(done) and done[-1] == 5
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
    assert all(c["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"] > 0 for c in chunks)


GREEDY = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4}


@pytest.mark.parametrize(
    "extra",
    [
        {"vllm_xargs": {"a": 1}, "mm_processor_kwargs": {}, "length_penalty": 2.0, "guided_decoding_backend": "x"},
        {"min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0, "skip_special_tokens": True, "priority": 0},
        {"top_k": 1, "temperature": 1.5, "seed": 3},  # honoured: top_k 1 is the greedy answer whatever the heat
        {"stop_token_ids": [], "bad_words": [], "logit_bias": {}, "response_format": {"type": "text"}, "best_of": 1},
    ],
)
def test_vllm_extras_taken(gateway, extra):
    status, want = post_json(gateway[0], "/v1/completions", GREEDY, key=KEY)
    status, got = post_json(gateway[0], "/v1/completions", {**GREEDY, **extra}, key=KEY)
    assert status == 200 and got["choices"][0]["text"] == want["choices"][0]["text"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("min_p", 0.1),
        ("repetition_penalty", 1.2),
        ("guided_json", {"type": "object"}),
        ("cache_salt", "s"),
        ("min_tokens", 3),
        ("skip_special_tokens", False),
        ("response_format", {"type": "json_object"}),
        ("best_of", 3),
        ("truncate_prompt_tokens", 4),
        ("prompt_logprobs", 1),
    ],
)
def test_vllm_extras_that_would_lie_are_refused_naming_the_field(gateway, field, value):
    status, body = post_json(gateway[0], "/v1/completions", {**GREEDY, field: value}, key=KEY)
    assert status == 400 and body["error"]["param"] == field and "speclane" in body["error"]["message"]


def test_request_id_names_the_answer(gateway):
    status, body = post_json(gateway[0], "/v1/completions", {**GREEDY, "request_id": "mine-1"}, key=KEY)
    assert status == 200 and body["id"] == "mine-1"


def test_one_log_line_a_request_refusals_included(gateway):
    url, endpoint, log = gateway
    assert post_json(url, "/v1/completions", GREEDY, key="sk-wrong")[0] == 401
    assert get(url, "/v1/nowhere", key=KEY)[0] == 404
    assert post_json(url, "/v1/completions", {**GREEDY, "use_beam_search": True}, key=KEY)[0] == 400
    # refused by the server (the prompt and max_tokens past the engine's length): its line, not the gateway's too
    status, body = post_json(url, "/v1/completions", {**GREEDY, "request_id": "too-long", "max_tokens": 10**6}, key=KEY)
    assert status == 400 and body["error"]["param"] == "max_tokens"
    with Client(endpoint, timeout=60) as no_key, pytest.raises(ServerError):
        no_key.stats()  # the ZeroMQ door refuses a message without the key: one line too

    def lines():
        return [line for line in log.read_text().splitlines() if " INFO " in line]

    def logged():
        text = "\n".join(lines())
        return all(
            part in text
            for part in (
                "/v1/completions from",
                "401",
                "/v1/nowhere",
                "404",
                "(use_beam_search)",
                "error invalid_api_key",
            )
        )

    wait_until(logged, "the refusals logged", 30)
    assert len([line for line in lines() if "too-long" in line]) == 1
    assert len([line for line in lines() if "(use_beam_search)" in line]) == 1
