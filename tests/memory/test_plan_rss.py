"""`speclane plan`'s total is the peak resident memory of `speclane generate` on the default model, within 10 %:
with generate's sized defaults (one prompt: a lane of its prompt + max_tokens, where the load's transient is the
peak) and with --max-lanes/--max-len set large (where the KV is). Each command runs in a fresh process: the plan's
`runtime` line is measured in its own process, and a child's peak is read by a parent that has no other child."""

import json
import os
import subprocess
import sys

import pytest

from speclane.stages.models.artifact import resolve

PROMPT = ["--chat", "--prompt", "What is the capital of France?", "--spec-backend", "ngram"]
PEAK = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stderr.write(done.stderr)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10)\n"
    "print(done.stdout)\n"
)


@pytest.fixture(scope="module")
def default_model():
    try:
        return resolve(None)  # converted once here, so no run below pays the conversion
    except Exception as exc:  # noqa: BLE001  (no embedded model installed: nothing to measure)
        pytest.skip(f"the default model is not installed ({exc})")


def speclane(*argv: str) -> tuple[int, str]:
    """(peak resident bytes, stdout) of `speclane argv` in a fresh process, one thread on one core."""
    cmd = [sys.executable, "-c", PEAK, sys.executable, "-m", "speclane.pipeline.cli", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    first, _, out = done.stdout.partition("\n")
    code, peak = map(int, first.split())
    assert code == 0, done.stderr[-2000:]
    return peak, out


def planned(lanes: int, context: int, *flags: str) -> dict:
    sizes = ("--lanes", str(lanes), "--context", str(context))
    _, out = speclane("plan", "--spec-backend", "ngram", "--memory", "64GiB", *sizes, *flags, "--json")
    return json.loads(out)


def test_the_sized_defaults_peak_at_the_plan(default_model):
    peak, out = speclane("generate", *PROMPT, "--json")
    result = json.loads(out.splitlines()[0])
    context = result["usage"]["prompt_tokens"] + 128  # sized: the prompt and the default max_tokens
    plan = planned(1, context)
    assert plan["bytes"]["runtime"] > 0 and plan["bytes"]["loading"] > 0  # one prompt: the load is the peak
    assert abs(peak - plan["bytes"]["total"]) <= 0.1 * peak, (peak, plan["bytes"])


def test_int8_weights_peak_at_the_plan(default_model):
    """--quant int8: the load holds the compute-dtype linears beside their int8 forms until quantizing returns."""
    peak, out = speclane("generate", *PROMPT, "--quant", "int8", "--json")
    context = json.loads(out.splitlines()[0])["usage"]["prompt_tokens"] + 128
    plan = planned(1, context, "--quant", "int8")
    assert abs(peak - plan["bytes"]["total"]) <= 0.1 * peak, (peak, plan["bytes"])


def test_large_explicit_sizes_peak_at_the_plan(default_model):
    flags = ("--checkpoint-memory", "0")  # a run of one prompt fills no 4 x 4096 tokens of checkpoints
    peak, _ = speclane(
        "generate", *PROMPT, "--max-tokens", "8", "--max-lanes", "4", "--max-len", "4096", *flags, "--json"
    )
    plan = planned(4, 4096, *flags)
    assert plan["bytes"]["loading"] == 0 and plan["bytes"]["kv"] > plan["bytes"]["dense"]  # the KV is the peak
    assert abs(peak - plan["bytes"]["total"]) <= 0.1 * peak, (peak, plan["bytes"])
