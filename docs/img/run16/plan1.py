"""One lane, dflash2, the defaults section's six prompts twice: each planning round (every eighth, and each that drafts
nothing, with the draft-time samples the plan had). usage: python plan1.py"""
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
R = [0, None]
def logged(caps, rates, costs, *a, **k):
    out = plan0(caps, rates, costs, *a, **k); R[0] += 1
    d = {key: [round(x * 1e3, 1) for x in v] for key, v in costs._draft.items()}
    if R[0] % 8 == 1 or not any(out): print("   round", R[0], caps, [round(r, 2) for r in rates], "->", out, "draft_s(7)", round(costs.draft_s(7) * 1e3, 1), d if not any(out) else "")
    return out
AG.plan_drafts = logged
eng = make_engine(target, tok, "dflash2", k=7, lanes=1, max_len=max_len, plan="measured")
run_batch(eng, [("w", ps[0])], 4)
for rep in range(2):
    for b in range(len(ps)):
        R[0] = 0
        print("batch", rep, b); run_batch(eng, [("p", ps[b])], 48)
