"""`speclane.bench.guidellm`: its checks on GuideLLM's `benchmarks.json` and the command it runs (always), and a
short concurrent run of GuideLLM against its own real server where a guidellm executable is found ($GUIDELLM, else
PATH). GuideLLM is not a dependency (it pulls its own torch): install it in a virtual environment of its own."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from speclane.bench import guidellm

GUIDELLM = os.environ.get("GUIDELLM") or shutil.which("guidellm")


def metric(total: float, median: float | None = None, mean: float | None = None) -> dict:
    return {"successful": {"total_sum": total, "median": total if median is None else median, "mean": mean or total}}


def report(successful: int = 3, errored: int = 0, output: float = 48.0, ttft: float = 900.0, rate: float = 3.2):
    """The parts of GuideLLM's `benchmarks.json` the checks read, for one concurrent@2 benchmark."""
    metrics = {
        "request_totals": {"successful": successful, "errored": errored, "incomplete": 1},
        "output_token_count": metric(output),
        "prompt_token_count": metric(282.0 if successful else 0.0),
        "time_to_first_token_ms": metric(ttft * successful, median=ttft),
        "output_tokens_per_second": metric(rate * 20, mean=rate),
    }
    return {"benchmarks": [{"config": {"strategy": {"type_": "concurrent", "streams": 2}}, "metrics": metrics}]}


def test_a_report_with_completed_requests_and_no_errors_passes():
    assert guidellm.check(report()) == []


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (report(errored=2), "concurrent@2: 2 request(s) errored"),
        # what GuideLLM printed, exiting 0, when every request failed: zero-filled tables
        (
            report(successful=0, errored=0, output=0.0, ttft=0.0, rate=0.0),
            "concurrent@2: no request completed; concurrent@2: zero output tokens, prompt tokens, time to first "
            "token, output tokens per second",
        ),
        (report(rate=0.0), "concurrent@2: zero output tokens per second"),
        ({"benchmarks": []}, "no benchmark in the report"),
    ],
)
def test_a_report_with_errors_or_zero_tables_is_refused(bad, problem):
    assert "; ".join(guidellm.check(bad)) == problem


def test_the_command_keeps_guidellm_defaults_but_what_it_requires_and_the_bounds(tmp_path):
    args = guidellm.parse(["--guidellm", "gl", "--streams", "1", "4", "--seconds", "30", "--requests", "5"])
    cmd = guidellm.guidellm_command(args, "http://127.0.0.1:8000", tmp_path)
    assert cmd[:2] == ["gl", "run"]
    options = dict(zip(cmd[2::2], cmd[3::2], strict=False))
    assert options["--backend"] == "kind=openai_http,target=http://127.0.0.1:8000"  # streamed chat, /health checked
    assert options["--tokenizer"] == f"kind=huggingface_auto,model={tmp_path}"
    assert options["--profile"] == "kind=concurrent,streams[0]=1,streams[1]=4"
    assert options["--data"] == "kind=synthetic_text,prompt_tokens=128,output_tokens=64"
    bounds = [cmd[i + 1] for i, x in enumerate(cmd) if x == "--constraint"]
    assert bounds == ["kind=max_duration,seconds=30", "kind=max_requests,count=5"]


@pytest.mark.skipif(
    GUIDELLM is None, reason="no guidellm executable ($GUIDELLM or PATH): `pip install guidellm` in a venv of its own"
)
def test_guidellm_completes_a_concurrent_run_against_a_real_server(tmp_path, capsys):
    argv = ["--guidellm", GUIDELLM, "--streams", "2", "--requests", "3", "--seconds", "300"]
    argv += ["--prompt-tokens", "32", "--output-tokens", "8", "--dtype", "float32", "--out", str(tmp_path)]
    assert guidellm.main(argv) == 0, capsys.readouterr().out[-4000:]
    out = capsys.readouterr().out
    assert "checks: ok" in out and guidellm.SUMMARY_START in out
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()
    (bench,) = json.loads((tmp_path / "benchmarks.json").read_text())["benchmarks"]
    totals = bench["metrics"]["request_totals"]
    assert totals["successful"] >= 1 and totals["errored"] == 0, totals
