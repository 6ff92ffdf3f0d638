"""The `suffix` backend: suffix decoding over the lane's own tokens and over the requests that came before it.

Each slot keeps a suffix tree of its lane's prompt and answer (`stages/drafters/suffix_tree.py`), extended as the lane
grows; the backend's state holds one more tree, over the answers of finished requests (every lane the backend saw end
other than by an error), each after the last `max_depth - 1` tokens of its prompt (what a path can hold of the context
before it: an answer's start is drafted from the prompt's end, and a long prompt, which the lane's own tree holds, is
not taken in again every turn), kept within `cache_tokens` tokens by dropping the oldest requests first (a request past
the budget keeps its last `cache_tokens` tokens). A proposal matches the suffixes of the lane's tokens in both trees and
follows the most frequent continuation for as long as the estimated chance that every draft so far is accepted (the
product of continuation count / context count along the path) stays at or above `min_prob`; a suffix of m tokens drafts
at most floor(m * `spec_factor`) tokens (an echo, a match of suffix_tree.LONG_MATCH tokens or more, as far as its path
goes), never past the draft stage's limit. The tree whose draft has the higher expected acceptance (the sum of those
chances) wins, the lane's own on ties. Where the target's token took the place of the path's after a match of EDIT_MATCH
tokens or more, the lane's own tree also drafts as if the path's had been taken (an edit: `# 3.` for `# 2.`), which wins
where it scores higher (`Draft.resume`, calibrated apart). Greedy (one-hot q). Options: `cache_tokens`, `max_depth` (the
most tokens of context plus drafts a tree counts along one path; by default the larger of MAX_DEPTH and twice the draft
cap, which where `max_drafts` is unset is the measured pass cost's: the trees made once it is known), `min_prob`,
`spec_factor`, `max_drafts` (the most drafts a lane takes a round: past the draft stage's draft tokens where larger,
`draft_cap`; the row budget still caps the round; unset, WIDE_DRAFTS where the machine's measured pass cost allows, else
MAX_DRAFTS); `--suffix-cache-tokens` sets `cache_tokens`.

Finished lanes are taken into the cache at the backend's next call (a round's or a prefill chunk's `observe`, or a
proposal, before it drafts; `request_cache`, which the snapshot files call as an answer's checkpoint is written). A
lane's tree is built when it first drafts (`catch_up`; `backlog` counts the tokens it has yet to take in), so a lane
that never drafts costs only its place in the cache. The newest ended lanes' trees are kept (SPARES, or one a slot
where there are more), and a lane whose tokens begin with a kept tree's (a conversation's next turn) takes it over
and adds only the rest; any other lane starts from a new tree of its own tokens. Nothing is kept in a prompt
checkpoint. `speculate` gives each lane's Draft (its drafts and their chances), which the chained backends
(chain.py) weigh against a model drafter's through `expected`: the trees' own estimate scaled by how drafts from a
match of that length have fared (`Calibration`: a proposal's outcome is settled when its lane is next seen with
more tokens). Which draft a lane proposes is the trees' estimate alone; the calibration only weighs it, and gives
the measured draft plan its per-draft chances (`chances`), so a sure long path takes its drafts and a weak one is cut.
The Draft found for a lane is kept for the round (`drafts`): the proposal at the plan's limit is its first drafts.
"""

from __future__ import annotations

import functools

import attrs

from speclane.stages.contract.costs import RoundCosts
from speclane.stages.contract.lanes import MAX_DRAFT_TOKENS
from speclane.stages.drafters import CACHE_TOKENS  # tokens of earlier requests the cache tree keeps
from speclane.stages.drafters.base import DraftBackend, number_option, proposal_from_lists
from speclane.stages.drafters.suffix_cache import Calibration, Outcomes, RequestCache, lane_tokens
from speclane.stages.drafters.suffix_tree import NO_DRAFT, RESUME_MATCH, Draft, SuffixTree

