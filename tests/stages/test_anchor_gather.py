"""anchor_gather as a case table: running lanes in, anchors / positions / slots and each lane's draft limit out."""

import pytest
import torch

from speclane.stages.anchor_gather import AnchorGather
from tests.stages.conftest import make_lane, table

# (draft_tokens K, row_budget R, per lane (slot, anchor, kv_len, its own cap)) -> draft_limit per running lane
CASES = [
    (7, 0, [(0, 5, 10, 7)], (7,)),  # R = 0: no cap
    (3, 8, [(0, 5, 10, 7)], (3,)),  # 8 // 1 - 1 = 7 > K
    (3, 8, [(0, 5, 10, 7), (1, 6, 4, 7)], (3, 3)),  # 8 // 2 - 1 = 3
    (3, 8, [(0, 5, 10, 7), (1, 6, 4, 7), (2, 7, 9, 7)], (1, 1, 1)),  # 8 // 3 - 1 = 1
    (7, 3, [(0, 5, 1, 7), (1, 6, 1, 7), (2, 7, 1, 7), (3, 8, 1, 7)], (0, 0, 0, 0)),  # never below 0
    (7, 0, [(0, 5, 10, 2), (1, 6, 4, 0)], (2, 0)),  # a request's own cap; 0: speculation off
]


@pytest.mark.parametrize("k, budget, lanes, limit", CASES)
def test_anchor_gather_case_table(k, budget, lanes, limit):
    t = table(*[make_lane(slot=s, anchor=a, kv_len=n, draft_tokens=cap) for s, a, n, cap in lanes])
    out = AnchorGather(draft_tokens=k, row_budget=budget).run(t)
    assert out["draft_limit"] == limit
    assert out["anchors"].tolist() == [a for _, a, _, _ in lanes]
    assert out["positions"].tolist() == [n for _, _, n, _ in lanes]
    assert out["slots"].tolist() == [s for s, _, _, _ in lanes]
    assert [l.slot for l in out["lane_view"]] == [s for s, _, _, _ in lanes]
    assert out["anchors"].dtype == torch.int64


def test_lanes_still_in_prefill_or_finished_are_not_gathered():
    prefill = make_lane(slot=0, anchor=-1)
    done = make_lane(slot=1, anchor=3)
    done.finish_reason = "stop"
    running = make_lane(slot=2, anchor=4, kv_len=6)
    out = AnchorGather(draft_tokens=2).run(table(prefill, done, running))
    assert [l.slot for l in out["lane_view"]] == [2] and out["anchors"].tolist() == [4]


@pytest.mark.parametrize("params", [{"draft_tokens": 8}, {"draft_tokens": -1}, {"row_budget": -1}])
def test_out_of_range_params_are_refused(params):
    with pytest.raises(ValueError):
        AnchorGather(**params)
