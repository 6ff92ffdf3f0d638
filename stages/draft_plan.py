"""The measured draft plan: how many drafts each lane takes this round, so that speculation never costs tokens/s.

A round's worth is its expected committed tokens over its time. Lane i drafting d tokens commits 1 + c_i1 + c_i1
c_i2 + ... + c_i1 ... c_id tokens on average (c_ij: the chance the target agrees with draft j, given it agreed with
the ones before; see below for where they come from), and the round costs one target pass of sum(1 + d_i) rows plus
the drafter's time. Both costs are measured (stages/contract/costs.py): the pass by a cached probe, the drafter from
its own recent rounds. The probe's lanes attend to a short context; a lane with more keys (`keys`) adds what its
anchor and each of its drafts spend on them (`RoundCosts.attend_s`), so an agent's long lane drafts only what pays
at its length. Draft j adds c_i1 ... c_ij tokens, and within a lane the j-th draft adds no more than the one
before, so taking drafts in falling order of what they add and keeping the best prefix by tokens per second
maximises the round's rate for every row count at once. No drafts at all is one of the prefixes: the plan is never
predicted slower than speculation off, and a drafting plan is taken only when it is predicted MARGIN faster than
none: the costs leave out the round's other stages, and the acceptance estimates are noisy, so a plan predicted
barely ahead can run behind (it did: docs/decisions/0002-measured-draft-plan.md).

Not every token is worth the same (`lane_values`): with no request waiting for a slot, a batch ends when its last
lane does, so a token won in a lane that ends sooner counts a quarter; and a lane still prefilling waits for the
round like a decoding one, so a dear round (a CPU where rows cost) is not spent on a batch's first lane while the
others wait for their prompts (docs/decisions/0002-measured-draft-plan.md). A lane that starts drafting pays
once for its backlog (a model drafter's window rows since it last drafted: `catch_up_charges`), spread over the
rounds it has left: cheap at an answer's start, its whole cost near the end.

A drafter that knows how sure it is of each of this round's drafts (`DraftBackend.chances`: the suffix trees' calibrated
path chances) gives those per lane instead: draft j of lane i then adds c_i1 * ... * c_ij (the chance that it and
every draft before it are accepted), so a sure long path takes its drafts and a weak one is cut, whatever the lane's
past rounds were; a lane with chances past which the drafter has no draft takes none there.

The chances of a lane without the drafter's own are learnt from its rounds (`AcceptanceTracker`), in two
parts: its first draft's, and a later draft's given the ones before it were accepted (draft j then adds
a_first * a_later^(j-1)). Each is learnt per lane (decayed, so a lane whose text turns repetitive is noticed),
pulled towards the engine's mean while the lane has little evidence. The engine's means decay towards 1/2, so
after a run of lanes that never accepted, a round now and then tries drafts again: a lane is never stuck at zero
by an early bad guess. A drafter that knows its own held-out acceptance (a fitted model drafter) gives it as the
prior instead, so a weak one is not tried on an optimistic guess.
"""

from __future__ import annotations

import attrs

from speclane.stages.contract.costs import RoundCosts

PRIOR = 0.5  # acceptance assumed before any evidence
LANE_WEIGHT = 4.0  # pseudo-drafts of the engine's mean in each lane's estimate
ENGINE_WEIGHT = 2.0  # pseudo-drafts of PRIOR in the engine's mean
LANE_DECAY = 0.9  # per round: a lane's evidence halves in about 7 rounds
ENGINE_DECAY = 0.98  # per round: the engine's in about 35
RATIO_STEPS = 8  # orderings tried at most where lanes' drafts cost apart (`_best_prefix`)
MARGIN = 1.05  # a drafting plan must be predicted this much faster than no drafts
OTHER_VALUE = 0.25  # a token of a lane that will not end last, with no request waiting (`lane_values`)
WAITING_WEIGHT = 1.0  # what a round's time costs a lane still prefilling, in its tokens a round (`lane_values`)


