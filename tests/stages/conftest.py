"""Helpers for the stage case tables: lanes with a readable detokenizer (token n is the character chr(n))."""

from types import SimpleNamespace

import torch

from speclane.pipeline.runtime.request import parse_request
from speclane.stages.contract.lanes import Lane, LaneTable


class CharDetok:
    def push(self, t):
        return chr(t)

    def flush(self):
        return ""


def make_lane(slot=0, anchor=-1, kv_len=0, out=(), draft_tokens=7, rid=None, **req) -> Lane:
    request = parse_request({"prompt_ids": [1, 2], **req})
    return Lane(
        rid=slot if rid is None else rid,
        order=slot,
        slot=slot,
        prompt_ids=[1, 2],
        request=request,
        draft_tokens=draft_tokens,
        eos_ids=frozenset({0}),
        detok=CharDetok(),
        seed=slot,
        out_ids=list(out),
        kv_len=kv_len,
        anchor=anchor,
    )


def table(*lanes: Lane, max_lanes=8) -> LaneTable:
    t = LaneTable(max_lanes)
    for lane in lanes:
        t.free.remove(lane.slot)
        t.add(lane)
    return t


def batch(lane_rows):
    """The part of a RowBatch the commit and emit stages read: rows per lane and their offsets."""
    cu = [0]
    for n in lane_rows:
        cu.append(cu[-1] + n)
    return SimpleNamespace(lane_rows=tuple(lane_rows), cu_rows=torch.tensor(cu, dtype=torch.int64))


class Recorder:
    """A target that records what recurrent_replay hands it (the model's side is tested in tests/models)."""

    def __init__(self):
        self.calls = []

    def commit(self, state, batch, lengths, pass_out):
        self.calls.append(("recurrent", state, lengths.tolist(), pass_out))
