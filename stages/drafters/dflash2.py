"""The `dflash2` backend: a five-layer block drafter grafted into the target's artifact.

It reads the target's own hidden states at several layers (it declares them as `taps`: the layers its file
names) over a window of the last 2,048 committed positions, and proposes up to k tokens after each anchor in one
non-causal pass over a block of mask positions (`stages/models/dflash2_net.py`); a version 5 file also reads
what prompt lookup finds after each anchor (`stages/models/lookup.py`, the `ngram` rule, over the lane's prompt
and output) as its block rows' candidates. Proposals are greedy (a one-hot q:
the accept stage uses the exact sample-and-compare rule, so sampling keeps the target's distribution). The drafter is
loaded only when this backend is chosen, so speculation off costs nothing. Head `shortlist` (the spec's default)
proposes through an int8 copy of the head's rows for the target's most frequent tokens (`stages/models/shortlist.py`,
shared with mtp); `full` through the (int8 copy of the) target's whole output head.
Options: `path` (a directory holding dflash2.safetensors/json instead of the artifact's), `window`,
`shortlist_tokens`, `lookup_trust` (version 5: where prompt lookup's matched suffix is at least this many tokens
long, its tokens are the drafts; 0: the network's drafts everywhere). The network (the twelfth session's file) trusts
a long match less than it earns: on the bench's 8 held-out prompts a workload at k = 7 (`python -m bench.drafters`,
AMD EPYC Zen 5), tokens a round code generation / code editing / prose 2.11 / 2.06 / 1.56 with the network alone,
2.27 / 2.69 / 2.03 from a 3-token match (the default), 2.25 / 2.70 / 2.16 from 2, 2.08 / 2.63 / 2.16 from 1
(docs/artifacts.md). Not 2:
with it the bench's warm-up request drafted two lookup tokens that both missed, the measured plan's engine-wide
estimate fell from 0.575 to 0.31, and the plan then drafted almost nothing at 2 to 8 lanes (`speclane bench
--sections defaults`: 2 lanes 1.21x -> 0.93-0.97x off); from 3 it stayed at 1.21x.
Not here: the network, file checks (`stages/models`), the fitting (`stages/fitting/fit.py`).
"""
from __future__ import annotations

import attrs
import torch

from stages.drafters.base import empty_proposal
from stages.drafters.model_backend import ModelBackend
from stages.models.lookup import LookupIndex, lookup


class DFlash2(ModelBackend):
    name = "dflash2"
    default_rows = 0
    option_names = ModelBackend.option_names + ("lookup_trust",)
    LOOKUP_TRUST = 3   # a matched suffix of at least this many tokens drafts lookup's tokens (0: never)

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        self.taps = tuple(self.net.cfg.target_layers)   # declared; the draft stage sets the target's taps
        trust = self.options.get("lookup_trust", self.LOOKUP_TRUST)
        if isinstance(trust, bool) or not isinstance(trust, int) or trust < 0:
            raise ValueError(f"dflash2 option lookup_trust must be an integer >= 0 (0: never draft lookup's tokens), "
                             f"got {trust!r}")
        self.lookup_trust = trust

    def window_layers(self) -> int:
        return self.net.cfg.num_layers

    def raw_rows(self, state, batch, out, keep):
        if not self.net.cfg.paired:
            return out.taps                                                    # [rows, n_taps, hidden]
        return torch.cat([out.taps, self.embed[batch.tokens][:, None].to(out.taps.dtype)], dim=1)

    def project(self, raw, positions):
        if self.net.cfg.paired:                                               # paired by `flush`: (entry, feature)
            k, v = self.net.context_kv(raw[:, 0], positions)
            return k, v, raw[:, 1]
        feats = self.net.features(raw)                                         # [rows, hidden]
        k, v = self.net.context_kv(feats, positions)                          # [rows, layers, kv]
        return k, v, feats

    @torch.no_grad()
    def flush(self, state):
        """Version 3: each pending row's window entry pairs the feature of the row before it (the previous row of
        its pass, or the slot's carry for a lane's first row, the carry moving on pass by pass as the commits
        do) with its own token, all features in one product; then the shared upkeep appends them."""
        if self.net.cfg.paired and state.pending:
            raw = torch.cat([p.raw for p in state.pending])
            feats, embs = self.net.features(raw[:, :-1]), raw[:, -1]
            carry, start, paired = attrs.evolve(state, carry=state.carry.clone(), pending=[]), 0, []
            for p in state.pending:
                end = start + p.raw.shape[0]
                f = feats[start:end]
                prev = torch.cat([f[:1], f[:-1]])
                rows = torch.tensor([n > 0 for n in p.lane_rows], device=f.device)   # lanes with rows (host)
                prev[p.cu_rows[:-1][rows]] = carry.carry[p.slots[rows]].to(prev.dtype)
                carry.carry_last(p.slots, p.cu_rows, f, p.keep)
                paired.append(attrs.evolve(p, raw=torch.stack([self.net.pair(prev, embs[start:end]), f], dim=1)))
                start = end
            state.pending[:] = paired
        super().flush(state)

    @torch.no_grad()
    def propose(self, lanes, anchors, limits, state):
        width = max(limits, default=0)
        if width == 0:
            return empty_proposal(len(lanes), anchors.device)
        self.flush(state)
        state.claim(lanes)
        slots = torch.tensor([lane.slot for lane in lanes], dtype=torch.int64).to(anchors.device)
        start = torch.tensor([lane.kv_len for lane in lanes], dtype=torch.int64).to(anchors.device)
        k, v, valid = state.window.read(slots, max(lane.kv_len for lane in lanes))
        cand = level = found = None
        if self.net.cfg.looks_up:
            cand, level = (t.to(anchors.device) for t in self.candidates(lanes, state))
            found = self.net.lookup_input(self.embed, cand, level)
        states = self.net.block(self.embed[anchors], state.carry.index_select(0, slots), start, k, v,
                                valid, found)[:, 1:width + 1]                  # [lanes, width, hidden]
        # Flat rows before the head: a bf16 linear of a [lanes, width, hidden] slice went through bmm and copied the
        # whole transposed head every round (222 ms of a 245 ms proposal, one thread, torch 2.13.0, this CPU).
        drafts = self.head_argmax(states.reshape(-1, states.shape[-1])).view(len(lanes), width)
        if cand is not None and self.lookup_trust:
            cand, level = cand[:, :width], level[:, :width]
            drafts = torch.where((level >= self.lookup_trust) & (cand >= 0), cand, drafts)
        return self.within_limits(drafts, limits)

    def candidates(self, lanes, state):
        """Version 5's block-row candidates: what prompt lookup finds after each lane's tokens (its anchor last),
        one candidate for every block row whatever the lane's draft limit (the block is always whole, as
        fitted), as host tensors (tokens [lanes, block_size - 1], -1 where none, and the matched suffix's length,
        0 where none); each slot's index is kept while its lane holds it and extended by the new tokens only."""
        cfg = self.net.cfg
        width = cfg.block_size - 1
        cand = torch.full((len(lanes), width), -1, dtype=torch.int64)
        level = torch.zeros((len(lanes), width), dtype=torch.int64)
        for i, lane in enumerate(lanes):
            owner, index = state.lookups.get(lane.slot, (None, None))
            if owner is not lane:
                index = LookupIndex()
                state.lookups[lane.slot] = (lane, index)
            tokens, n = lookup(lane.tokens, index, width, cfg.lookup_min_n, cfg.lookup_max_n)
            if tokens:
                cand[i, :len(tokens)] = torch.tensor(tokens)
                level[i, :len(tokens)] = n
        return cand, level


BACKEND = DFlash2
