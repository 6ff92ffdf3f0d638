"""The `dflash2` backend: a five-layer block drafter grafted into the target's artifact.

It reads the target's own hidden states at several layers (it declares them as `taps`: the layers its file names) over a
window of the last 2,048 committed positions, and proposes up to k tokens after each anchor in one non-causal pass over
a block of mask positions (`stages/models/dflash2_net.py`); a version 5 file also reads what prompt lookup finds after
each anchor (`stages/models/lookup.py`, the `ngram` rule, over the lane's prompt and output) as its block rows'
candidates. Proposals are greedy (a one-hot q: the accept stage uses the exact sample-and-compare rule, so sampling
keeps the target's distribution). The drafter is loaded only when this backend is chosen, so speculation off costs
nothing. Head `shortlist` (the spec's default) proposes through an int8 copy of the head's rows for the target's most
frequent tokens (`stages/models/shortlist.py`, shared with mtp); `full` through the (int8 copy of the) target's whole
output head. Options: `path` (a directory holding dflash2.safetensors/json instead of the artifact's), `window`,
`shortlist_tokens`, `lookup_trust` (version 5: where prompt lookup's matched suffix is at least this many tokens long,
its tokens are the drafts; 0: the network's drafts everywhere). The shipped network trusts a long match less than it
earns, so the default trusts a match of 3 tokens (the measured choice:
docs/decisions/0007-dflash2-reads-prompt-lookup.md, docs/artifacts.md). Not 2: with it the bench's warm-up request
drafted two lookup tokens that both missed, the measured plan's engine-wide estimate fell by half, and the plan then
drafted almost nothing at 2 to 8 lanes. Not here: the network, file checks (`stages/models`), the
fitting (`stages/fitting/fit.py`).
"""

from __future__ import annotations

import attrs
import torch

from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.models.draft_route import WindowRoute
from speclane.stages.models.drafter_window import PassRows
from speclane.stages.models.lookup import lane_candidates, trust_option


class DFlash2(ModelBackend):
    name = "dflash2"
    default_rows = 0
    option_names = ModelBackend.option_names + ("lookup_trust",)
    LOOKUP_TRUST = 3  # a matched suffix of at least this many tokens drafts lookup's tokens (0: never)

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        self.taps = tuple(self.net.cfg.target_layers)  # declared; the engine applies them (Target.tap)
        self.lookup_trust = trust_option(self.name, self.options.get("lookup_trust", self.LOOKUP_TRUST))

    def window_layers(self) -> int:
        return self.net.cfg.num_layers

    def draft_rows(self) -> int:
        return self.net.cfg.block_size

    def raw_rows(self, state, batch, out, keep):
        if not self.net.cfg.paired:
            return out.taps  # [rows, n_taps, hidden]
        return torch.cat([out.taps, self.embed[batch.tokens][:, None].to(out.taps.dtype)], dim=1)

    def project(self, raw, positions):
        if self.net.cfg.paired:  # paired by `flush`: (entry, feature)
            k, v = self.net.context_kv(raw[:, 0], positions)
            return k, v, raw[:, 1]
        feats = self.net.features(raw)  # [rows, hidden]
        k, v = self.net.context_kv(feats, positions)  # [rows, layers, kv]
        return k, v, feats

    def rows_project(self):
        return not self.net.cfg.paired

    def carry_in_rows(self):
        return True

    def append(self, state, p):
        """Version 3: each row's window entry pairs the feature of the row before it (in its entry, else the slot's
        last committed row before the entry, else the slot's carry) with its own token, all features in one
        product; then the shared upkeep appends them. Entries come grouped by slot, oldest first."""
        if not self.net.cfg.paired:
            return super().append(state, p)
        feats, embs = self.net.features(p.raw[:, :-1]), p.raw[:, -1]
        first, group, row = [], [], 0  # host: each entry's first row, its slot's
        for e, n in enumerate(p.lane_rows):
            group.append(row if e == 0 or p.slot_ids[e] != p.slot_ids[e - 1] else group[-1])
            first.append(row)
            row += n
        dev = feats.device
        committed = PassRows.of([(p.slots, p.lane_rows, p.keep)], state.carry.shape[0]).committed
        flat = torch.arange(p.rows, device=dev)
        last = torch.cummax(torch.where(committed, flat, -1), 0).values  # [rows] last committed row so far
        at, start = torch.tensor(first).to(dev), torch.tensor(group).to(dev)
        before = torch.where(at > 0, last.index_select(0, (at - 1).clamp(min=0)), -1)  # [entries]
        own = (before >= start)[:, None]
        prev = torch.cat([feats[:1], feats[:-1]])
        prev[at] = torch.where(
            own, feats.index_select(0, before.clamp(min=0)), state.carry.index_select(0, p.slots).to(feats.dtype)
        )
        super().append(state, attrs.evolve(p, raw=torch.stack([self.net.pair(prev, embs), feats], dim=1)))

    def draft(self, lanes, anchors, limits, state):
        width = max(limits)
        slots = torch.tensor([lane.slot for lane in lanes], dtype=torch.int64).to(anchors.device)
        start = torch.tensor([lane.kv_len for lane in lanes], dtype=torch.int64).to(anchors.device)
        cand = level = found = None
        if self.net.cfg.looks_up:
            cand, level = (t.to(anchors.device) for t in self.candidates(lanes, state))
            found = self.net.lookup_input(self.embed, cand, level)
        last = state.carry.index_select(0, slots)
        if WindowRoute.serves(state.window, len(lanes), self.net.cfg.block_size, 1, self.forms[0]):
            states = self._block_in_place(self.embed[anchors], last, start, slots, found, state)
        else:
            k, v, valid = state.window.read(slots, max(lane.kv_len for lane in lanes))
            states = self.net.block(self.embed[anchors], last, start, k, v, valid, found)
        states = states[:, 1 : width + 1]  # [lanes, width, hidden]
        # Flat rows before the head: a bf16 linear of a [lanes, width, hidden] slice goes through bmm, which copies
        # the whole transposed head every round.
        drafts = self.head_argmax(states.reshape(-1, states.shape[-1])).view(len(lanes), width)
        if cand is not None and self.lookup_trust:
            cand, level = cand[:, :width], level[:, :width]
            drafts = torch.where((level >= self.lookup_trust) & (cand >= 0), cand, drafts)
        return drafts

    def _block_in_place(self, anchor_emb, last, start, slots, found, state):
        """`net.block` through the one-call layer (`stages/models/draft_route.py`): the block's rows write their
        keys and values after their slot's window in each layer's part of it and attend over both."""
        x = self.net.block_input(anchor_emb, last, found)
        b, s, hidden = x.shape
        cos, sin = (t.reshape(b * s, -1).contiguous() for t in self.net.block_tables(start))
        x = x.reshape(b * s, hidden).contiguous()
        route = WindowRoute(state.window, slots, s)
        for i, form in enumerate(self.forms):
            route.run(form, i, x, cos, sin)
        return self.net.norm(x.view(b, s, hidden))

    def candidates(self, lanes, state):
        """Version 5's block-row candidates: one for every block row whatever the lane's draft limit (the block
        is always whole, as fitted)."""
        cfg = self.net.cfg
        return lane_candidates(lanes, state.lookups, cfg.block_size - 1, cfg.lookup_min_n, cfg.lookup_max_n)


BACKEND = DFlash2
