"""Moving each lane's recurrent state forward to its committed run, on the device.

Owns: `commit_records` (a slot's recurrent or conv state becomes the per-row record of the lane's last committed
row), with its `_ref` torch twin and triton kernel. Not here: deciding the committed run (kernels/accept.py),
computing the records (the model's Gated DeltaNet layers) or a KV length (the lane's, on the host: the
kv_commit stage advances it). Slots of one call are distinct (one lane per slot), so no two lanes write one slot.
A committed_len of 0 leaves the lane's slot untouched (a prefill chunk that is not the prompt's last).
"""

from __future__ import annotations

import torch

from speclane.kernels._triton import HAVE_TRITON, check, checks_values, tl, triton, use_triton


def _check_lanes(slots: torch.Tensor, committed_len: torch.Tensor, n_slots: int, device) -> None:
    check(
        slots.dim() == 1 and slots.dtype == torch.int64,
        f"slots must be int64 [lanes], got {slots.dtype} {tuple(slots.shape)}",
    )
    check(
        committed_len.shape == slots.shape and committed_len.dtype == torch.int64,
        f"committed_len must be int64 [lanes={slots.shape[0]}], got {committed_len.dtype} {tuple(committed_len.shape)}",
    )
    check(
        slots.device == device and committed_len.device == device,
        "slots, committed_len and the state must share a device",
    )
    if checks_values(slots):  # value ranges: host reads every round, so tests only (kernels/_triton.py)
        check(bool(((slots >= 0) & (slots < n_slots)).all()), f"slots must be in [0, {n_slots})")
        check(slots.unique().numel() == slots.numel(), "slots must be distinct")
        check(bool((committed_len >= 0).all()), "committed_len must be >= 0")


def _check_records(state, records, cu_rows, committed_len, slots) -> None:
    check(records.dtype == state.dtype, f"records dtype {records.dtype} != state dtype {state.dtype}")
    check(
        records.shape[1:] == state.shape[1:],
        f"records rows {tuple(records.shape[1:])} != state slots {tuple(state.shape[1:])}",
    )
    check(state.is_contiguous() and records.is_contiguous(), "state and records must be contiguous")
    check(cu_rows.shape == (slots.shape[0] + 1,) and cu_rows.dtype == torch.int64, "cu_rows must be int64 [lanes + 1]")
    _check_lanes(slots, committed_len, state.shape[0], state.device)
    if state.device.type == "cpu":
        check(bool((committed_len <= cu_rows[1:] - cu_rows[:-1]).all()), "committed_len exceeds a lane's rows")
        check(int(cu_rows[-1]) <= records.shape[0], f"cu_rows ends past records' {records.shape[0]} rows")


def commit_records_ref(state, records, cu_rows, committed_len, slots) -> torch.Tensor:
    """state[slots[l]] = records[cu_rows[l] + committed_len[l] - 1] where committed_len[l] > 0; in place."""
    _check_records(state, records, cu_rows, committed_len, slots)
    src = (cu_rows[:-1] + committed_len - 1).clamp(min=0)
    keep = (committed_len > 0).view(-1, *([1] * (state.dim() - 1)))
    return state.index_copy_(0, slots, torch.where(keep, records[src], state[slots]))


if HAVE_TRITON:

    @triton.jit
    def _records_kernel(state_ptr, rec_ptr, cu_ptr, len_ptr, slots_ptr, D, BLOCK: tl.constexpr):
        lane = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        n = tl.load(len_ptr + lane)
        src = (tl.load(cu_ptr + lane) + n - 1).to(tl.int64)
        dst = tl.load(slots_ptr + lane).to(tl.int64)
        mask = offs < tl.where(n > 0, D, 0)  # a scalar bool & in a mask trips the interpreter
        vals = tl.load(rec_ptr + src * D + offs, mask=mask)  # a plain copy: bf16 needs no upcast
        tl.store(state_ptr + dst * D + offs, vals, mask=mask)


def commit_records_triton(state, records, cu_rows, committed_len, slots, block: int = 1024):
    check(HAVE_TRITON, "commit_records_triton: triton is not installed")
    _check_records(state, records, cu_rows, committed_len, slots)
    d = state[0].numel() if state.shape[0] else 0
    if slots.numel() and d:
        grid = (slots.numel(), triton.cdiv(d, block))
        _records_kernel[grid](
            state, records, cu_rows.contiguous(), committed_len.contiguous(), slots.contiguous(), d, BLOCK=block
        )
    return state


def commit_records(state, records, cu_rows, committed_len, slots):
    """Dispatcher: triton on CUDA tensors, else the torch twin."""
    return (commit_records_triton if use_triton(state) else commit_records_ref)(
        state, records, cu_rows, committed_len, slots
    )