MAX_DEPTH = 24  # tokens of context plus drafts a tree counts along one path
MIN_PROB = 0.1  # drafting stops where the estimated chance that every draft is accepted falls below this
SPEC_FACTOR = 1.0  # drafts per matched context token, at most
MOST_DRAFTS = 63  # `max_drafts` at most: a lane's anchor and drafts fit the pass-cost probe's 64 rows
# `max_drafts` by default: past the draft stage's 7 where a path is sure (an agent's echoed file), the measured plan
# taking only the drafts that pay (docs/decisions/0014-suffix-scoring.md, its last amendments); WIDE_DRAFTS where
# this machine's pass of WIDE_DRAFTS + 1 rows costs at most WIDE_COST times one of MAX_DRAFTS + 1
MAX_DRAFTS = 15
WIDE_DRAFTS = 31
WIDE_COST = 1.4
SPARES = 8  # ended lanes' trees kept at least, so agents taking turns in fewer slots each find their own
_option = functools.partial(number_option, "suffix")


@attrs.define(eq=False)
class LaneEntry:
    owner: object  # the lane this slot's tree belongs to
    tree: SuffixTree | None = None  # built at the lane's first proposal


@attrs.define(eq=False)
class SuffixState:
    lanes: dict  # slot -> LaneEntry
    cache: RequestCache
    spares: int = 1  # ended lanes' trees kept for a next turn (SPARES, or one a slot where there are more)
    spare: list = attrs.field(factory=list)  # those trees, newest last
    calibration: Calibration = attrs.field(factory=Calibration)
    outcomes: Outcomes = attrs.field(factory=Outcomes)  # proposals not yet settled, paths the target left
    found: dict = attrs.field(factory=dict)  # slot -> (lane, its token count, limit, the Draft found this round)


