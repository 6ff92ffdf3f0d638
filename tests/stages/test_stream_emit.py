"""stream_emit as a case table: committed runs (on the host) in, token events and next anchors out.

Tokens decode as characters (token n is chr(n)); token 0 is the stop token.
"""

import pytest
import torch

from speclane.stages.contract.errors import ContractError
from speclane.stages.contract.events import TokenEvent
from speclane.stages.stream_emit import StreamEmit
from tests.stages.conftest import make_lane


def emit(lanes, committed, committed_len, prefill=False):
    k1 = max(len(r) for r in committed)
    grid = torch.tensor([r + [-1] * (k1 - len(r)) for r in committed], dtype=torch.int64)
    return StreamEmit(prefill=prefill).run(lanes, grid, tuple(committed_len))["events"]


# (committed run per lane, committed_len, lane's max_tokens) -> (events as (rid, index, token, text), next anchors)
CASES = {
    "a whole run": ([[72, 105, 33]], [3], [64], [(0, 0, 72, "H"), (0, 1, 105, "i"), (0, 2, 33, "!")], [33]),
    "one token, drafts rejected": ([[65, -1, -1]], [1], [64], [(0, 0, 65, "A")], [65]),
    "a stop token cuts the run": ([[65, 0, 66]], [3], [64], [(0, 0, 65, "A"), (0, 1, 0, "")], [66]),
    "max_tokens cuts the run": ([[65, 66, 67]], [3], [2], [(0, 0, 65, "A"), (0, 1, 66, "B")], [67]),
    "two lanes": (
        [[65, 66], [67, -1]],
        [2, 1],
        [64, 64],
        [(0, 0, 65, "A"), (0, 1, 66, "B"), (1, 0, 67, "C")],
        [66, 67],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_stream_emit_case_table(name):
    committed, n, max_tokens, events, anchors = CASES[name]
    lanes = [make_lane(slot=i, anchor=1, kv_len=10, max_tokens=m) for i, m in enumerate(max_tokens)]
    got = emit(lanes, committed, n)
    assert got == [TokenEvent(*e) for e in events]
    assert [l.anchor for l in lanes] == anchors
    assert [l.finish_reason is not None for l in lanes] == [
        any(t == 0 for t in r[:k]) or len(l.out_ids) >= m for r, k, l, m in zip(committed, n, lanes, max_tokens)
    ]
    # one job: lengths and counters belong to kv_commit (test_kv_commit.py)
    assert [l.kv_len for l in lanes] == [10] * len(lanes) and [l.rounds for l in lanes] == [0] * len(lanes)


def test_a_stop_string_completed_inside_a_run_cuts_it_there():
    lane = make_lane(slot=0, anchor=1, stop=["BC"])
    got = emit([lane], [[65, 66, 67, 68]], [4])
    assert [e.text for e in got] == ["A", "", ""] and lane.text == "A" and lane.finish_reason == "stop"


def test_prefill_only_a_final_chunk_yields_a_token():
    done, partial = make_lane(slot=0, kv_len=2), make_lane(slot=1, kv_len=512)
    got = emit([done, partial], [[70], [71]], [1, 0], prefill=True)
    assert got == [TokenEvent(0, 0, 70, "F")]
    assert (done.anchor, partial.anchor) == (70, -1)


def test_an_empty_run_in_a_verify_round_is_refused():
    with pytest.raises(ContractError, match="committed no token in a verify round"):
        emit([make_lane(slot=0, anchor=1)], [[-1]], [0])
