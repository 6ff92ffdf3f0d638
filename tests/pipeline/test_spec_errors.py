"""Bad specs are refused with every problem listed, each naming the stage, port or key (one defect a fixture)."""

from pathlib import Path

import pytest

from speclane.pipeline.framework.graph import build_graph
from speclane.pipeline.framework.spec import SPEC_DIR, load_spec
from speclane.stages.contract.errors import SpecError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "specs"

CASES = {
    "unknown_kind.toml": [
        "stage 'accept': unknown stage kind 'acept' (did you mean \"accept\"?); known kinds: "
        "accept, anchor_gather, draft, drafter_commit, kv_commit, prefill_gather, recurrent_replay, "
        "stream_emit, target_pass"
    ],
    "two_producers.toml": [
        "port 'committed' has two producers ('accept', 'accept2'); rename one output with a "
        "[[wires]] entry or drop a stage",
        "port 'committed_len' has two producers ('accept', 'accept2'); rename one output with "
        "a [[wires]] entry or drop a stage",
        "port 'logprobs' has two producers ('accept', 'accept2'); rename one output with a "
        "[[wires]] entry or drop a stage",
    ],
    "cycle.toml": ["the stages form a cycle: ping -> pong -> ping; break it by renaming a port"],
    "dims_mismatch.toml": [
        "stage 'wrong' input 'committed': contract mismatch with 'accept.committed': dims "
        "[lanes, k1] do not match [lanes]"
    ],
    "unknown_param.toml": [
        "stage 'target_pass': unknown parameter 'recrd' (did you mean \"record\"?); parameters "
        "of kind 'target_pass': record, logits"
    ],
    "bad_value.toml": ["stage 'anchor_gather': bad parameter value: draft_tokens must be 0 to 7, got 9"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_spec_lists_every_problem(name):
    path = FIXTURES / name
    with pytest.raises(SpecError) as err:
        build_graph(load_spec(path))
    assert err.value.problems == [f"{path}: {p}" for p in CASES[name]]
    assert f"invalid spec {path}: {len(CASES[name])} problem(s)" in str(err.value)


def test_missing_producer_names_each_consumer_with_a_suggestion():
    path = FIXTURES / "missing_input.toml"  # the draft stage removed
    with pytest.raises(SpecError) as err:
        build_graph(load_spec(path))
    problems = err.value.problems
    assert (
        f"{path}: stage 'target_pass' input 'batch': no stage produces it and the engine does not provide it; "
        "add a producer or a [[wires]] entry" in problems
    )
    # the engine's `drafter` round input is now the closest name (it was `draft_limit` before that port existed)
    assert any("stage 'accept' input 'draft_len'" in p and 'did you mean "drafter"?' in p for p in problems)
    assert len(problems) == 7


def test_unknown_top_level_key_is_refused():
    path = FIXTURES / "unknown_key.toml"
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.problems == [f"{path}: unknown key 'author' (remove it; see docs/spec-format.md)"]


def test_missing_file_names_the_shipped_specs(tmp_path):
    with pytest.raises(SpecError, match=r"cannot read spec file .*nope.toml.*one of: decode, prefill, verify"):
        load_spec(tmp_path / "nope.toml")


def test_not_toml(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(SpecError, match=r"bad.toml: not valid TOML"):
        load_spec(bad)


@pytest.mark.parametrize("path", sorted(SPEC_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_spec_validates(path):
    graph = build_graph(load_spec(path))
    assert graph.order()[0] in ("anchor_gather", "prefill_gather")
    assert graph.order()[-1] == "stream_emit"