class Suffix(DraftBackend):
    name = "suffix"
    option_names = ("cache_tokens", "max_depth", "min_prob", "spec_factor", "max_drafts")

    def state_stats(self, state: SuffixState) -> dict[str, int]:
        """The cache tree's tokens against its budget, the requests it holds, and the lanes' and spare trees."""
        cache = state.cache
        return {
            "cache_tokens": cache.tokens,
            "cache_budget": cache.budget,
            "cache_requests": len(cache.held),
            "lane_trees": len(state.lanes),
            "spare_trees": len(state.spare),
        }

    def __init__(self, options, head, resources):
        super().__init__(options, head, resources)
        self.cache_tokens = _option(
            options,
            "cache_tokens",
            CACHE_TOKENS,
            int,
            lambda v: v >= 0,
            "an integer >= 0 (tokens of earlier requests kept; 0: none)",
        )
        self.follows_costs = "max_drafts" not in options  # the cap is MAX_DRAFTS or WIDE_DRAFTS (`draft_cap`)
        self.depth_follows = self.follows_costs and "max_depth" not in options  # twice the cap (`draft_cap`)
        self.max_drafts = _option(
            options,
            "max_drafts",
            WIDE_DRAFTS,
            int,
            lambda v: 1 <= v <= MOST_DRAFTS,
            f"an integer from 1 to {MOST_DRAFTS} (the most drafts a lane takes a round)",
        )
        self.max_depth = _option(
            options,
            "max_depth",
            max(MAX_DEPTH, 2 * self.max_drafts),
            int,
            lambda v: 2 <= v <= 256,
            "an integer from 2 to 256",
        )
        self.min_prob = _option(options, "min_prob", MIN_PROB, float, lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1")
        need = "a number above 0 (drafts per matched context token)"
        self.spec_factor = _option(options, "spec_factor", SPEC_FACTOR, float, lambda v: v > 0, need)

    def new_state(self, slots, max_len) -> SuffixState:
        return SuffixState({}, RequestCache(self.cache_tokens, SuffixTree(self.max_depth)), spares=max(SPARES, slots))

    def forget(self, state: SuffixState) -> None:
        self._retire(state)
        state.cache.clear()
        state.spare.clear()

    def _retire(self, state: SuffixState) -> None:
        """Take finished lanes out of their slots, into the cache."""
        for slot, entry in list(state.lanes.items()):
            if entry.owner.finish_reason is not None:
                del state.lanes[slot]
                self._remember(state, entry)

    def _remember(self, state: SuffixState, entry: LaneEntry) -> None:
        lane = entry.owner
        if lane.finish_reason is not None and lane.finish_reason != "error" and state.cache.budget:
            state.cache.add(lane.tokens[max(0, len(lane.prompt_ids) - self.max_depth + 1) :])
        if entry.tree is not None:  # a next turn's prompt may begin with this lane's tokens
            entry.tree.extend(lane.tokens[len(entry.tree.tokens) :])
            state.spare.append(entry.tree)
            del state.spare[: -state.spares]

    def _spare(self, state: SuffixState, lane, take: bool) -> SuffixTree | None:
        """The longest kept tree whose tokens the lane's begin with (taken out of the spares with `take`)."""
        tokens, best = lane.tokens, None
        for tree in state.spare:
            n = len(tree.tokens)
            if n <= len(tokens) and (best is None or n > len(best.tokens)) and tokens[:n] == tree.tokens:
                best = tree
        if best is not None and take:
            state.spare.remove(best)
        return best

    def _entry(self, state: SuffixState, lane) -> LaneEntry:
        entry = state.lanes.get(lane.slot)
        if entry is None or entry.owner is not lane:
            if entry is not None:
                self._remember(state, entry)
            entry = state.lanes[lane.slot] = LaneEntry(lane)
        return entry

    def _tree(self, state: SuffixState, lane) -> SuffixTree:
        """The lane's tree, brought up to its tokens so far."""
        entry = self._entry(state, lane)
        if entry.tree is None:
            entry.tree = self._spare(state, lane, take=True) or SuffixTree(self.max_depth)
        tree, done, prompt = entry.tree, len(entry.tree.tokens), lane.prompt_ids
        if done < len(prompt):
            tree.extend(prompt[done:])
            done = len(prompt)
        tree.extend(lane.out_ids[done - len(prompt) :])
        return tree

    def observe(self, state, lanes, batch, out, committed_len):
        self._retire(state)
        for lane in lanes:
            if lane.finish_reason is None:  # a lane seen once running is taken into the cache when it ends
                self._entry(state, lane)

    def backlog(self, state, lanes):
        out = []
        for lane in lanes:
            entry = state.lanes.get(lane.slot)
            if entry is not None and entry.owner is lane and entry.tree:
                done = len(entry.tree.tokens)
            else:
                done = len(getattr(self._spare(state, lane, take=False), "tokens", ()))
            out.append(lane_tokens(lane) - done)
        return tuple(out)

    def catch_up(self, state, lanes=None):
        if lanes is None:  # else ended lanes were taken into the cache as the last pass was observed
            self._retire(state)
        for lane in lanes if lanes is not None else [e.owner for e in state.lanes.values()]:
            self._tree(state, lane)

    def draft_cap(self, costs: RoundCosts | None = None) -> int:
        """`max_drafts` where set; else WIDE_DRAFTS where the measured pass cost says a pass that wide is cheap
        (`WIDE_COST`), else MAX_DRAFTS; WIDE_DRAFTS before the cost is probed, so the probe measures that wide."""
        cap = self.max_drafts
        if self.follows_costs and costs is not None and costs.rows:
            wide, dear = costs.covers(WIDE_DRAFTS + 1), WIDE_COST * costs.target_s(MAX_DRAFTS + 1)
            cap = WIDE_DRAFTS if wide and costs.target_s(WIDE_DRAFTS + 1) <= dear else MAX_DRAFTS
            if self.depth_follows:
                # trees made from now on count paths of a cap's drafts after a match as long (the cache's is made
                # again at the next proposal): a tree's every new token steps each of its open suffixes, so a
                # depth the cap cannot use is paid every round by every lane
                self.max_depth = max(MAX_DEPTH, 2 * cap)
        return cap if cap > MAX_DRAFT_TOKENS else 0

    def drafts(self, state: SuffixState, lanes, limits) -> list[Draft]:
        """Per lane its best Draft at its limit (`speculate`): the one found this round at that limit or above, cut
        to it, where the lane has not grown since; else found now (and kept for the round)."""
        out, todo = [], []
        for i, (lane, k) in enumerate(zip(lanes, limits)):
            k = min(k, self.max_drafts)
            kept_lane, at, kept_limit, draft = state.found.get(lane.slot, (None, 0, 0, None))
            fresh = kept_lane is lane and at == lane_tokens(lane) and kept_limit >= k
            out.append(draft.cut(k) if fresh else None)
            if not fresh:
                todo.append(i)
        if todo:
            found = self.speculate(state, [lanes[i] for i in todo], [min(limits[i], self.max_drafts) for i in todo])
            for i, draft in zip(todo, found):
                lane = lanes[i]
                at = lane_tokens(lane)
                state.found[lane.slot] = (lane, at, min(limits[i], self.max_drafts), draft)
                out[i] = draft
        return out

    def draft_chances(self, state: SuffixState, draft: Draft) -> tuple[float, ...]:
        """Each draft's chance of being accepted given the ones before it, calibrated (`Calibration.chances`)."""
        return state.calibration.chances(draft)

    def chances(self, state: SuffixState, lanes, caps):
        return tuple(self.draft_chances(state, d) for d in self.drafts(state, lanes, caps))

    def speculate(self, state: SuffixState, lanes, limits) -> list[Draft]:
        """Per lane its best Draft (at most its limit long; none at limit 0): from the lane's own tree or the cache's,
        whichever scores higher (the trees' own estimate of the expected accepted drafts), the lane's own on ties.
        `expected` weighs a Draft with what its match length has been worth."""
        self._retire(state)
        state.outcomes.settle(lanes, state.calibration)
        if state.cache.tree.depth != self.max_depth:
            state.cache.rebuild(SuffixTree(self.max_depth))
        out = []
        for lane, k in zip(lanes, limits):
            if k <= 0:
                if lane.finish_reason is None:
                    self._entry(state, lane)
                out.append(NO_DRAFT)
                continue
            tree = self._tree(state, lane)
            context = tree.tokens[-(self.max_depth - 1) :]
            own = tree.speculate(context, k, self.min_prob, self.spec_factor)
            cached = state.cache.tree.speculate(context, k, self.min_prob, self.spec_factor, better_than=own.score)
            out.append(self._resume(state, lane, tree, k, cached if cached.drafts else own))
            state.outcomes.found(lane, out[-1])
        return out

    def _resume(self, state: SuffixState, lane, tree: SuffixTree, k: int, found: Draft) -> Draft:
        """Where the target's newest token took the place of an echo's path, the lane's own tree drafts as if the
        path's token had been taken (`# 3.` for `# 2.`), where it matches RESUME_MATCH tokens and outscores `found`."""
        token = state.outcomes.refused_draft(lane)
        if token is None:
            return found
        context = tree.tokens[-(self.max_depth - 1) : -1] + [token]
        draft = tree.speculate(context, k, self.min_prob, spec_factor=k)  # the echo's: as far as its path goes
        return attrs.evolve(draft, resume=True) if draft.match >= RESUME_MATCH and draft.score > found.score else found

    def expected(self, state: SuffixState, draft: Draft) -> float:
        """The drafts of `draft` the target is expected to accept (`Calibration.worth`)."""
        return state.calibration.worth(draft)

    def proposed(self, state: SuffixState, lane, draft: Draft) -> None:
        """`draft` goes to the target for `lane` this round (settled when the lane is next seen: `Outcomes`)."""
        state.outcomes.propose(lane, draft)

    def propose(self, lanes, anchors, limits, state):
        found = self.drafts(state, lanes, limits)
        for lane, draft in zip(lanes, found):
            self.proposed(state, lane, draft)
        return proposal_from_lists([list(d.drafts) for d in found], limits, anchors.device)

    def request_cache(self, state: SuffixState) -> RequestCache:
        """The tree over finished requests, the lanes that have ended taken in first: what outlives a lane (and,
        with the snapshot files, a restart)."""
        self._retire(state)
        return state.cache


BACKEND = Suffix
