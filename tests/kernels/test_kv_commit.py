"""commit_records: slots take the record of their last committed row (KV lengths are the lanes', tests/stages)."""

from __future__ import annotations

import pytest
import torch
from interpreted import require_interpreted_triton

from speclane.kernels import kv_commit as kc
from speclane.kernels.kv_commit import commit_records_ref


def impl(name):
    if name == "triton":
        require_interpreted_triton(kc)
        return lambda *a: kc.commit_records_triton(*a, block=16)  # 16: ragged 3*7=21
    return commit_records_ref


@pytest.mark.parametrize("name", ["ref", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_commit_case_table(name, dtype):
    commit = impl(name)
    # lanes: (slot, rows, committed_len): all rows, one row, nothing (committed_len 0), a middle row
    lanes = [(4, 4, 4), (0, 3, 1), (2, 2, 0), (1, 5, 3)]
    cu = torch.tensor([0, 4, 7, 9, 14])
    slots = torch.tensor([s for s, _, _ in lanes])
    clen = torch.tensor([c for _, _, c in lanes])
    records = torch.arange(14 * 3 * 7, dtype=torch.float32).view(14, 3, 7).to(dtype)
    state = torch.full((6, 3, 7), -1.0, dtype=dtype)
    commit(state, records, cu, clen, slots)
    assert (
        torch.equal(state[4], records[3]) and torch.equal(state[0], records[4]) and torch.equal(state[1], records[11])
    )
    assert bool((state[[2, 3, 5]] == -1).all())  # committed_len 0 and slots not in the round: untouched


def test_bad_slots_refused():
    with pytest.raises(ValueError, match="slots must be distinct"):
        commit_records_ref(
            torch.zeros(3, 2), torch.zeros(4, 2), torch.tensor([0, 2, 4]), torch.tensor([1, 1]), torch.tensor([1, 1])
        )
    with pytest.raises(ValueError, match="committed_len exceeds a lane's rows"):
        commit_records_ref(
            torch.zeros(3, 2), torch.zeros(4, 2), torch.tensor([0, 2, 4]), torch.tensor([3, 1]), torch.tensor([0, 1])
        )