def plan_drafts(
    caps: tuple[int, ...],
    rates: tuple[float, ...],
    costs: RoundCosts,
    values: tuple[float, ...] | None = None,
    waiting: float = 0.0,
    catch_up: tuple[float, ...] | None = None,
    chances: tuple[tuple[float, ...] | None, ...] | None = None,
    rooms: tuple[int, ...] | None = None,
    keys: tuple[int, ...] | None = None,
) -> tuple[int, ...]:
    """Drafts per lane (each at most its cap) maximising expected tokens per second of the round, lane i's tokens
    counted at `values[i]` (default 1: every token the same), the lanes still prefilling at `waiting` tokens a
    round whatever the plan (their wait grows with the round's time; see `lane_values`), and a lane that drafts
    adding `catch_up[i]` seconds to the round (its share of its backlog, `catch_up_charges`). With a lane charged,
    the plan among only the uncharged lanes is weighed too: one dear lane early in the order does not keep the
    others from drafting. `chances[i]` (where given and not None): the drafter's chance that lane i's draft j is
    accepted given the ones before it were, for j = 1.. (`draft_gains`), in place of `rates[i]` for every draft.
    `rooms[i]`: the drafts that would end lane i's answer at its max_tokens (`_finish`). `keys[i]`: the keys lane i
    attends to (its length), where they cost more than the probe's (`RoundCosts.attend_s`)."""
    n = len(caps)
    if n == 0 or not any(caps):
        return (0,) * n
    values = values or (1.0,) * n
    catch_up = catch_up or (0.0,) * n
    keys = keys or (0,) * n
    rows = _Pass(
        costs, sum(costs.attend_s(k, 1) for k in keys), tuple(costs.attend_s(k, 2) - costs.attend_s(k, 1) for k in keys)
    )
    gains = tuple(draft_gains(cap, a, c) for cap, a, c in zip(caps, rates, chances or (None,) * n))
    off_rate = (sum(values) + waiting) / rows.pass_s(n)
    best_rate, best = _best_prefix(caps, gains, rows, values, waiting, catch_up)
    if any(c > 0 for c, cap in zip(catch_up, caps) if cap):
        rate, plan = _best_prefix(
            tuple(0 if c > 0 else cap for c, cap in zip(catch_up, caps)), gains, rows, values, waiting, catch_up
        )
        if rate > best_rate:
            best_rate, best = rate, plan
    best = best if best_rate >= off_rate * MARGIN else (0,) * n
    return _finish(best, caps, gains, rows, rooms) if rooms is not None and not waiting else best


@attrs.frozen
class _Pass:
    """A round's pass as the plan prices it: the probed pass of its rows, plus what its lanes' keys past the probe's
    context add (`RoundCosts.attend_s`): `base` for the lanes' anchors, `per_draft[i]` for each draft of lane i."""

    costs: RoundCosts
    base: float = 0.0
    per_draft: tuple[float, ...] = ()

    def pass_s(self, rows: int, drafts_s: float = 0.0) -> float:
        """A pass of `rows` rows whose drafts add `drafts_s` (a sum of `per_draft`)."""
        return self.costs.target_s(rows) + self.base + drafts_s


def _finish(plan, caps, gains, rows: _Pass, rooms) -> tuple[int, ...]:
    """One lane whose round can end its answer (its cap is its room: what is left of max_tokens, less the anchor's
    token), planned one draft short of it: without that draft a round of one row follows for the last token whatever
    the others do, with it that round is saved when every draft is accepted. So it is taken where the chance of that
    times a 1-row pass outweighs what the extra row (and the drafter's extra token) costs. The rate the plan
    maximises is one round's, which cannot see a round that will not be needed. Only one lane and none prefilling:
    with more, a next round runs anyway unless every lane's answer ends in this one."""
    if len(plan) != 1 or caps[0] < 1 or caps[0] != rooms[0] or plan[0] != caps[0] - 1 or len(gains[0]) < caps[0]:
        return plan
    d, costs = plan[0], rows.costs
    extra = costs.target_s(d + 2) - costs.target_s(d + 1) + rows.per_draft[0] + costs.draft_s(d + 1) - costs.draft_s(d)
    return (caps[0],) if gains[0][d] * rows.pass_s(1) > extra else plan


def draft_gains(cap: int, rate: float, chances: tuple[float, ...] | None = None) -> tuple[float, ...]:
    """What each of a lane's first `cap` drafts adds to its expected tokens: a^j at the learnt rate a, or, given the
    drafter's per-draft `chances` (each draft's, given the ones before it were accepted), their running product;
    no more than the chances given (past them the drafter has no draft). Non-increasing either way."""
    if chances is None:
        return tuple(rate**j for j in range(1, cap + 1))
    out, p = [], 1.0
    for c in chances[:cap]:
        if not 0.0 <= c <= 1.0:
            raise ValueError(f"draft plan: a drafter's chances must be from 0 to 1, got {c!r} in {chances!r}")
        p *= c
        out.append(p)
    return tuple(out)


