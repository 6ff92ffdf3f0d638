"""Where a no-draft dflash2 batch spends its drafter time: seconds inside observe / flush / snapshot / restore /
the plan, per batch, against the batch's decode span. usage: python upkeep.py LANES..."""
import sys, time, torch, collections, statistics
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
T = collections.defaultdict(float)
depth = [0]
def timed(cls, name, key):
    f = getattr(cls, name)
    def g(*a, **k):
        depth[0] += 1
        t = time.perf_counter()
        try: return f(*a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0: T[key] += time.perf_counter() - t
    setattr(cls, name, g)
for n in ("observe", "snapshot", "restore", "catch_up"): timed(ModelBackend, n, n)
timed(DFlash2, "flush", "flush")
timed(AG.AnchorGather, "_measured", "plan")
plan0 = AG.plan_drafts
AG.plan_drafts = lambda caps, *a, **k: (0,) * len(caps)
for n in [int(x) for x in sys.argv[1:]]:
    batch = [(f"p{j}", ps[j % len(ps)]) for j in range(n)]
    eng = make_engine(target, tok, "dflash2", k=7, lanes=n, max_len=max_len, plan="measured")
    run_batch(eng, batch[:1], 4)
    for rep in range(3):
        T.clear()
        t0 = time.perf_counter()
        runs = run_batch(eng, batch, 48)
        wall = time.perf_counter() - t0
        dec = max(r.lane.t_done for r in runs) - min(r.lane.t_first for r in runs)
        print(f"{n} lanes: batch {wall*1e3:.0f} ms, decode span {dec*1e3:.0f} ms; " +
              ", ".join(f"{k} {v*1e3:.1f}" for k, v in sorted(T.items())), flush=True)
