"""The `mtp` backend: a one-layer multi-token-prediction head from a companion file beside the artifact.

Each lane keeps the trunk's state that drafted its anchor (`out.hidden` of the last committed row: the last layer's
output before the final norm) and a window of the head's keys for the committed positions. A proposal pairs that
state with the anchor's embedding and drafts the token after it; the head's own output then pairs with that draft
for the next one, k times (`stages/models/mtp_net.py`). Greedy (one-hot q). Its row budget defaults to 8
(`--spec-draft-rows 0`). Without `mtp.safetensors` beside the artifact (or shipped for the embedded default) the
start is refused with an ArtifactError naming the missing file. Options: `path`, `window`, `shortlist_tokens` (as
dflash2's; head `shortlist` drafts through the int8 rows of the target's most frequent tokens), `lookup_trust` (as
dflash2's: where prompt lookup's matched suffix is at least this many tokens long, lookup's tokens are the drafts and
the head's next steps read them; 0: the head's drafts everywhere; docs/decisions/0007-dflash2-reads-prompt-lookup.md).
"""

from __future__ import annotations

import torch

from speclane.kernels.draft_chain import MtpChain, chain_serves, mtp_chain, mtp_project
from speclane.kernels.q8 import Q8Weight
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.models.draft_route import WindowRoute
from speclane.stages.models.lookup import lane_candidates, trust_option