def _best_prefix(caps, lane_gains, rows: _Pass, values, waiting, catch_up) -> tuple[float, tuple[int, ...]]:
    """The drafts in falling order of what they add, and the prefix of them with the best rate (none included).
    Where lanes' drafts cost apart (their keys, `_Pass.per_draft`), what a draft adds is weighed less its own cost
    at the best rate found so far, and the drafts ordered again until the rate stops rising (Dinkelbach's method
    for a best ratio: at the best rate r the best plan of each size has the largest gains less r times their cost,
    and a lane's drafts keep their order, each adding no more than the one before at the same cost)."""
    best = _prefix(caps, lane_gains, rows, values, waiting, catch_up, 0.0)
    if any(rows.per_draft):
        for _ in range(RATIO_STEPS):
            again = _prefix(caps, lane_gains, rows, values, waiting, catch_up, best[0])
            if again[0] <= best[0]:
                break
            best = again
    return best


def _prefix(caps, lane_gains, rows: _Pass, values, waiting, catch_up, price) -> tuple[float, tuple[int, ...]]:
    """The drafts in falling order of what they add less `price` times their own cost, and the best prefix."""
    n, costs = len(caps), rows.costs
    gains = sorted(
        (
            (values[i] * g - price * rows.per_draft[i], values[i] * g, -i)
            for i in range(n)
            for g in lane_gains[i][: caps[i]]
        ),
        reverse=True,
    )
    best_rate = (sum(values) + waiting) / rows.pass_s(n)
    best_len = 0
    tokens, width, per, drafting, extra, keys_s = float(sum(values) + waiting), 0, [0] * n, 0, 0.0, 0.0
    left = sum(g for _, g, _ in gains)  # what the drafts not yet taken add
    for m, (_, gain, neg_i) in enumerate(gains, start=1):
        if costs.rising and (tokens + left) / rows.pass_s(n + m) <= best_rate:
            break  # no longer prefix can beat the best: it adds at most `left` and its pass costs at least this one
        tokens += gain
        left -= gain
        if per[-neg_i] == 0:
            drafting += 1
            extra += catch_up[-neg_i]
        per[-neg_i] += 1
        keys_s += rows.per_draft[-neg_i]
        width = max(width, per[-neg_i])
        rate = tokens / (rows.pass_s(n + m, keys_s) + costs.draft_s(width, drafting) + extra)
        if rate > best_rate:
            best_rate, best_len = rate, m
    out = [0] * n
    for _, _, neg_i in gains[:best_len]:
        out[-neg_i] += 1
    return best_rate, tuple(out)


def catch_up_charges(
    backlog_s: tuple[float, ...],
    remaining: tuple[int, ...],
    caps: tuple[int, ...],
    rates: tuple[float, ...],
    chances: tuple[tuple[float, ...] | None, ...] | None = None,
) -> tuple[float, ...]:
    """Seconds charged to a round in which lane i drafts for its backlog (`backlog_s[i]`: catching up the rows
    observed since it last drafted, its whole prompt the first time): paid once, it serves every later round the
    lane drafts, so it is spread over the rounds the lane has left if it keeps drafting (`remaining[i]` tokens at
    most, 1 + a + ... + a^cap a round), at least one. Early in an answer a prompt's projection costs each round
    little; near its end a lane that has not drafted would pay its whole backlog for a token or two
    (docs/decisions/0004-draft-cost-record.md). `chances`: as `plan_drafts` reads them."""
    chances = chances or (None,) * len(caps)
    return tuple(
        s / max(1.0, r / (1.0 + sum(draft_gains(c, a, p)))) if s > 0 else 0.0
        for s, r, c, a, p in zip(backlog_s, remaining, caps, rates, chances)
    )


def lane_values(
    remaining: tuple[int, ...], prefilling: tuple[int, ...], queued: int, reach: int
) -> tuple[tuple[float, ...], float]:
    """What a token of each decoding lane is worth to the engine's throughput, and what the round's time costs the
    admitted lanes still prefilling (their tokens wait for it: their weight, as if each emitted one token a round).
    `remaining`: tokens each decoding lane may still emit (its max_tokens left; an answer may end sooner);
    `prefilling`: the same for the lanes still prefilling, which end after a decoding lane that may emit no more
    (they have not started). While requests wait for a slot, every token counts: a lane that ends sooner lets the
    next one in. With none waiting, the work ends when the lane that ends last does, so a token won in another lane
    saves no pass (a pass of a few rows costs about what one of one row does) and is worth `OTHER_VALUE`, not nothing:
    it still ends that request sooner. A lane within `reach` (one round's most tokens) of the last counts as last."""
    ends = tuple(remaining) + tuple(r + reach for r in prefilling)
    if queued > 0 or not ends:
        values = (1.0,) * len(ends)
    else:
        last = max(ends)
        values = tuple(1.0 if e > last - reach else OTHER_VALUE for e in ends)
    return values[: len(remaining)], WAITING_WEIGHT * sum(values[len(remaining) :])


