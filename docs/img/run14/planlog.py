"""4-lane dflash2 batches (the defaults' prompts): what the plan predicted each round against what ran."""
import sys, time, statistics, collections, torch
from speclane.stages.models.loading import load_model
from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch
from speclane.pipeline.runtime import heap
import speclane.stages.anchor_gather as AG
from speclane.stages.draft_plan import plan_drafts as real_plan
n = int(sys.argv[1]); backend = sys.argv[2] if len(sys.argv) > 2 else "dflash2"
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
eng0 = make_engine(target, tok, "none", spec="decode")
ps = [eng0.apply_chat([{"role": "user", "content": p["user"]}]) for w in ("code_edit", "code_gen", "prose") for p in workloads.pick(workloads.load(), w, 2)]
heap.freeze()
max_len = max(map(len, ps)) + 64
eng = make_engine(target, tok, backend, k=7, lanes=n, max_len=max_len, plan="measured")
off = make_engine(target, tok, "none", spec="decode", lanes=n, max_len=max_len)
log = []
def plan(caps, rates, costs):
    out = real_plan(caps, rates, costs)
    m = sum(out); width = max(out, default=0); drafting = sum(1 for d in out if d)
    tokens = sum(sum(r ** j for j in range(d + 1)) for d, r in zip(out, rates))
    pred_t = costs.target_s(len(caps) + m); pred_d = costs.draft_s(width, drafting)
    log.append({"lanes": len(caps), "plan": out, "rates": [round(r, 2) for r in rates], "pred_tokens": tokens,
                "pred_pass": pred_t, "pred_draft": pred_d, "off_pass": costs.target_s(len(caps))})
    return out
AG.plan_drafts = plan
pending_round = []
real_measured = AG.AnchorGather._measured
def measured(self, max_lanes, view, caps):
    if pending_round:
        lanes_, plan_, acc0 = pending_round.pop()
        got = [sum(l.accepted_at) - a for l, a in zip(lanes_, acc0)]
        log_acc.append((plan_, got))
    out = real_measured(self, max_lanes, view, caps)
    if sum(out):
        pending_round.append((list(view), out, [sum(l.accepted_at) for l in view]))
    return out
AG.AnchorGather._measured = measured
log_acc = []
passes = []
fwd = target.forward
def timed_forward(batch, *a, **k):
    t = time.perf_counter(); out = fwd(batch, *a, **k); passes.append((int(batch.cu_rows[-1]), time.perf_counter() - t)); return out
target.forward = timed_forward
impl = eng.resources.drafter
prop = impl.propose
drafts = []
def timed_prop(*a, **k):
    t = time.perf_counter(); out = prop(*a, **k); drafts.append(time.perf_counter() - t); return out
impl.propose = timed_prop
batch = [(f"p{j}", ps[j % len(ps)]) for j in range(n)]
run_batch(eng, batch[:1], 4); run_batch(off, batch[:1], 4)
res = {"on": [], "off": []}
for rep in range(3):
    for name, e in (("on", eng), ("off", off)):
        log.clear(); passes.clear(); drafts.clear()
        before = dict(e.times.seconds)
        runs = run_batch(e, batch, 48, timed=True)
        stage_s = {k: v - before.get(k, 0) for k, v in e.times.seconds.items()}
        if rep == 2: print(name, {k: round(v * 1e3, 1) for k, v in sorted(stage_s.items(), key=lambda kv: -kv[1])})
        first = min(r.lane.t_first for r in runs); last = max(r.lane.t_done for r in runs)
        res[name].append(sum(max(0, len(r.tokens) - r.first_tokens) for r in runs) / (last - first))
        if name == "on":
            on_log, on_passes, on_drafts = list(log), list(passes), list(drafts)
        else:
            off_passes = list(passes)
print({k: [round(x, 1) for x in v] for k, v in res.items()}, "ratio", round(statistics.median([a / b for a, b in zip(res["on"], res["off"])]), 3))
# pass time by rows: actual (on and off engines) vs the probe
costs = eng.resources.round_costs
print("rows: on-engine / off-engine pass median ms vs probe ms")
bon, boff = collections.defaultdict(list), collections.defaultdict(list)
for r, s in on_passes: bon[r].append(s)
for r, s in off_passes: boff[r].append(s)
for r in sorted(set(bon) | set(boff)):
    if r <= 64:
        a = f"{statistics.median(bon[r]) * 1e3:6.2f} (n={len(bon[r])})" if bon[r] else "   -   "
        b = f"{statistics.median(boff[r]) * 1e3:6.2f} (n={len(boff[r])})" if boff[r] else "   -   "
        print(f"  {r:3d}: {a} / {b}  probe {costs.target_s(r) * 1e3:6.2f}")
print("on total pass s %.3f, off total pass s %.3f; on draft s %.3f" % (sum(s for _, s in on_passes), sum(s for _, s in off_passes), sum(on_drafts)))
drafting = [l for l in on_log if sum(l["plan"])]
print(f"rounds {len(on_log)}, drafting {len(drafting)}; proposals timed {len(on_drafts)} median {statistics.median(on_drafts) * 1e3 if on_drafts else 0:.2f} ms")
print("drafting rounds: plan -> accepted per lane (all reps)")
for p, g in log_acc[:60]:
    print("  ", p, "->", g)
tot_d = sum(sum(p) for p, _ in log_acc); tot_a = sum(sum(g) for _, g in log_acc)
print("drafted", tot_d, "accepted", tot_a, "rate", round(tot_a / max(tot_d, 1), 3), "rounds", len(log_acc))
for l in drafting[:0]:
    print(l["lanes"], l["plan"], l["rates"], f"pred tokens {l['pred_tokens']:.2f} pass {l['pred_pass']*1e3:.1f} draft {l['pred_draft']*1e3:.1f} off pass {l['off_pass']*1e3:.1f}")
