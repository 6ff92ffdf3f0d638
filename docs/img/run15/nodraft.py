"""dflash2 at N lanes: off, as shipped, and with the plan forced to draft nothing (the drafter's upkeep alone),
alternated in one process. usage: python nodraft.py REPEATS LANES..."""
import sys, torch, statistics
import speclane.stages.anchor_gather as AG
from speclane.stages.models.loading import load_model
from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch, alternate
from speclane.bench.sweeps import aggregate
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
eng0 = make_engine(target, tok, "none", spec="decode")
picked = {w: workloads.pick(workloads.load(), w, 2) for w in ("code_edit", "code_gen", "prose")}
mixed = [p for group in zip(*picked.values()) for p in group]
ps = [eng0.apply_chat([{"role": "user", "content": p["user"]}]) for p in mixed]
max_len = max(map(len, ps)) + 64
FORCE = [False]
plan0 = AG.plan_drafts
AG.plan_drafts = lambda caps, rates, costs, *a, **k: (0,) * len(caps) if FORCE[0] else plan0(caps, rates, costs, *a, **k)
reps = int(sys.argv[1])
for n in [int(x) for x in sys.argv[2:]]:
    batch = [[(f"p{j}", ps[j % len(ps)]) for j in range(n)]]
    engs = {"off": make_engine(target, tok, "none", spec="decode", lanes=n, max_len=max_len),
            "on": make_engine(target, tok, "dflash2", k=7, lanes=n, max_len=max_len, plan="measured"),
            "nodraft": make_engine(target, tok, "dflash2", k=7, lanes=n, max_len=max_len, plan="measured")}
    for e in engs.values():
        run_batch(e, batch[0][:1], 4)
    def cfg(name, e):
        def f(items):
            FORCE[0] = name == "nodraft"
            try: return run_batch(e, items, 48)
            finally: FORCE[0] = False
        return f
    res = alternate({k: cfg(k, e) for k, e in engs.items()}, batch, reps, None)
    agg = {k: [aggregate(b) for rs in runs for b in rs] for k, runs in res.items()}
    for k in ("on", "nodraft"):
        r = [a / b for a, b in zip(agg[k], agg["off"])]
        print(f"{n} lanes {k}/off median {statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]  "
              f"off {statistics.median(agg['off']):.1f} tok/s", flush=True)
