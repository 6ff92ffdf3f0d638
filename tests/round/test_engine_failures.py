"""A stage that raises ends only the requests it fails on, when nothing has been committed yet; after a commit
the whole round's lanes end (rerunning would commit twice). The error names the stage."""
import attrs
import pytest
import torch

from pipeline.ports import Port
from pipeline.registry import Stage
from pipeline.spec import load_spec, parse_spec
from tests.round.conftest import engine, requests


@attrs.frozen
class FailOnToken(Stage):
    """Raises when any running lane's prompt holds `token`."""

    kind = "tests.round.test_engine_failures:FailOnToken"
    inputs = (Port("lane_view", "object", device="host"),)
    outputs = ()
    token: int = 99

    def run(self, lane_view):
        if any(self.token in lane.prompt_ids for lane in lane_view):
            raise RuntimeError(f"token {self.token} seen")
        return {}


def _spec_with_failure(after: str):
    data = load_spec("verify").model_dump(by_alias=True)
    at = [s["name"] for s in data["stages"]].index(after) + 1
    data["stages"].insert(at, {"name": "boom", "kind": FailOnToken.kind, "params": {}})
    return parse_spec(data, "failing")


def run(target, spec):
    eng = engine(target, spec=spec, max_lanes=3)
    eng.raise_errors = False
    return eng.generate(requests([[5, 6, 7], [5, 99, 7], [8, 9, 10, 11]], max_tokens=6))


def test_failure_before_any_commit_ends_only_its_request(targets):
    good, bad, other = run(targets["llama"], _spec_with_failure("anchor_gather"))
    assert bad.finish_reason == "error"
    assert "stage 'boom' failed: RuntimeError: token 99 seen" in bad.error
    assert good.finish_reason == other.finish_reason == "length"
    assert len(good.tokens) == len(other.tokens) == 6


def test_failure_after_a_commit_ends_the_whole_round(targets):
    # Prefill admits one lane a step: the round that first holds the bad lane holds the first lane too, and the
    # third lane joins only after both have ended.
    good, bad, other = run(targets["llama"], _spec_with_failure("kv_commit"))
    assert good.finish_reason == bad.finish_reason == "error"
    assert "stage 'boom' failed" in good.error and "stage 'boom' failed" in bad.error
    assert other.finish_reason == "length" and len(other.tokens) == 6