class Mtp(ModelBackend):
    """The slot's carried vector is the trunk state that drafted its anchor."""

    name = "mtp"
    default_rows = 8
    option_names = ModelBackend.option_names + ("lookup_trust",)
    LOOKUP_TRUST = 3  # a matched suffix of at least this many tokens drafts lookup's tokens (0: never)
    LOOKUP_N = (1, 4)  # the suffix lengths prompt lookup tries (as `ngram`'s defaults)

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        self.lookup_trust = trust_option(self.name, self.options.get("lookup_trust", self.LOOKUP_TRUST))
        self.chain = self._chain()
        self.rope_rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def _chain(self) -> MtpChain | None:
        """The whole proposal in one C call, where the kernels, the layer's form and the head's serve it."""
        head = self.shortlist.rows if self.shortlist is not None else self.draft_head
        if not (chain_serves() and self.forms[0] is not None and isinstance(head, Q8Weight)):
            return None
        if self.embed.dtype != torch.bfloat16 or not self.embed.is_contiguous():
            return None
        m = self.net.mtp
        norms = (m.pre_fc_norm_embedding, m.pre_fc_norm_hidden, m.norm)
        return MtpChain(
            layer=self.forms[0],
            fc=m.fc.packed if m.fc.packed is not None else m.fc.weight.detach(),
            norms=tuple(n.weight.detach().float().contiguous() for n in norms),
            eps=m.norm.eps,
            embed=self.embed,
            head=head,
            ids=self.shortlist.ids.contiguous() if self.shortlist is not None else None,
        )

    def _rope(self, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's RoPE tables cos, sin [n, head_dim] of positions 0 .. n - 1, n >= upto: made once and doubled
        as positions grow (a table's row is what `tables` gives for its position)."""
        have = self.rope_rows[0].shape[0] if self.rope_rows is not None else 0
        if have < upto:
            self.rope_rows = tuple(t.contiguous() for t in self.net.tables(torch.arange(max(upto, 2 * have, 4096))))
        return self.rope_rows

    def raw_rows(self, state, batch, out, keep):
        """Row r pairs the trunk state before it (the previous row's, or the slot's carried one) with its own
        token's embedding: [rows, 2, hidden]; the slot carries its last committed row's state (nothing to project)."""
        if not all(n == 1 for n in batch.lane_rows):
            return self.raw_rows_drafted(state, batch, out, keep)
        # every row its lane's only one (a round nobody drafted in, all a busy engine runs): half the small ops
        prev = state.carry.index_select(0, batch.slots)
        state.carry.index_copy_(0, batch.slots, torch.where((keep > 0)[:, None], out.hidden.to(prev.dtype), prev))
        return torch.stack([prev.to(out.hidden.dtype), self.embed[batch.tokens]], dim=1)

    def raw_rows_drafted(self, state, batch, out, keep):
        """`raw_rows` for any batch (lanes of several rows among them)."""
        rows = out.hidden.shape[0]
        first = batch.cu_rows[:-1]
        prev = out.hidden.index_select(0, (torch.arange(rows, device=first.device) - 1).clamp(min=0))
        prev[first] = state.carry.index_select(0, batch.slots)
        state.carry_last(batch.slots, batch.cu_rows, out.hidden, keep)
        return torch.stack([prev, self.embed[batch.tokens]], dim=1)

    def project(self, raw, positions):
        """The rows' keys and values [rows, 1, kv]: in one C call where the proposal chain serves (its twin, the
        torch route below, elsewhere)."""
        if self.chain is not None and raw.device.type == "cpu" and raw.dtype == self.embed.dtype:
            k, v = mtp_project(self.chain, raw, positions, *self._rope(int(positions.max()) + 1))
            return k[:, None], v[:, None], None
        k, v = self.net.pair_kv(self.net.fuse(raw[:, 0], raw[:, 1]), positions)
        return k, v, None

    def draft(self, lanes, anchors, limits, state):
        """The head's drafts, except where prompt lookup's match is trusted: there lookup's tokens are the drafts
        and the head's steps read them as their inputs (a lane that lookup covers to its limit runs no step)."""
        width = max(limits)
        forced = None
        if self.lookup_trust:
            cand, level = lane_candidates(lanes, state.lookups, width, *self.LOOKUP_N)
            forced = torch.where((level >= self.lookup_trust) & (cand >= 0), cand, -1)
            past = torch.arange(width)[None] >= torch.tensor(limits)[:, None]  # masked after the proposal
            if bool(((forced >= 0) | past).all()):
                return forced.to(anchors.device)
            forced = forced.to(anchors.device) if bool((forced >= 0).any()) else None
        drafts = self._draft_steps(lanes, anchors, width, state, forced)
        return drafts if forced is None else torch.where(forced >= 0, forced, drafts)

    def _draft_steps(self, lanes, anchors, width, state, forced):
        dev = anchors.device
        slots = torch.tensor([lane.slot for lane in lanes], dtype=torch.int64).to(dev)
        pos = torch.tensor([lane.kv_len for lane in lanes], dtype=torch.int64).to(dev)
        if WindowRoute.serves(state.window, len(lanes), 1, width, self.forms[0]):
            if self.chain is not None:
                route = WindowRoute(state.window, slots, 1)
                at = pos[:, None] + torch.arange(width, device=pos.device)
                cos, sin = (t[at] for t in self._rope(max(lane.kv_len for lane in lanes) + width))
                h = state.carry.index_select(0, slots)
                args = (route.k, route.v, route.slot, route.base, width, forced)
                return mtp_chain(self.chain, h, anchors, cos, sin, *args)
            return self._draft_in_place(anchors, width, slots, pos, state, forced)
        wk, wv, valid = state.window.read(slots, max(lane.kv_len for lane in lanes))
        keys, values, mask = wk[:, 0], wv[:, 0], valid
        h, tok, drafts = state.carry.index_select(0, slots), anchors, []
        own = torch.ones(1, 1, dtype=torch.bool, device=dev)
        for d in range(width):
            x = self.net.fuse(h, self.embed[tok])[:, None]
            out, k, v = self.net.step(x, (pos + d)[:, None], keys, values, mask[:, None], own)
            h = out[:, 0]
            tok = _take(forced, d, self.head_argmax(self.net.head_in(h)))
            drafts.append(tok)
            keys, values = torch.cat([keys, k], dim=1), torch.cat([values, v], dim=1)
            mask = torch.cat([mask, torch.ones(len(lanes), 1, dtype=torch.bool, device=dev)], dim=1)
        return torch.stack(drafts, dim=1)

    def _draft_in_place(self, anchors, width, slots, pos, state, forced):
        """`draft` through the one-call layer (`stages/models/draft_route.py`): step d's row writes its key and
        value after the slot's window and the steps before it, and attends over all of them. The C chain
        (`kernels/draft_chain.py`) runs this loop in one call where it serves, with the same drafts."""
        route = WindowRoute(state.window, slots, 1)
        cos, sin = self.net.tables(pos[:, None] + torch.arange(width, device=pos.device))  # [lanes, width, hd]
        h, tok, drafts = state.carry.index_select(0, slots), anchors, []
        for d in range(width):
            h = self.net.fuse(h, self.embed[tok]).contiguous()  # the layer's input, then its output, in place
            route.run(self.forms[0], 0, h, cos[:, d].contiguous(), sin[:, d].contiguous(), step=d)
            tok = _take(forced, d, self.head_argmax(self.net.head_in(h)))
            drafts.append(tok)
        return torch.stack(drafts, dim=1)


def _take(forced, d: int, own):
    """Step d's token: the forced one where there is one (>= 0), the head's own elsewhere."""
    return own if forced is None else torch.where(forced[:, d] >= 0, forced[:, d], own)


BACKEND = Mtp