@attrs.define(eq=False)
class AcceptanceTracker:
    """Decayed acceptance per lane and for the engine, read from the lanes' own counters each round, in two parts:
    the first draft's (over rounds that drafted) and a later draft's given the ones before it were accepted (over
    the later drafts rounds reached). Drafts are not alike: prompt lookup's first draft is a guess whether a copy
    goes on, its later ones mostly follow the copy, so one rate over every draft tested prices the first too high
    and the later ones too low, and a lane that missed a few first drafts was cut to one or two drafts where it
    should draft all or none. `prior`: what the engine's means start at and decay towards (the drafter's own
    held-out figure where it has one) for the first draft; a later draft's starts at the first's."""

    prior: float = PRIOR
    _engine: list = attrs.field(factory=lambda: [0.0, 0.0, 0.0, 0.0])  # first hits, tested; later hits, tested
    _lanes: dict = attrs.field(factory=dict)  # lane -> [first hits, tested, later hits, tested, offered, accepted]

    @property
    def tested(self) -> float:
        return self._engine[1] + self._engine[3]

    @property
    def hits(self) -> float:
        return self._engine[0] + self._engine[2]

    def update(self, lanes) -> None:
        seen = {}
        engine = [x * ENGINE_DECAY for x in self._engine]
        for lane in lanes:
            h1, t1, hl, tl, off0, acc0 = self._lanes.get(lane, (0.0, 0.0, 0.0, 0.0, (), ()))
            off, acc = tuple(lane.offered_at), tuple(lane.accepted_at)
            d = [_gain(off, off0, 0), _gain(acc, acc0, 0)]
            d += [
                sum(_gain(off, off0, j) for j in range(1, len(off))),
                sum(_gain(acc, acc0, j) for j in range(1, len(acc))),
            ]
            t = (h1 * LANE_DECAY + d[1], t1 * LANE_DECAY + d[0], hl * LANE_DECAY + d[3], tl * LANE_DECAY + d[2])
            seen[lane] = [*t, off, acc]
            engine = [engine[0] + d[1], engine[1] + d[0], engine[2] + d[3], engine[3] + d[2]]
        self._engine = engine
        self._lanes = seen  # lanes that left are forgotten

    def engine_rates(self) -> tuple[float, float]:
        """The engine's (first draft's, a later draft's) acceptance. The later one is pulled towards the first, not
        the prior: a plan that takes one draft a lane never tests a later one, and a held-out prior below what the
        lanes accept would keep it there."""
        h1, t1, hl, tl = self._engine
        first = (h1 + ENGINE_WEIGHT * self.prior) / (t1 + ENGINE_WEIGHT)
        return first, (hl + ENGINE_WEIGHT * first) / (tl + ENGINE_WEIGHT)

    def engine_rate(self) -> float:
        return self.engine_rates()[0]

    def rates(self, lane) -> tuple[float, float]:
        """The lane's (first draft's, a later draft's) acceptance, each pulled towards the engine's."""
        h1, t1, hl, tl = self._lanes.get(lane, (0.0,) * 4)[:4]
        e1, el = self.engine_rates()
        return (h1 + LANE_WEIGHT * e1) / (t1 + LANE_WEIGHT), (hl + LANE_WEIGHT * el) / (tl + LANE_WEIGHT)

    def rate(self, lane) -> float:
        """The lane's first draft's acceptance."""
        return self.rates(lane)[0]

    def chances(self, lane, cap: int) -> tuple[float, ...]:
        """The lane's per-draft chances for `plan_drafts`: each of its first `cap` drafts' given the ones before."""
        first, later = self.rates(lane)
        return (first,) + (later,) * (cap - 1) if cap > 0 else ()


def _gain(now: tuple, before: tuple, j: int) -> int:
    return (now[j] if j < len(now) else 0) - (before[j] if j < len(before) else 0)
