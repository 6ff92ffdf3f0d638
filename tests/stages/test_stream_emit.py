"""stream_emit as a case table: committed runs (on the host) in, token events, next anchors and counters out.

Tokens decode as characters (token n is chr(n)); token 0 is the stop token.
"""
import pytest
import torch

from stages.contract.events import TokenEvent
from stages.stream_emit import StreamEmit
from tests.stages.conftest import batch, make_lane


def emit(lanes, committed, committed_len, draft_len, lane_rows, prefill=False):
    k1 = max(len(r) for r in committed)
    grid = torch.tensor([r + [-1] * (k1 - len(r)) for r in committed], dtype=torch.int64)
    return StreamEmit(prefill=prefill).run(lanes, grid, tuple(committed_len), torch.tensor(committed_len),
                                           tuple(draft_len), batch(lane_rows), pass_out=None)["events"]


# (committed run per lane, committed_len, draft_len, lane's max_tokens) ->
#     (events as (rid, index, token, text), each lane's next anchor, accepted drafts counted)
CASES = {
    "a whole run": ([[72, 105, 33]], [3], [2], [64],
                    [(0, 0, 72, "H"), (0, 1, 105, "i"), (0, 2, 33, "!")], [33], [2]),
    "one token, drafts rejected": ([[65, -1, -1]], [1], [2], [64], [(0, 0, 65, "A")], [65], [0]),
    "a stop token cuts the run": ([[65, 0, 66]], [3], [2], [64], [(0, 0, 65, "A"), (0, 1, 0, "")], [66], [2]),
    "max_tokens cuts the run": ([[65, 66, 67]], [3], [2], [2], [(0, 0, 65, "A"), (0, 1, 66, "B")], [67], [2]),
    "two lanes": ([[65, 66], [67, -1]], [2, 1], [1, 1], [64, 64],
                  [(0, 0, 65, "A"), (0, 1, 66, "B"), (1, 0, 67, "C")], [66, 67], [1, 0]),
}


@pytest.mark.parametrize("name", CASES)
def test_stream_emit_case_table(name):
    committed, n, drafted, max_tokens, events, anchors, accepted = CASES[name]
    lanes = [make_lane(slot=i, anchor=1, kv_len=10, max_tokens=m) for i, m in enumerate(max_tokens)]
    got = emit(lanes, committed, n, drafted, [d + 1 for d in drafted])
    assert got == [TokenEvent(*e) for e in events]
    assert [l.anchor for l in lanes] == anchors
    assert [l.kv_len for l in lanes] == [10] * len(lanes)   # the KV length is kv_commit's (test_kv_commit.py)
    assert [l.accepted for l in lanes] == accepted and [l.rounds for l in lanes] == [1] * len(lanes)
    assert [l.finish_reason is not None for l in lanes] == [any(t == 0 for t in r[:k]) or len(l.out_ids) >= m
                                                            for r, k, l, m in zip(committed, n, lanes, max_tokens)]


def test_prefill_only_a_final_chunk_yields_a_token():
    done, partial = make_lane(slot=0, kv_len=2), make_lane(slot=1, kv_len=512)
    got = emit([done, partial], [[70], [71]], [1, 0], [0, 0], [2, 512], prefill=True)
    assert got == [TokenEvent(0, 0, 70, "F")]
    assert (done.anchor, partial.anchor) == (70, -1)
    assert done.rounds == partial.rounds == 0   # prefill is not a round


def test_the_drafter_observes_the_committed_rows():
    seen = []

    class Drafter:
        def observe(self, state, lanes, batch, out, committed_len, prefill):
            seen.append((state, [l.slot for l in lanes], committed_len.tolist(), prefill))

    lanes = [make_lane(slot=3, anchor=1)]
    grid = torch.tensor([[65, 66]])
    StreamEmit().run(lanes, grid, (2,), torch.tensor([2]), (1,), batch([2]), pass_out=None, drafter=Drafter(),
                     drafter_state="state")
    assert seen == [("state", [3], [2], False)]
