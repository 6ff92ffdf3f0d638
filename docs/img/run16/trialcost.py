"""What the measured plan's drafting rounds cost in the defaults section's dflash2 batches: per batch the target's
passes, and for each drafting round its catch-up (the lanes' window backlog), projection, prompt lookup, proposal
and the pass after it (rows, ms). usage: python trialcost.py LANES"""
import sys, time, torch
import speclane.stages.anchor_gather as AG
from speclane.stages.models.loading import load_model
from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.drafters.dflash2 import DFlash2
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
eng0 = make_engine(target, tok, "none", spec="decode")
picked = {w: workloads.pick(workloads.load(), w, 2) for w in ("code_edit", "code_gen", "prose")}
mixed = [p for group in zip(*picked.values()) for p in group]
ps = [eng0.apply_chat([{"role": "user", "content": p["user"]}]) for p in mixed]
max_len = max(map(len, ps)) + 64
log = []
def wrap(cls, name):
    f = getattr(cls, name)
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: log.append((name, (time.perf_counter() - t) * 1e3))
    setattr(cls, name, g)
wrap(ModelBackend, "catch_up"); wrap(DFlash2, "draft"); wrap(DFlash2, "candidates"); wrap(DFlash2, "project")
fwd = target.forward
def f(batch, *a, **k):
    t = time.perf_counter()
    try: return fwd(batch, *a, **k)
    finally: log.append(("pass%d" % int(batch.cu_rows[-1]), (time.perf_counter() - t) * 1e3))
target.forward = f
n = int(sys.argv[1])
eng = make_engine(target, tok, "dflash2", k=7, lanes=n, max_len=max_len, plan="measured")
run_batch(eng, [("w", ps[0])], 4)
for rep in range(2):
    for b in range(0, len(ps), n):
        log.clear()
        run_batch(eng, [(f"p{j}", ps[j % len(ps)]) for j in range(b, b + n)], 48)
        # print events around drafts
        out = []
        for i, (name, ms) in enumerate(log):
            if name in ("catch_up", "draft", "candidates", "project"):
                out.append(f"{name} {ms:.1f}")
                nxt = next((l for l in log[i+1:] if l[0].startswith("pass")), None)
                if name == "draft" and nxt: out.append(f"-> {nxt[0]} {nxt[1]:.1f}")
        passes = [ms for name, ms in log if name.startswith("pass")]
        print(f"batch {rep}/{b}: {len(passes)} passes {sum(passes):.0f} ms; " + "; ".join(out))
