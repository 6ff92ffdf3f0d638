"""The requests file the docs show (docs/examples/requests.jsonl, named by the README's Use section and by
docs/protocol.md) runs as written: `speclane generate --requests docs/examples/requests.jsonl --json` on the embedded
default model prints one JSON object a request, in the file's order, under the file's ids, and each request's own
fields (max_tokens, stop, spec) hold in its result."""

from __future__ import annotations

import json
from pathlib import Path

from speclane.pipeline.cli import main
from speclane.pipeline.runtime.request import parse_request

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "requests.jsonl"


def requests() -> list[dict]:
    return [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]


def test_the_docs_point_at_the_example():
    assert "--requests docs/examples/requests.jsonl" in (ROOT / "README.md").read_text()
    assert "(examples/requests.jsonl)" in (ROOT / "docs" / "protocol.md").read_text()


def test_the_example_shows_each_kind_of_request_and_stays_short():
    reqs = [parse_request(r) for r in requests()]  # a RequestError names the bad field
    assert {"prompt", "messages"} <= {k for r in requests() for k in r}
    assert any(m.role == "system" for r in reqs if r.messages for m in r.messages)
    assert any(r.temperature > 0 and r.seed is not None for r in reqs) and any(r.stop for r in reqs)
    assert all(r.max_tokens <= 32 for r in reqs)  # the test below runs it as it is: it must stay quick


def test_one_result_a_request_in_the_files_order(capsys):
    code = main(["generate", "--requests", str(EXAMPLE), "--json", "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in results] == [r["id"] for r in requests()]
    for req, res in zip(requests(), results):
        n = res["usage"]["completion_tokens"]
        assert n == len(res["tokens"]) and 1 <= n <= req["max_tokens"], res
        assert res["finish_reason"] == ("length" if n == req["max_tokens"] else "stop"), res
        for s in req.get("stop", []):
            assert s not in res["text"], (s, res)  # a stop string ends the text and is not part of it
        if req.get("spec") == {"enabled": False}:
            assert res["spec"]["drafted"] == 0 and res["spec"]["accepted_per_position"] == []
        elif "draft_tokens" in req.get("spec", {}):
            assert len(res["spec"]["accepted_per_position"]) <= req["spec"]["draft_tokens"]
    assert json.loads(err.strip().splitlines()[-1])["summary"]["requests"] == len(results)
