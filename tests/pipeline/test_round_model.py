"""The round model's arithmetic against hand-computed cases, the routing replay against hand-counted misses, and the
choice's rules (fits, the 0.97 floor, the geometric mean, ties to the first)."""

import inspect
import random

import attrs
import pytest

from speclane.pipeline.runtime.round_model import (
    DrafterFigures,
    Machine,
    TargetFigures,
    best_rate,
    choose,
    drafter_seconds,
    pass_parts,
    rate,
    tau,
)
from speclane.pipeline.runtime.routing_model import WARM_SHARE, RoutingTrace
from speclane.stages.models.expert_cache import ExpertCache
from speclane.stages.models.expert_policies import DEFAULT_POLICY, POLICIES
from speclane.stages.models.expert_study import replay_counts


def test_tau_adds_the_chances_and_extends_the_last_ratio():
    assert tau((0.6, 0.3), 0) == 1.0
    assert tau((0.6, 0.3), 1) == pytest.approx(1.6)
    assert tau((0.6, 0.3), 2) == pytest.approx(1.9)
    assert tau((0.6, 0.3), 3) == pytest.approx(1.9 + 0.15)  # 0.3 x (0.3 / 0.6)
    assert tau((), 2) == pytest.approx(1.75)  # no measurement: 1/2 a draft given the ones before


def test_a_dense_pass_from_figures():
    m = Machine(bandwidth=1e12, compute=1e15)
    t = TargetFigures(dense_bytes=2_000_000_000, row_flops=1e10)
    parts = pass_parts(m, t, lanes=2, drafts=3, step=1.0, slots=None)
    # 2 GB over 1 TB/s is 2 ms; 8 rows x 10 GFLOP over 1 PFLOP/s is 0.08 ms; no experts
    assert parts == pytest.approx({"pass": 2e-3 + 8e-5, "experts": 0.0, "copies": 0.0})


def test_a_probed_pass_reads_the_table():
    m = Machine(bandwidth=1e10, probe=((1, 2, 4, 8), (0.010, 0.011, 0.012, 0.016)))
    t = TargetFigures(dense_bytes=10**8, row_flops=1e9)
    assert pass_parts(m, t, 1, 5, 1.0, None)["pass"] == pytest.approx(0.014)  # 6 rows: halfway from 4 to 8


def test_drafter_time_chain_and_block():
    m = Machine(bandwidth=1e11, compute=1e13)
    chain = DrafterFigures("mtp", (0.5,), "test", step_bytes=10**8, step_flops=1e8, chain=True)
    block = DrafterFigures("dflash2", (0.5,), "test", step_bytes=10**8, step_flops=1e8, chain=False, block_rows=8)
    # chain: 3 steps of (1 ms of reads + 2 lanes x 0.01 ms of compute)
    assert drafter_seconds(m, chain, lanes=2, drafts=3) == pytest.approx(3 * (1e-3 + 2e-5))
    # block: one step of 1 ms + 2 lanes x 8 rows x 0.01 ms
    assert drafter_seconds(m, block, lanes=2, drafts=3) == pytest.approx(1e-3 + 16e-5)
    assert drafter_seconds(m, chain, lanes=2, drafts=0) == 0.0


def test_probed_proposals_are_interpolated():
    m = Machine(bandwidth=1e11)
    d = DrafterFigures(
        "mtp", (0.5,), "test", step_bytes=10**8, probed=((1, 1, 1.0), (1, 7, 4.0), (4, 1, 2.0), (4, 7, 8.0))
    )
    assert drafter_seconds(m, d, lanes=1, drafts=3) == pytest.approx(2.0)  # a third of the way from 1 to 7 drafts
    assert drafter_seconds(m, d, lanes=2, drafts=1) == pytest.approx(1.0 + 1.0 / 3)  # lanes 1 to 4: a third
    assert drafter_seconds(m, d, lanes=8, drafts=7) == pytest.approx(16.0)  # past 4 lanes: in proportion
    assert drafter_seconds(m, d, lanes=1, drafts=0) == 0.0


def test_rate_is_tokens_over_the_sum_of_the_parts():
    m = Machine(bandwidth=1e12)
    t = TargetFigures(dense_bytes=10**9, row_flops=0.0)
    d = DrafterFigures("mtp", (0.5, 0.25), "test", step_bytes=10**8)
    r = rate(m, t, d, lanes=2, drafts=2, slots=None)
    assert r.tokens == pytest.approx(2 * 1.75)
    assert r.seconds == pytest.approx(1e-3 + 2 * 1e-4)  # the pass, then two chain steps
    assert r.tps == pytest.approx(3.5 / 1.2e-3)


