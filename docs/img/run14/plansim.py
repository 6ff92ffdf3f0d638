"""Decision quality of the measured draft plan, free of timing noise: greedy tokens are deterministic, so each
variant's rounds are costed with fixed tables (the cached pass probe, a fixed drafter-cost table measured once
here), and the simulated decode time is compared with speculation off's rounds costed the same way."""
import sys, time, statistics, json, torch
from speclane.stages.models.loading import load_model
from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch
import speclane.stages.draft_plan as DP
import speclane.stages.anchor_gather as AG
from speclane.stages.contract.costs import RoundCosts
backend = sys.argv[1]
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
eng0 = make_engine(target, tok, "none", spec="decode")
ps = [eng0.apply_chat([{"role": "user", "content": p["user"]}]) for w in ("code_edit", "code_gen", "prose") for p in workloads.pick(workloads.load(), w, 2)]
max_len = max(map(len, ps)) + 64
# a fixed drafter-cost table: median proposal seconds at width 7 by lanes, measured once
fixed = make_engine(target, tok, backend, k=7, lanes=8, max_len=max_len, plan="fixed")
impl = fixed.resources.drafter
times = {}
prop = impl.propose
def timed(lanes, anchors, limits, state):
    t = time.perf_counter(); out = prop(lanes, anchors, limits, state)
    times.setdefault(sum(1 for l in limits if l), []).append(time.perf_counter() - t); return out
impl.propose = timed
for n in (1, 2, 4, 8):
    run_batch(fixed, [(f"p{j}", ps[j % len(ps)]) for j in range(n)], 24)
table = {n: statistics.median(v) for n, v in sorted(times.items()) if len(v) >= 3}
table = {1: 0.0056, 2: 0.0112, 4: 0.0182, 8: 0.032}   # fixed: the quieter measurements of this script
print("drafter seconds by lanes drafting (width 7):", {n: round(s * 1e3, 2) for n, s in table.items()})
def draft_model(width, lanes=1):
    if width <= 0: return 0.0
    ks = sorted(table)
    lo = max([k for k in ks if k <= lanes], default=ks[0]); hi = min([k for k in ks if k >= lanes], default=ks[-1])
    if lo == hi: return table[lo] * (lanes / lo if lanes > lo else 1)
    return table[lo] + (table[hi] - table[lo]) * (lanes - lo) / (hi - lo)
RoundCosts.draft_s = lambda self, width, lanes=1: draft_model(width, lanes)
def simulate(eng, n, batches, costs):
    rec = []
    fwd = target.forward
    def f(batch, *a, **k):
        rec.append(("pass", int(batch.cu_rows[-1]))); return fwd(batch, *a, **k)
    target.forward = f
    d = eng.resources.drafter
    if d is not None:
        p0 = d.propose
        def p(lanes, anchors, limits, state):
            rec.append(("draft", max(limits, default=0), sum(1 for l in limits if l))); return p0(lanes, anchors, limits, state)
        d.propose = p
    total, wall, rounds, drafting = 0.0, 0.0, 0, 0
    for b in batches:
        rec.clear()
        runs = run_batch(eng, b, 48)
        wall += max(r.lane.t_done for r in runs) - min(r.lane.t_first for r in runs)
        rounds += sum(1 for r in rec if r[0] == "pass" and r[1] <= 8 * n)
        drafting += sum(1 for r in rec if r[0] == "draft" and r[1] > 0)
        for r in rec:
            if r[0] == "pass" and r[1] <= 8 * n: total += costs.target_s(r[1])
            elif r[0] == "draft" and d.proposes: total += draft_model(r[1], r[2])
    target.forward = fwd
    if d is not None: d.propose = p0
    print(f"    {type(d).__name__ if d else 'off'}: rounds {rounds} drafting {drafting} sim {total:.3f} s wall {wall:.3f} s", flush=True)
    return total
variants = {"other1": {"OTHER_VALUE": 1.0}, "other0.5": {"OTHER_VALUE": 0.5}, "other0.25": {"OTHER_VALUE": 0.25},
            "other0": {"OTHER_VALUE": 0.0}, "other0.25+m1.15": {"OTHER_VALUE": 0.25, "MARGIN": 1.15}}
base = {k: getattr(DP, k) for k in ("LANE_WEIGHT", "MARGIN", "LANE_DECAY", "OTHER_VALUE")}
for n in [int(x) for x in sys.argv[2:]]:
    batches = [[(f"p{j}", ps[(j + s) % len(ps)]) for j in range(n)] for s in (0, 2, 4)]
    probe = make_engine(target, tok, backend, k=7, lanes=n, max_len=max_len, plan="measured")
    run_batch(probe, batches[0], 8)
    costs = probe.resources.round_costs
    off = make_engine(target, tok, "none", spec="decode", lanes=n, max_len=max_len)
    t_off = simulate(off, n, batches, costs)
    row = []
    for name, v in variants.items():
        for k, x in base.items(): setattr(DP, k, x)
        for k, x in v.items(): setattr(DP, k, x)
        eng = make_engine(target, tok, backend, k=7, lanes=n, max_len=max_len, plan="measured")
        run_batch(eng, batches[0][:1], 4)
        t_on = simulate(eng, n, batches, costs)
        row.append(f"{name} {t_off / t_on:.3f}")
    print(f"{backend} {n} lanes: simulated on/off: " + ", ".join(row), flush=True)
