"""The benchmark harness end to end on the default model with exactly `speclane bench --quick`, the preset the docs
promise finishes in under two minutes: every section runs, writes its JSON and plots, and the figures that are not
timings hold (float32 exactness, the null path's tokens). No timing assertions: timings belong in bench/
(docs/benchmarks.md); the result's section_seconds says where the time went, for the person who reads it."""

from __future__ import annotations

import json

import pytest

from speclane.bench import workloads
from speclane.bench.__main__ import main
from speclane.bench.report import tables
from speclane.bench.settings import QUICK as PRESET
from speclane.bench.settings import SECTIONS

QUICK = ["--quick", "--threads", "1"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert main(QUICK + ["--json", str(out / "bench.json"), "--plot", str(out / "img")]) == 0
    return json.loads((out / "bench.json").read_text()), out / "img"


def test_the_quick_preset_keeps_every_section_and_stays_small():
    """What keeps --quick quick without dropping a section: one workload, one prompt, one repeat, one k, short
    answers (the wall time itself is measured, not asserted: docs/benchmarks.md)."""
    assert "sections" not in PRESET and "backends" not in PRESET  # every section, every drafter
    assert (PRESET["prompts"], PRESET["repeats"], len(PRESET["workloads"]), len(PRESET["draft_tokens"])) == (1, 1, 1, 1)
    assert PRESET["max_tokens"] <= 12 and max(PRESET["new_tokens"]) <= 16 and len(PRESET["buckets"]) == 1
    short = [p for p in workloads.load() if p["workload"] == PRESET["workloads"][0]][0]
    assert len(short["user"]) < 400  # prefill is most of a short run: the preset's prompt is a short one


def test_every_section_reports(result):
    res, _ = result
    assert {"limits", "null", "draft_tokens", "lanes", "lengths", "peers", "exactness"} <= set(res)
    assert set(res["section_seconds"]) == {"reference", *SECTIONS}
    w = res["settings"]["workloads"][0]
    rows = res["draft_tokens"][w]["rows"]
    assert {"off", "ngram@3", "oracle@3"} <= set(rows)
    for name in ("ngram@3", "oracle@3"):
        assert rows[name]["tokens_per_round"] >= 1.0
        assert len(rows[name]["accepted_per_position"]) >= 3
    assert rows["oracle@3"]["accepted_per_position"][:3] == [1.0, 1.0, 1.0]  # the oracle's drafts all pass
    for backend in ("dflash2", "mtp"):  # each either measured or skipped with its reason, never silently absent
        assert any(r["backend"] == backend for r in rows.values()) or backend in res["draft_tokens"][w]["skipped"]
    assert {(r["lanes"], r["config"]) for r in res["lanes"]["rows"]} >= {(1, "off"), (2, "rows=3"), (2, "rows=0")}
    assert "transformers" in res["peers"][w] or "transformers" in res["peers"]["skipped"]
    assert "llama.cpp" in res["peers"][w] or "llama.cpp" in res["peers"]["skipped"]
    assert res["peers"][w]["speclane"]["prefill_tps"]["median"] > 0  # the prefill rate beside decode
    bucket = res["lengths"]["256"]["rows"]
    assert set(bucket) == {"off", "ngram@3"} and set(bucket["ngram@3"]["speedup"]) == {"8", "16"}
    assert all(n == 16 for n in bucket["off"]["answer_tokens"])  # EOS ignored: every run reaches the longest
    assert res["limits"]["pass_bytes"]["weights"] > 100e6  # SmolLM2-135M in bf16 streams ~270 MB a pass


def test_exactness_and_null_path(result):
    res, _ = result
    for backend in ("ngram", "oracle"):
        assert res["exactness"]["float32"][backend] == [None], backend  # no divergence from plain in float32
    assert res["null"]["decode"]["same_tokens_as_loop"] and res["null"]["null"]["same_tokens_as_loop"]


def test_tables_and_plots(result):
    res, img = result
    text = tables(res)
    assert f"draft tokens on {res['settings']['workloads'][0]}" in text and "null drafter" in text
    assert "seconds by section: reference" in text
    names = {p.name for p in img.iterdir()}
    assert {
        "speedup_vs_draft_tokens.png",
        "acceptance_per_position.png",
        "speedup_vs_lanes.png",
        "peers.png",
        "speedup_vs_prompt_length.png",
    } <= names
    assert "prompt bucket 256" in text


def test_committed_prompts():
    prompts = workloads.load()
    assert len({p["id"] for p in prompts}) == len(prompts)
    for w in workloads.WORKLOADS:
        mine = [p for p in prompts if p["workload"] == w]
        assert len(mine) == workloads.PER_WORKLOAD
        assert all(p["user"].strip() and p["source"] for p in mine)
    for w in workloads.LONG:  # the 1k and 4k buckets: code edits and prose, about the promised size
        mine = [p for p in prompts if p["workload"] == w]
        assert len(mine) == workloads.PER_LONG
        assert all(0.9 * workloads.LONG[w] < len(p["user"]) < 1.1 * workloads.LONG[w] for p in mine)
