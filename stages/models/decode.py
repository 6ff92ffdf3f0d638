"""The plain decode loop: prompts through the target, then one row a lane a pass, greedy (or forced) tokens.

Owns: `greedy_decode`, the one hand-written decode loop without a stage graph, which drafter fitting
(stages/fitting/data.py: the target's answers and their taps), the bench's controls (bench/controls.py: the
minimal loop the engine is measured against; bench/sweeps.py: the reference output) and the tests' references
(plain decoding of a lane's tokens) all call; and `packs`, how whole prompts share a prefill pass. Not here: the
speculative round (the stage graph), sampling (greedy only: a reference for sampled text is the engine itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from speclane.stages.models.state import PassOutput, RowBatch, TargetState


def packs(lengths: list[int], chunk_rows: int):
    """(i, j) ranges of consecutive sequences whose rows fit one pass of `chunk_rows` (a longer one goes alone)."""
    i = 0
    while i < len(lengths):
        j, rows = i, 0
        while j < len(lengths) and (j == i or rows + lengths[j] <= chunk_rows):
            rows += lengths[j]
            j += 1
        yield i, j
        i = j


def _prefill_passes(lengths: list[int], chunk_rows: int | None, pack_rows: int | None):
    """Per pass: (lane, start, rows) pieces. `pack_rows`: whole prompts share a pass while they fit; otherwise one
    lane a pass, split into chunks of `chunk_rows` (None: whole), as the engine's prefill does."""
    if pack_rows:
        for i, j in packs(lengths, pack_rows):
            yield [(lane, 0, lengths[lane]) for lane in range(i, j)]
        return
    for lane, n in enumerate(lengths):
        step = chunk_rows or n
        for start in range(0, n, step):
            yield [(lane, start, min(step, n - start))]


@torch.no_grad()
def greedy_decode(
    target,
    prompts: Sequence[Sequence[int]],
    max_new: int,
    *,
    eos: Iterable[int] = (),
    state: TargetState | None = None,
    slots: Sequence[int] | None = None,
    chunk_rows: int | None = None,
    pack_rows: int | None = None,
    forced: Sequence[Sequence[int]] | None = None,
    on_pass: Callable[[list[int], RowBatch, PassOutput], None] | None = None,
) -> list[list[int]]:
    """Each lane's new tokens (up to `max_new`, ending at its first token in `eos`), greedy from the target.

    Prefill runs each prompt from position 0 (record "last", logits "last"; passes per `chunk_rows`/`pack_rows`);
    then every live lane runs its last token as one row of a shared pass and commits it. `state`/`slots`: run in
    these slots of an existing state (default: a fresh state, lane i in slot i). `forced[i]`: lane i's tokens are
    these instead of the argmax (teacher forcing: the state after plain decoding of known tokens; the last one is
    never run). `on_pass(lanes, batch, out)` sees every pass once its tokens are taken (`lanes`: the lane index of
    each of the batch's lanes).
    """
    n = len(prompts)
    eos = frozenset(eos)
    if state is None:
        state = target.new_state(n, max(map(len, prompts), default=0) + max_new + 1)
    slots = list(range(n)) if slots is None else list(slots)
    out_ids: list[list[int]] = [[] for _ in range(n)]

    def take(lanes: list[int], logits: torch.Tensor) -> None:
        for lane, tok in zip(lanes, logits.argmax(-1).tolist()):
            out_ids[lane].append(forced[lane][len(out_ids[lane])] if forced is not None else tok)

    for pieces in _prefill_passes([len(p) for p in prompts], chunk_rows, pack_rows):
        batch = RowBatch.build(
            [(slots[lane], s, list(prompts[lane][s : s + r])) for lane, s, r in pieces], device=target.device
        )
        out = target.forward(batch, state, record="last", logits="last")
        target.commit(state, batch, torch.tensor(batch.lane_rows, device=target.device), out)
        done = [(lane, row) for row, (lane, s, r) in enumerate(pieces) if s + r == len(prompts[lane])]
        take([lane for lane, _ in done], out.logits[[row for _, row in done]])
        if on_pass is not None:
            on_pass([lane for lane, _, _ in pieces], batch, out)
    live = [lane for lane in range(n) if max_new > 0]
    for _ in range(max_new - 1):
        live = [lane for lane in live if out_ids[lane][-1] not in eos]
        if not live:
            break
        batch = RowBatch.build(
            [(slots[lane], len(prompts[lane]) + len(out_ids[lane]) - 1, [out_ids[lane][-1]]) for lane in live],
            device=target.device,
        )
        out = target.forward(batch, state, record="rows", logits="all")
        target.commit(state, batch, torch.ones(len(live), dtype=torch.int64, device=target.device), out)
        take(live, out.logits)
        if on_pass is not None:
            on_pass(live, batch, out)
    return [ids[:max_new] for ids in out_ids]