def test_the_plan_drafts_only_past_the_margin():
    m = Machine(bandwidth=1e12)
    t = TargetFigures(dense_bytes=10**9, row_flops=0.0)
    # a draft adds 0.04 tokens and 0.1 ms: 1.04 / 1.1 ms < 1.05 x 1 / 1 ms, so no drafts
    weak = DrafterFigures("mtp", (0.04,), "test", step_bytes=10**8)
    assert best_rate(m, t, weak, lanes=1, cap=1, slots=None).drafts == 0
    strong = DrafterFigures("mtp", (0.8, 0.6, 0.1), "test", step_bytes=10**8)
    assert best_rate(m, t, strong, lanes=1, cap=3, slots=None).drafts == 2  # the third adds less than it costs
    assert best_rate(m, t, None, lanes=1, cap=3, slots=None).drafts == 0


def test_choose_keeps_the_floor_and_takes_the_geometric_mean():
    scores = {
        "off": {1: (100.0, True), 4: (300.0, True)},
        "fast_then_slow": {1: (300.0, True), 4: (288.0, True)},  # 0.96x off at 4 lanes: below the floor
        "steady": {1: (150.0, True), 4: (330.0, True)},  # sqrt(1.5 x 1.1) = 1.285
        "same": {1: (150.0, True), 4: (330.0, True)},  # ties go to the first
        "too_big": {1: (900.0, False), 4: (900.0, True)},
    }
    key, score = choose(scores, "off")
    assert key == "steady" and score == pytest.approx((1.5 * 1.1) ** 0.5)
    assert choose({"off": scores["off"], "x": scores["fast_then_slow"]}, "off") == ("off", 1.0)


def _cycle_trace(tokens: int) -> RoutingTrace:
    # 2 MoE layers of 4 experts; token t chooses expert t % 4 in layer 0 and (t + 1) % 4 in layer 1
    return RoutingTrace(tuple(((t % 4,), ((t + 1) % 4,)) for t in range(tokens)), (0, 1), experts=4, policy="lru")


def test_routing_replay_counts_distinct_experts_and_misses():
    trace = _cycle_trace(64)
    one = trace.round(lanes=1, drafts=0, tokens_per_round=1.0, slots=8)
    assert (one.distinct, one.misses) == (1.0, 0.0)  # every expert resident: no copies
    wide = trace.round(lanes=1, drafts=2, tokens_per_round=1.0, slots=8)
    assert wide.distinct == 3.0  # three consecutive tokens, three different experts a layer
    # 2 slots under LRU for a cycle of 4 keys a layer: every lookup misses, one a layer a token
    assert trace.round(lanes=1, drafts=0, tokens_per_round=1.0, slots=2).misses == 2.0
    # no slot at all: every distinct expert is copied
    assert trace.round(lanes=1, drafts=2, tokens_per_round=3.0, slots=0).misses == 6.0


def test_routing_from_lookups_splits_tokens_at_the_first_layer():
    lookups = [(3, [5, 1]), (7, [2, 0]), (3, [1, 4]), (7, [0, 3]), (3, [9, 9])]
    trace = RoutingTrace.from_lookups(lookups, experts=10)
    assert trace.layers == (3, 7) and trace.tokens == (((1, 5), (0, 2)), ((1, 4), (0, 3)))
    assert trace.top_k == 2.0


def _text_like_lookups(tokens: int, layers: int, experts: int, seed: int = 0) -> list:
    # each token keeps part of the previous token's experts and draws the rest from a skewed popularity, so the
    # policies differ (uniform draws would make every policy alike)
    rng = random.Random(seed)
    weights = [rng.paretovariate(1.2) for _ in range(experts)]
    out, prev = [], None
    for _ in range(tokens):
        token = []
        for layer in range(layers):
            chosen = set(rng.sample(prev[layer], 2)) if prev is not None and rng.random() < 0.6 else set()
            while len(chosen) < 4:
                chosen.add(rng.choices(range(experts), weights)[0])
            token.append(sorted(chosen))
        out += [(layer * 3, token[layer]) for layer in range(layers)]  # MoE layers 0, 3, 6, ...: not 0..n-1
        prev = token
    return out


