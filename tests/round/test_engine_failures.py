"""A stage that raises ends only the requests it fails on, when nothing has been committed yet; after a commit
the whole round's lanes end (rerunning would commit twice). The error names the stage."""

from speclane.pipeline.framework.spec import load_spec, parse_spec
from tests.fixtures.failing_stage import FailOnMarker
from tests.round.conftest import engine, requests


def _spec_with_failure(after: str):
    data = load_spec("verify").model_dump(by_alias=True)
    at = [s["name"] for s in data["stages"]].index(after) + 1
    data["stages"].insert(at, {"name": "boom", "kind": FailOnMarker.kind, "params": {"marker": 99}})
    return parse_spec(data, "failing")


def run(target, spec):
    eng = engine(target, spec=spec, max_lanes=3)
    eng.set_prefill_rows(None, 1)  # one prompt a prefill pass: the lanes join the rounds one step apart
    eng.raise_errors = False
    return eng.generate(requests([[5, 6, 7], [5, 99, 7], [8, 9, 10, 11]], max_tokens=6))


def test_failure_before_any_commit_ends_only_its_request(targets):
    good, bad, other = run(targets["llama"], _spec_with_failure("anchor_gather"))
    assert bad.finish_reason == "error"
    assert "stage 'boom' failed: RuntimeError: planted failure: lane" in bad.error
    assert good.finish_reason == other.finish_reason == "length"
    assert len(good.tokens) == len(other.tokens) == 6


def test_failure_after_a_commit_ends_the_whole_round(targets):
    # Prefill reads one prompt a step: the round that first holds the bad lane holds the first lane too, and the
    # third lane joins only after both have ended.
    good, bad, other = run(targets["llama"], _spec_with_failure("kv_commit"))
    assert good.finish_reason == bad.finish_reason == "error"
    assert "stage 'boom' failed" in good.error and "stage 'boom' failed" in bad.error
    assert other.finish_reason == "length" and len(other.tokens) == 6
