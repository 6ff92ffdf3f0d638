"""The verify round read in one sitting: the contract the graph in specs/verify.toml must match.

`reference_round` is one speculative round as plain calls on the models, kernels and drafter backends the stages
use, in the graph's order: anchor, draft, batched target pass, accept, KV commit, drafter commit, recurrent replay,
emit. Every lane takes every draft its caps allow (the graph's `plan = "fixed"`; the measured plan only takes
fewer). Given the same lanes, state and drafter, it leaves the same tokens, KV lengths, keys, values, conv and
recurrent states as the engine's round, bit for bit (tests/round/test_reference_round.py).
Not here: the executor, the registry, contract checks, stage timing, failure isolation, prefill, lane admission.
Unlike the graph (whose one host copy is kv_commit's) it reads the drafts back to lay out rows: plainer to read.
"""

from __future__ import annotations

import torch

from speclane.kernels.accept import accept
from speclane.stages.accept import uniform_at
from speclane.stages.anchor_gather import drafts_per_lane
from speclane.stages.contract.events import TokenEvent
from speclane.stages.contract.lanes import Lane, push_token
from speclane.stages.models.state import RowBatch, TargetState


def _on(dev, values, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=dev)


@torch.no_grad()
def reference_round(
    target, state: TargetState, drafter, drafter_state, lanes: list[Lane], draft_tokens: int, row_budget: int = 0
) -> list[TokenEvent]:
    """One verify round for `lanes` (prefilled: each holds an anchor; in row order). Mutates `state` (keys and
    values of every row, conv and recurrent state of each slot), `drafter_state` and the lanes (kv_len, out_ids,
    text, anchor, finish_reason, acceptance counters). Returns one event per emitted token."""
    dev = target.device
    # anchor: the token each lane holds, emitted but not yet run, at position kv_len (its committed KV length)
    per_lane = drafts_per_lane(draft_tokens, row_budget, len(lanes))
    limits = tuple(min(per_lane, lane.draft_tokens, lane.draft_room) for lane in lanes)
    anchors = _on(dev, [lane.anchor for lane in lanes])  # [lanes]

    # draft: up to limits[i] tokens after lane i's anchor, -1 past each lane's draft_len
    drafter.catch_up(drafter_state, [lane for lane, n in zip(lanes, limits) if n])
    proposal = drafter.propose(lanes, anchors, limits, drafter_state)
    drafts = proposal.drafts  # [lanes, k]
    rows = [[lane.anchor] + d[:n] for lane, d, n in zip(lanes, drafts.tolist(), proposal.draft_len)]

    # target pass: anchor + drafts of every lane as flat rows, keys written at kv_len + j, recurrent slots untouched
    batch = RowBatch.build([(lane.slot, lane.kv_len, r) for lane, r in zip(lanes, rows)], device=dev)
    out = target.forward(batch, state, record="rows", logits="all")  # logits [rows, vocab]

    # accept: the longest run of drafts the target itself draws, plus its own token after it
    k = drafts.shape[1]
    req = [lane.request for lane in lanes]
    u_sample = _on(
        dev, [[uniform_at(l.seed, len(l.out_ids) + j, 0) for j in range(k + 1)] for l in lanes], torch.float32
    ).reshape(len(lanes), k + 1)
    u_accept = (
        None
        if proposal.q is None
        else _on(dev, [[uniform_at(l.seed, len(l.out_ids) + j, 1) for j in range(k)] for l in lanes], torch.float32)
    )
    committed, committed_len, _ = accept(
        out.logits,
        batch.cu_rows,
        drafts,
        _on(dev, proposal.draft_len),
        proposal.q,
        _on(dev, [r.temperature for r in req], torch.float32),
        _on(dev, [r.top_k for r in req]),
        _on(dev, [r.top_p for r in req], torch.float32),
        u_accept,
        u_sample,
    )  # [lanes, k + 1], [lanes]

    # KV commit: the round's one copy to the host; each lane's length advances by its anchor + accepted drafts
    runs, run_len = committed.tolist(), committed_len.tolist()
    for lane, n, drafted in zip(lanes, run_len, proposal.draft_len):
        lane.kv_len += n
        lane.count_round(drafted, n - 1)

    # drafter commit: the drafter takes in each lane's committed rows (a model drafter's window)
    drafter.observe(drafter_state, lanes, batch, out, committed_len)

    # recurrent replay: each Gated DeltaNet slot takes the record of its lane's last committed row
    target.commit(state, batch, committed_len, out)

    # emit: tokens to their lanes, cut at a stop; the last committed token is the next anchor
    events = []
    for lane, run, n in zip(lanes, runs, run_len):
        for token in run[:n]:
            text, done = push_token(lane, token)
            events.append(TokenEvent(lane.rid, len(lane.out_ids) - 1, token, text))
            if done:
                break
        lane.anchor = run[n - 1]
    return events
