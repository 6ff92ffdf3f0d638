"""When the measured plan drafts in the defaults section's dflash2 batches: each drafting round with its caps,
the lanes' predicted acceptance, each lane's backlog charge (ms a round) and the drafts taken (docs/img/run16's
planlog.py with the charges printed). usage: python planlog_charges.py LANES"""
import sys, torch
import speclane.stages.anchor_gather as AG
from speclane.stages.models.loading import load_model
from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
eng0 = make_engine(target, tok, "none", spec="decode")
picked = {w: workloads.pick(workloads.load(), w, 2) for w in ("code_edit", "code_gen", "prose")}
mixed = [p for group in zip(*picked.values()) for p in group]
ps = [eng0.apply_chat([{"role": "user", "content": p["user"]}]) for p in mixed]
max_len = max(map(len, ps)) + 64
plan0 = AG.plan_drafts
R = [0]
def logged(caps, rates, costs, *a, **k):
    out = plan0(caps, rates, costs, *a, **k); R[0] += 1; ch = a[2] if len(a) > 2 else k.get("catch_up")
    if any(out): print("   round", R[0], "caps", caps, "rates", [round(r, 2) for r in rates], "charge ms", [round(c * 1e3, 2) for c in (ch or ())], "->", out)
    return out
AG.plan_drafts = logged
n = int(sys.argv[1])
eng = make_engine(target, tok, "dflash2", k=7, lanes=n, max_len=max_len, plan="measured")
print("warm-up"); run_batch(eng, [("w", ps[0])], 4)
for rep in range(4):
    for b in range(0, len(ps), n):
        R[0] = 0
        print("batch", rep, b); runs = run_batch(eng, [(f"p{j}", ps[j % len(ps)]) for j in range(b, b + n)], 48)
        print("   rounds", R[0], "accepted", sum(sum(r.lane.accepted_at) if hasattr(r.lane, 'accepted_at') else 0 for r in runs))
