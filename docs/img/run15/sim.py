"""Decision quality of the draft plan at fixed costs (after docs/img/run14/plansim.py): greedy tokens are
deterministic, so each variant's rounds are costed with the cached pass probe and a fixed drafter table and
compared with speculation off's rounds costed the same way. Also logs predicted vs realised accepted drafts.
usage: python sim.py BACKEND VARIANTS LANES...   (VARIANTS: comma list of names in VARIANTS below)"""
import collections, sys, time, json, torch
from speclane.stages.models.loading import load_model
from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch
import speclane.stages.draft_plan as DP
import speclane.stages.anchor_gather as AG
from speclane.stages.contract.costs import RoundCosts
backend, names = sys.argv[1], sys.argv[2].split(",")
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
eng0 = make_engine(target, tok, "none", spec="decode")
ws = ("code_edit", "code_gen", "prose")
picked = {w: workloads.pick(workloads.load(), w, 2) for w in ws}
mixed = [p for group in zip(*picked.values()) for p in group]
ps = [eng0.apply_chat([{"role": "user", "content": p["user"]}]) for p in mixed]
max_len = max(map(len, ps)) + 64
table = {1: 0.0056, 2: 0.0112, 4: 0.0182, 8: 0.032}   # run14's fixed table (width 7)
def draft_model(width, lanes=1):
    if width <= 0: return 0.0
    ks = sorted(table)
    lo = max([k for k in ks if k <= lanes], default=ks[0]); hi = min([k for k in ks if k >= lanes], default=ks[-1])
    if lo == hi: return table[lo] * (lanes / lo if lanes > lo else 1)
    return table[lo] + (table[hi] - table[lo]) * (lanes - lo) / (hi - lo)
RoundCosts.draft_s = lambda self, width, lanes=1: draft_model(width, lanes)
LOG = []
import os
DEBUG = os.environ.get('DEBUG')
plan0 = AG.plan_drafts
def plan_logged(caps, rates, costs, *a, **k):
    out = plan0(caps, rates, costs, *a, **k)
    LOG.append((rates, out))
    if any(out) and len(caps) > 1 and DEBUG: print("      plan", caps, [round(r, 2) for r in rates], out, a[0] if a else None)
    return out
AG.plan_drafts = plan_logged
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
    total, rounds, drafting, pred, real = 0.0, 0, 0, 0.0, 0
    ALL = []
    for b in batches:
        ALL.extend(rec); rec.clear()
        LOG.clear()
        runs = run_batch(eng, b, 48)
        rounds += sum(1 for r in rec if r[0] == "pass" and r[1] <= 8 * n)
        drafting += sum(1 for r in rec if r[0] == "draft" and r[1] > 0)
        for r in rec:
            if r[0] == "pass" and r[1] <= 8 * n: total += costs.target_s(r[1])
            elif r[0] == "draft" and d.proposes: total += draft_model(r[1], r[2])
        for rates, out in LOG:
            pred += sum(sum(a ** j for j in range(1, dd + 1)) for a, dd in zip(rates, out))
        real += sum(r.lane.accepted for r in runs)
    target.forward = fwd
    if d is not None: d.propose = p0
    if DEBUG: print("      rows hist", sorted(collections.Counter(r[1] for r in ALL if r[0] == "pass").items()))
    print(f"    {type(d).__name__ if d else 'off'}: rounds {rounds} drafting {drafting} sim {total:.3f} s "
          f"predicted accepted {pred:.1f} realised {real}", flush=True)
    return total
from variants import VARIANTS
base = {k: getattr(DP, k) for k in dir(DP) if k.isupper()}
for n in [int(x) for x in sys.argv[3:]]:
    batches = [[(f"p{j}", ps[(j + s) % len(ps)]) for j in range(n)] for s in (0, 2, 4)]
    probe = make_engine(target, tok, backend, k=7, lanes=n, max_len=max_len, plan="measured")
    run_batch(probe, batches[0], 8)
    costs = probe.resources.round_costs
    off = make_engine(target, tok, "none", spec="decode", lanes=n, max_len=max_len)
    t_off = simulate(off, n, batches, costs)
    row = []
    for name in names:
        for k, x in base.items(): setattr(DP, k, x)
        VARIANTS[name](DP)
        eng = make_engine(target, tok, backend, k=7, lanes=n, max_len=max_len, plan="measured")
        run_batch(eng, batches[0][:1], 4)
        t_on = simulate(eng, n, batches, costs)
        row.append(f"{name} {t_off / t_on:.3f}")
    print(f"{backend} {n} lanes: simulated on/off: " + ", ".join(row), flush=True)