def test_the_plan_replays_the_policy_the_live_cache_runs():
    # the replay's policy is the live cache's default, so a change of DEFAULT_POLICY (or of ExpertCache's default)
    # that the replay does not follow fails here
    lookups = _text_like_lookups(200, 5, 24)
    trace = RoutingTrace.from_lookups(lookups, experts=24)
    live_default = inspect.signature(ExpertCache).parameters["policy"].default
    assert trace.policy == DEFAULT_POLICY == live_default
    n, layers = len(trace.tokens), trace.moe_layers
    start = int(n * WARM_SHARE) * layers  # one lane, no drafts: a round is a token, the first quarter warms
    for slots in (6, 30, 70):
        direct = replay_counts(lookups, slots, POLICIES[live_default](), start)
        predicted = trace.round(lanes=1, drafts=0, tokens_per_round=1.0, slots=slots).misses
        assert predicted * (n - n // 4) == pytest.approx(direct["misses"])
        # the trace tells the policies apart at this size: a replay under another one would not match
        others = {name: replay_counts(lookups, slots, cls(), start)["misses"] for name, cls in POLICIES.items()}
        assert any(m != direct["misses"] for name, m in others.items() if name != live_default)


def test_measured_rounds_are_what_a_measured_setting_predicts():
    m = Machine(
        bandwidth=1e10, probe=((1, 2, 4, 8), (0.010, 0.011, 0.012, 0.016)), rounds=((1, 0, 0.012), (4, 0, 0.02))
    )
    t = TargetFigures(dense_bytes=10**8, row_flops=1e9)
    d = DrafterFigures("ngram", (0.6, 0.3), "test", rounds=((1, 1, 0.013), (1, 7, 0.025), (4, 1, 0.03), (4, 7, 0.06)))
    assert rate(m, t, None, 1, 0, None).seconds == pytest.approx(0.012)  # off: the measured round, pass + rest
    assert rate(m, t, None, 4, 0, None).parts["rest"] == pytest.approx(0.02 - 0.012)  # beyond the 4-row pass
    assert rate(m, t, d, 1, 1, None).seconds == pytest.approx(0.013)
    assert rate(m, t, d, 4, 7, None).seconds == pytest.approx(0.06)
    # between measured drafts the rest is linear: at 1 lane, 1 draft leaves 0.002 over a 2-row pass, 7 drafts 0.009
    # over an 8-row one, so 4 drafts (a 5-row pass of 0.013) leave 0.0055
    assert rate(m, t, d, 1, 4, None).parts["rest"] == pytest.approx(0.0055)
    assert rate(m, t, d, 1, 4, None).seconds == pytest.approx(0.013 + 0.0055)
    # between measured lane counts, linear; past the most, in proportion
    assert rate(m, t, None, 2, 0, None).parts["rest"] == pytest.approx(0.002 + (0.008 - 0.002) / 3)
    assert rate(m, t, None, 8, 0, None).parts["rest"] == pytest.approx(0.008 * 2)
    # a drafter whose rounds were not measured is charged off's rest at least; nothing measured: no rest
    plain = DrafterFigures("ngram", (0.6, 0.3), "test")
    assert rate(m, t, plain, 1, 2, None).parts["rest"] == pytest.approx(0.002)
    assert "rest" not in rate(attrs.evolve(m, rounds=()), t, plain, 1, 2, None).parts


def test_measured_rounds_with_an_expert_cache_count_only_the_copies_beyond_the_probes():
    trace = RoutingTrace(tuple(((i % 4, (i + 1) % 4),) for i in range(64)), (0,), 4)
    t = TargetFigures(dense_bytes=10**8, row_flops=1e9, expert_bytes=10**6, routing=trace)
    m = Machine(bandwidth=1e10, link=1e9, probe=((1, 8), (0.010, 0.016)), rounds=((1, 0, 0.02),), probe_slots=2)
    probed = rate(m, t, None, 1, 0, 2)
    assert probed.seconds == pytest.approx(0.02)  # the probe's own slots: the measured round, copies and all
    resident = rate(m, t, None, 1, 0, None)
    assert resident.parts["copies"] == 0.0
    assert resident.seconds == pytest.approx(0.02 - probed.parts["copies"])
