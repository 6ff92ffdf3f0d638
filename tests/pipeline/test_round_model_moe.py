"""The seed's case in the round model: a MoE target whose experts outgrow a 32 GB card. With a small fast tier
(5090-like: a third of the experts in fast memory, the rest over PCIe 3.0 x16) the copies dominate a round, a verify
round saves no copies a committed token, and MTP's head takes slots from the cache: MTP is not chosen, and at 1 and 4
lanes it is predicted below speculation off (the replay runs the live cache's policy). With every expert in fast
memory (PRO 6000-like), MTP at 3 draft tokens pays at 1 to 4 lanes and is chosen. The routing is synthetic but has
the locality of text: each token keeps part of the previous token's experts and draws the rest from a skewed
popularity (a uniform draw would have no locality)."""

import random

import pytest

from speclane.pipeline.runtime.derivation import OFF, Candidate, candidates, score
from speclane.pipeline.runtime.round_model import DrafterFigures, Machine, TargetFigures, choose, pass_parts
from speclane.pipeline.runtime.routing_model import RoutingTrace

LAYERS, EXPERTS, TOP_K = 48, 512, 10  # the shapes of an 80B-A3B hybrid's MoE layers
ONE = 3 * 2048 * 512  # one routed expert in FP8: gate, up and down of 2048 x 512
EVERY = LAYERS * EXPERTS
HEAD = 1_100_000_000  # MTP's head, taken from the expert cache on the small card
PCIE3, PCIE5 = 8e9 * 128 / 130 / 8 * 16, 32e9 * 128 / 130 / 8 * 16


def _routing(tokens: int = 160, seed: int = 0) -> RoutingTrace:
    rng = random.Random(seed)
    weights = [rng.paretovariate(1.2) for _ in range(EXPERTS)]
    out, prev = [], None
    for _ in range(tokens):
        token = []
        for layer in range(LAYERS):
            chosen = set(rng.sample(prev[layer], TOP_K - 3)) if prev is not None and rng.random() < 0.5 else set()
            while len(chosen) < TOP_K:
                chosen.add(rng.choices(range(EXPERTS), weights)[0])
            token.append(tuple(sorted(chosen)))
        out.append(tuple(token))
        prev = out[-1]
    return RoutingTrace(tuple(out), tuple(range(LAYERS)), EXPERTS)


@pytest.fixture(scope="module")
def target():
    return TargetFigures(dense_bytes=3_000_000_000, row_flops=6e9, expert_bytes=ONE, routing=_routing())


MTP = DrafterFigures("mtp", (0.75, 0.5, 0.3), "test", step_bytes=300_000_000, step_flops=6e8)


def _derive(machine, target, slots_off):
    def memory(c: Candidate):
        if slots_off is None:
            return True, None  # every expert in fast memory
        return True, slots_off - (HEAD // ONE if c.backend == "mtp" else 0)

    cands = [OFF] + [c for c in candidates(("mtp",)) if c.draft_tokens == 3 and c.row_budget in (0, 3)]
    scored = score(machine, target, {"none": None, "mtp": MTP}, cands, (1, 2, 4), memory)
    table = {s.candidate: {n: (r.tps, s.fits) for n, r in s.rounds.items()} for s in scored}
    return scored, choose(table, OFF)


def test_small_fast_tier_leaves_mtp_off(target):
    rtx5090 = Machine(bandwidth=1792e9, link=PCIE3, compute=419e12)
    slots = (32_000_000_000 - 5_000_000_000) // ONE  # what 32 GB leaves the experts after 5 GB of the rest
    assert 0.3 < slots / EVERY < 0.4
    scored, (choice, _) = _derive(rtx5090, target, slots)
    assert choice == OFF
    off = next(s for s in scored if s.candidate == OFF)
    mtp = next(s for s in scored if s.candidate == Candidate("mtp", 3, 0))
    for lanes in (1, 4):
        assert mtp.rounds[lanes].tps < off.rounds[lanes].tps
    # the copies dominate the round, and speculation saves no copies a committed token here (within 5 %)
    assert off.rounds[1].parts["copies"] > 0.5 * off.rounds[1].seconds
    wide = target.routing.round(1, 3, 2.55, slots)
    plain = target.routing.round(1, 0, 1.0, slots)
    assert wide.misses / 2.55 > 0.95 * plain.misses


def test_every_expert_resident_turns_mtp_on(target):
    pro6000 = Machine(bandwidth=1792e9, link=PCIE5, compute=500e12)
    scored, (choice, value) = _derive(pro6000, target, None)
    assert choice == Candidate("mtp", 3, 0) and value > 1.1
    off = next(s for s in scored if s.candidate == OFF)
    mtp = next(s for s in scored if s.candidate == choice)
    assert all(mtp.rounds[n].tps > off.rounds[n].tps for n in (1, 2, 4))
    assert mtp.rounds[1].drafts >= 2 and mtp.rounds[4].drafts == 1  # 8 rows at 4 lanes: one draft a lane


def test_a_drafter_that_drafts_in_a_share_of_rounds_reads_and_copies_less(target):
    r = target.routing
    full, none = r.round(1, 7, 2.0, EVERY // 10), r.round(1, 0, 2.0, EVERY // 10)
    assert r.round(1, 7, 2.0, EVERY // 10, share=1.0) == full  # drafting every round: as before
    assert r.round(1, 7, 2.0, EVERY // 10, share=0.0).distinct == pytest.approx(none.distinct)
    half = r.round(1, 7, 2.0, EVERY // 10, share=0.5)
    assert none.distinct < half.distinct < full.distinct and half.misses < full.misses
    # the round model hands the replay and the pass the drafts a lane verifies on average
    ngram = DrafterFigures("ngram", (0.4, 0.3), "test", offered=(0.5, 0.5))
    assert ngram.drafted(7) == pytest.approx(3.5) and ngram.drafted(0) == 0.0 and MTP.drafted(3) == 3.0
    m = Machine(bandwidth=1e12, link=PCIE5, compute=1e12)
    sparse, dense = pass_parts(m, target, 1, 7, 2.0, EVERY // 10, 3.5), pass_parts(m, target, 1, 7, 2.0, EVERY // 10)
    assert sparse["copies"] < dense["copies"] and sparse["pass"] < dense["pass"]
