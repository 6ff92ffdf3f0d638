"""The --spec-* knobs land where the stage kinds declare, and a knob set to 0 takes the default a stage declares."""

import pytest

from speclane.pipeline.framework.knobs import knob_value, place, resolve_knobs
from speclane.pipeline.framework.spec import load_spec

# (knobs) -> (draft.backend, draft.head, anchor_gather.draft_tokens, anchor_gather.row_budget) on specs/verify.toml
CASES = [
    ({}, ("ngram", "shortlist", 7, 0)),
    ({"backend": "mtp", "draft_rows": 0}, ("mtp", "shortlist", 7, 8)),  # mtp declares 8 rows for "0"
    ({"backend": "dflash2", "draft_rows": 0}, ("dflash2", "shortlist", 7, 0)),  # dflash2: no cap
    ({"draft_rows": 0}, ("ngram", "shortlist", 7, 0)),
    ({"backend": "mtp", "draft_rows": 12, "draft_tokens": 3}, ("mtp", "shortlist", 3, 12)),
    ({"draft_head": "full", "backend": None}, ("ngram", "full", 7, 0)),
]


@pytest.mark.parametrize("knobs, expected", CASES)
def test_knobs_case_table(knobs, expected):
    spec = resolve_knobs(load_spec("verify"), knobs)
    draft, gather = spec.stage("draft").params, spec.stage("anchor_gather").params
    assert (draft["backend"], draft.get("head", "full"), gather["draft_tokens"], gather["row_budget"]) == expected
    assert (knob_value(spec, "backend"), knob_value(spec, "draft_tokens"), knob_value(spec, "draft_rows")) == (
        expected[0],
        expected[2],
        expected[3],
    )


def test_unset_knobs_leave_the_spec_as_it_is():
    spec = load_spec("verify")
    assert resolve_knobs(spec, {"backend": None, "draft_rows": None}) is spec


def test_a_knob_no_stage_takes_reads_none():
    assert knob_value(load_spec("prefill"), "draft_tokens") is None


def test_stages_with_a_device_parameter_are_placed_unless_the_spec_says():
    placed = place(load_spec("verify"), "meta")
    assert placed.stage("anchor_gather").params["device"] == "meta"
    assert "device" not in placed.stage("draft").params
    assert place(placed, "cpu").stage("anchor_gather").params["device"] == "meta"
