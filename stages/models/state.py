"""The records a target pass reads and writes: RowBatch (input rows), TargetState (per-slot caches), PassOutput.

Owns: the shapes and dtypes of these records and how a fresh state is allocated. Not here: the math that fills
them (target.py and the layer modules) or who decides which rows run (pipeline).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from speclane.stages.contract.ports import Port
from speclane.stages.models.expert_slots import ExpertCounts

Tensor = torch.Tensor

KEY_BLOCK = 64  # attention reads keys in whole blocks of this many positions (see attention.py for why)


@attrs.frozen
class RowBatch:
    """One pass: every lane's rows, flat, lane after lane."""

    tokens: Tensor  # [rows] int64
    positions: Tensor  # [rows] int64 (RoPE positions)
    cu_rows: Tensor  # [lanes + 1] int64
    slots: Tensor  # [lanes] int64
    lane_rows: tuple[int, ...]  # host copy of cu_rows' differences
    lane_start: tuple[int, ...]  # host: each lane's committed KV length before this pass
    # The contract a `batch` port checks (stages/contract/ports.py: a record's own ports).
    PORTS: ClassVar[tuple[Port, ...]] = (
        Port("tokens", "int64", ("rows",), "device"),
        Port("positions", "int64", ("rows",), "device"),
        Port("cu_rows", "int64", ("lanes+1",), "device"),
        Port("slots", "int64", ("lanes",), "device"),
        Port("lane_rows", "int", ("lanes",), "host"),
        Port("lane_start", "int", ("lanes",), "host"),
    )

    @classmethod
    def build(cls, lanes: list[tuple[int, int, list[int]]], device="cpu") -> RowBatch:
        """From host `(slot, start, tokens)` per lane, positions start, start + 1, ... (tests, prefill)."""
        tokens = [t for _, _, toks in lanes for t in toks]
        positions = [s + j for _, s, toks in lanes for j in range(len(toks))]
        rows = tuple(len(toks) for _, _, toks in lanes)
        cu = [0]
        for r in rows:
            cu.append(cu[-1] + r)
        as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
        return cls(
            tokens=as_t(tokens),
            positions=as_t(positions),
            cu_rows=as_t(cu),
            slots=as_t([s for s, _, _ in lanes]),
            lane_rows=rows,
            lane_start=tuple(s for _, s, _ in lanes),
        )

    @property
    def rows(self) -> int:
        return sum(self.lane_rows)


@attrs.frozen
class AttnCache:
    k: Tensor  # [slots, kv_heads, capacity, head_dim], compute dtype
    v: Tensor


@attrs.frozen
class GdnCache:
    conv: Tensor  # [slots, conv_dim, kernel - 1], compute dtype: the last inputs of the conv
    recurrent: Tensor  # [slots, value_heads, key_dim, value_dim] float32


@attrs.frozen
class TargetState:
    """Per-slot model state. Mutated in place by `Target.forward` (keys and values of the pass's rows) and
    `Target.commit` (recurrent state). It holds no KV length: a slot's committed length is its lane's
    (`Lane.kv_len`, host), handed to every pass as `RowBatch.lane_start`, so the layout never reads the device."""

    layers: tuple[AttnCache | GdnCache, ...]
    max_len: int

    def reset(self, slot: int) -> None:
        """Free a slot for a new lane: zero recurrent state (stale keys sit past the new lane's length, masked)."""
        for c in self.layers:
            if isinstance(c, GdnCache):
                c.conv[slot].zero_()
                c.recurrent[slot].zero_()


@attrs.frozen
class GdnRecord:
    """What a Gated DeltaNet layer would leave behind: per row ("rows") or per lane after its last row ("last")."""

    conv: Tensor  # [rows | lanes, conv_dim, kernel - 1]
    recurrent: Tensor  # [rows | lanes, value_heads, key_dim, value_dim] float32


@attrs.frozen
class PassOutput:
    logits: Tensor  # [logit_rows, vocab] float32: every row, or each lane's last (logits="last")
    hidden: Tensor  # [rows, hidden]: last layer output before the final norm
    taps: Tensor  # [rows, len(hidden_taps), hidden]
    records: tuple[GdnRecord | None, ...]  # per decoder layer; None for attention layers
    record: str  # "rows" | "last"
    experts: ExpertCounts | None = None  # host: this pass's expert-cache lookups; None without a cache
    # The contract a `pass_out` port checks; the records' shapes differ per layer kind and are the layers' own.
    PORTS: ClassVar[tuple[Port, ...]] = (
        Port("logits", "float32", ("logit_rows", "vocab"), "device"),
        Port("hidden", "float", ("rows", "hidden"), "device"),
        Port("taps", "float", ("rows", "taps", "hidden"), "device"),
    )
