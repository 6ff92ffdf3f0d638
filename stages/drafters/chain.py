"""The chained backends `suffix+mtp` and `suffix+dflash2`: suffix drafts where the trees are confident, the model
drafter's elsewhere, chosen per lane and round.

A chain holds a `suffix` backend and a model drafter (`mtp` or `dflash2`) and reaches both through the backend
interface only (stages/drafters/base.py). Over all a round's lanes, the trees' best draft at each lane's limit
(`Suffix.speculate`) is weighed where the measured draft plan asks for its chances (`chances`, at the lanes' caps;
the backlog and the catch-up keep that choice; without the plan, the first of them weighs at the caps) and again,
over the same lanes, by the proposal at the plan's limits: what the target is expected to accept of it
(`Suffix.expected`: the path's chances, calibrated by what drafts from a match of that length have been worth)
against what the model drafter is expected to accept at the limit it would have alone (its row budget over the
lanes; a^j summed to it, a learnt from the lane's rounds the model drafted: chain_model.ModelRates). The trees win
the lane where theirs is at least `trust` times the model's. The other lanes go to the network only if what it adds
over the trees' drafts pays for its time, a share of a round without it (timed: chain_model.ModelCosts) times the
round's expected tokens: its proposal, each round's own rows and pass, and its backlog past them spread over the
rounds the lanes have left (as the plan spreads one); else the trees draft them too. A lane's own cap stands in
for its limit until the stage says.

A lane the trees win costs nothing of the model drafter that round: its window rows stay queued (`backlog` leaves
them out, `catch_up` leaves them for the round the network next drafts the lane, which projects them all in one
product), and a round the trees win for every lane runs no network at all. The network does not even observe the
passes until its state is read (a proposal, a catch-up, a checkpoint; chain_model.Held): it then observes every
held pass in order, so its window holds every committed row, whoever drafted it; a pass all of whose lanes have
left their slots is never observed, and only so many are held as one round without the network could observe
(the oldest are observed beyond that). The held passes count in the network's backlog and in its cost. Both are
greedy, so the proposal's q stays None (a one-hot q). Prompt checkpoints keep the model drafter's window (the
suffix trees are rebuilt from the tokens). Options: the two parts' own (flat: `cache_tokens`, `min_prob`, ... and
`path`, `window`, ...) and `trust` (a number >= 0; 0: the trees draft wherever they find a continuation).
`state.rounds` counts the lane rounds each part drafted. Not here: the trees (suffix.py, suffix_tree.py), the
networks (mtp.py, dflash2.py), how many drafts a lane takes (stages/draft_plan.py).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from speclane.stages.contract.lanes import MAX_DRAFT_TOKENS
from speclane.stages.drafters.base import DraftBackend, Proposal, number_option, proposal_from_lists
from speclane.stages.drafters.chain_model import ChainState, Found, ModelRates
from speclane.stages.drafters.dflash2 import DFlash2
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.drafters.mtp import Mtp
from speclane.stages.drafters.suffix import Suffix
from speclane.stages.drafters.suffix_cache import lane_tokens
from speclane.stages.drafters.suffix_tree import Draft

TRUST = 1.0  # the suffix drafts win a lane when expected to accept at least this times the model drafter's drafts
PRIOR = 0.5  # the model drafter's first-draft acceptance assumed where its file records none


def _cap(lane) -> int:
    """The most drafts the lane may be given this round, before the draft stage says."""
    room = getattr(lane, "draft_room", MAX_DRAFT_TOKENS)
    return max(0, min(MAX_DRAFT_TOKENS, getattr(lane, "draft_tokens", MAX_DRAFT_TOKENS), room))


class Chain(DraftBackend):
    model_class: ClassVar[type[ModelBackend]]

    def state_stats(self, state: ChainState) -> dict[str, int]:
        return self.suffix.state_stats(state.suffix)

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        need = "a number >= 0 (times the model drafter's expected accepted drafts a suffix path must score)"
        self.trust = number_option(self.name, self.options, "trust", TRUST, float, lambda v: v >= 0, need)
        self.suffix = Suffix(self._part(Suffix), head, resources)
        self.model = self.model_class(self._part(self.model_class), head, resources)
        self.taps = self.model.taps
        self.files = self.model.files  # the drafter's identity for checkpoint files is its network's

    def draft_cap(self, costs=None) -> int:
        """The trees' own cap (suffix's `max_drafts`, or what the pass cost allows): a lane the trees draft may go
        past the stage's draft tokens; a lane the network drafts never does (`_theirs`)."""
        return self.suffix.draft_cap(costs)

    def _theirs(self, lane, limit: int, lanes) -> int:
        """The most drafts the network may make for `lane` within `limit`: the stage's draft tokens at most, even
        where the trees' own cap lets the round offer more, and no more than its own row budget (its backend's
        default; 0: none) gives each of the round's `lanes`, as it would draft them alone."""
        rows = self.model_class.default_rows
        return max(0, min(limit, _cap(lane), rows // len(lanes) - 1 if rows and lanes else limit))

    def _part(self, cls) -> dict:
        return {k: v for k, v in self.options.items() if k in cls.option_names}

    def new_state(self, slots, max_len) -> ChainState:
        prior = self.model.prior_acceptance() or PRIOR
        return ChainState(
            self.suffix.new_state(slots, max_len), self.model.new_state(slots, max_len), ModelRates(prior)
        )

    def forget(self, state) -> None:
        self.suffix.forget(state.suffix)

    def observe(self, state, lanes, batch, out, committed_len):
        """The trees take the pass in; the network's observation waits until its state is read (`_release`),
        but for the oldest passes past what the chain holds (`ModelCosts.held_passes`)."""
        self.suffix.observe(state.suffix, lanes, batch, out, committed_len)
        state.held.hold(lanes, batch, out, committed_len)
        if len(state.held) > state.costs.held_passes():
            self._release(state, len(state.held) - state.costs.held_passes())

    def _release(self, state: ChainState, count: int | None = None) -> None:
        """The model drafter observes the oldest `count` held passes (None: all), in order."""
        passes = state.held.take(count)
        if passes:
            t0 = state.costs.clock()
            for lanes, batch, seen, committed_len in passes:
                self.model.observe(state.model, lanes, batch, seen, committed_len)
            state.costs.observed(len(passes), state.costs.clock() - t0)

    def _model_backlog(self, state: ChainState, lanes) -> tuple[int, ...]:
        """The network's backlog: its queued rows and those of the held passes."""
        return tuple(n + state.held.rows(lane) for lane, n in zip(lanes, self.model.backlog(state.model, lanes)))

    def _drafts(self, state: ChainState, lanes, limits) -> list[Draft]:
        """The trees' draft of each lane at its limit: this round's where found at that limit or above, else now."""
        out, todo = [], []
        for i, (lane, k) in enumerate(zip(lanes, limits)):
            f = state.found.get(lane.slot)
            fresh = f is not None and f.lane is lane and f.tokens == lane_tokens(lane) and f.limit >= k
            out.append(f.draft.cut(k) if fresh else None)
            if not fresh:
                todo.append(i)
        if todo:
            state.rates.update(lanes[i] for i in todo)  # a new round for these lanes: count the last one's outcome
            found = self.suffix.speculate(state.suffix, [lanes[i] for i in todo], [limits[i] for i in todo])
            for i, draft in zip(todo, found):
                state.found[lanes[i].slot] = Found(lanes[i], lane_tokens(lanes[i]), limits[i], draft)
                out[i] = draft
        return out

    def _split(self, state: ChainState, lanes, limits) -> tuple[list[Draft], list[bool]]:
        """The trees' drafts, and the lanes they draft: where they are expected to accept at least `trust` times
        what the network would; the other lanes go to the network only if what it is expected to add over the
        trees' drafts pays for its time (a share of the round, its window's backlog included) in the round's
        expected tokens. A lane the trees draft may draft nothing (no draft found). Weighed once a round for the
        same lanes at the same limits."""
        at = (tuple(map(id, lanes)), tuple(map(lane_tokens, lanes)))
        if state.splits.get("at") != at:
            state.splits = {"at": at}
        key = tuple(limits)
        if key not in state.splits:
            state.splits[key] = self._weigh(state, lanes, limits)
        return state.splits[key]

    def _weigh(self, state: ChainState, lanes, limits) -> tuple[list[Draft], list[bool]]:
        drafts = self._drafts(state, lanes, limits)
        ours = [self.suffix.expected(state.suffix, d) for d in drafts]
        theirs = [state.rates.expected(lane, self._theirs(lane, k, lanes)) for lane, k in zip(lanes, limits)]
        trees = [k == 0 or (bool(d.drafts) and s >= self.trust * m) for d, s, m, k in zip(drafts, ours, theirs, limits)]
        rest = [i for i, t in enumerate(trees) if not t]
        if rest:
            gain = sum(max(0.0, theirs[i] - ours[i]) for i in rest)
            spread = [max(1.0, (getattr(lanes[i], "draft_room", 0) + 1) / (1.0 + theirs[i])) for i in rest]
            backlog = self._model_backlog(state, [lanes[i] for i in rest])
            each = [min(n, 1.0 + theirs[i]) for n, i in zip(backlog, rest)]
            rows = sum(e + (n - e) / r for n, e, r in zip(backlog, each, spread))
            passes = min(len(state.held), 1) + max(0, len(state.held) - 1) / max(spread)
            if gain <= state.costs.share(rows, passes) * sum(1.0 + s for s in ours):
                trees = [True] * len(lanes)
        return drafts, trees

    def _trees(self, state: ChainState, lanes) -> list[bool]:
        """Whether the trees draft each of `lanes`: as this round's `chances` chose (a lane's tokens mark its round),
        else weighed for these lanes at their caps."""
        out = []
        for lane in lanes:
            d = state.decided.get(lane.slot)
            if d is None or d[0] is not lane or d[1] != lane_tokens(lane):
                return self._split(state, lanes, [_cap(lane) for lane in lanes])[1]
            out.append(d[2])
        return out

    def chances(self, state, lanes, caps):
        """Per lane the chances of the drafts of the part that drafts it at `caps[i]`: the trees' calibrated path
        chances (none where they found no draft), or the model drafter's learnt per-draft rate in that lane. The
        choice made here is the round's for the backlog and the catch-up (of the drafting lanes only). Weighed again
        for those lanes alone, the network's share of its row budget was wider, so a catch-up gave it lanes that the
        proposal, weighing all of them, did not: its window was projected for nothing."""
        drafts, trees = self._split(state, lanes, caps)
        state.decided = {lane.slot: (lane, lane_tokens(lane), t) for lane, t in zip(lanes, trees)}
        return tuple(
            self.suffix.draft_chances(state.suffix, d)
            if t
            else (state.rates.rate(lane),) * self._theirs(lane, k, lanes)
            for lane, k, d, t in zip(lanes, caps, drafts, trees)
        )

    def backlog(self, state, lanes):
        """The trees' backlog (taken in now: weighing reads them), and the network's only for the lanes this round's
        choice gives it (weighed at their caps where the plan has not chosen)."""
        trees = self._trees(state, lanes)
        own, model = self.suffix.backlog(state.suffix, lanes), self._model_backlog(state, lanes)
        return tuple(a + (0 if t else b) for a, b, t in zip(own, model, trees))

    def catch_up(self, state, lanes=None):
        self.suffix.catch_up(state.suffix, lanes)
        if lanes is None:
            self._release(state)
            self.model.catch_up(state.model)
            return
        trees = self._trees(state, lanes)
        theirs = [lane for lane, t in zip(lanes, trees) if not t]
        if theirs:
            self._release(state)
            rows, t0 = sum(self.model.backlog(state.model, theirs)), state.costs.clock()
            self.model.catch_up(state.model, theirs)
            state.costs.caught_up(rows, state.costs.clock() - t0)

    def choose(self, state: ChainState, lanes, limits) -> tuple[list[list[int]], tuple[int, ...]]:
        """Per lane the suffix drafts where the trees draft it (else []), and the limits left to the model drafter."""
        rows, rest = [], []
        for lane, k, draft, t in zip(lanes, limits, *self._split(state, lanes, limits)):
            rows.append(list(draft.drafts) if t else [])
            rest.append(0 if t else self._theirs(lane, k, lanes))
            if t:
                self.suffix.proposed(state.suffix, lane, draft)
            state.rates.drafted(lane, "model" if not t else "suffix" if draft.drafts else "")
        state.rounds["suffix"] += sum(1 for r in rows if r)
        state.rounds["model"] += sum(1 for k in rest if k)
        return rows, tuple(rest)

    def propose(self, lanes, anchors, limits, state) -> Proposal:
        state.costs.tick()
        rows, rest = self.choose(state, lanes, limits)
        own = proposal_from_lists(rows, limits, anchors.device)
        if not any(rest):
            return own
        self._release(state)
        t0 = state.costs.clock()
        theirs = self.model.propose(lanes, anchors, rest, state.model)
        state.costs.proposed(state.costs.clock() - t0)
        assert theirs.q is None, "a chained model drafter proposes greedily"
        drafts = own.drafts.clone()  # [lanes, max(limits)]
        drafts[:, : theirs.drafts.shape[1]] = torch.where(
            theirs.drafts >= 0, theirs.drafts, drafts[:, : theirs.drafts.shape[1]]
        )
        draft_len = tuple(m if k else s for s, m, k in zip(own.draft_len, theirs.draft_len, rest))
        return Proposal(drafts=drafts, draft_len=draft_len)

    def snapshot(self, state, slot, base=None):
        self._release(state)
        return self.model.snapshot(state.model, slot, base)

    def restore(self, state, lane, snap):
        self._release(state)
        self.model.restore(state.model, lane, snap)

    def request_cache(self, state: ChainState):
        return self.suffix.request_cache(state.suffix)

    def memory_bytes(self) -> int:
        return self.model.memory_bytes()

    def prior_acceptance(self) -> float | None:
        return self.model.prior_acceptance()


class SuffixMtp(Chain):
    name = "suffix+mtp"
    model_class = Mtp
    # suffix's (no cap), not mtp's 8 rows: with mtp's budget the trees got no drafts from five lanes on, where
    # suffix alone drafts; the measured plan weighs every lane's rows, the network's included
    default_rows = Suffix.default_rows
    option_names = Suffix.option_names + Mtp.option_names + ("trust",)


class SuffixDFlash2(Chain):
    name = "suffix+dflash2"
    model_class = DFlash2
    default_rows = DFlash2.default_rows
    option_names = Suffix.option_names + DFlash2.option_names + ("trust",)


BACKENDS = {cls.name: cls for cls in (SuffixMtp, SuffixDFlash2)}
