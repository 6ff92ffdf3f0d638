"""Rows a dflash2 batch projects into its window, and the seconds its upkeep takes, in the defaults section's
batches (bench/measure.py's engine, the mixed prompts of `speclane bench --sections defaults`, 48 tokens each).
Deterministic where it counts: greedy tokens, so the rows projected depend on the plan's choices only; with
`--no-draft` the plan is forced to draft nothing. Run against another tree with PYTHONPATH=that tree.
usage: python rows.py [--no-draft] LANES..."""
import sys, time, collections, torch
from speclane.stages.models.loading import load_model
from speclane.bench import workloads
from speclane.bench.measure import make_engine, run_batch
import speclane.stages.anchor_gather as AG
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.drafters.dflash2 import DFlash2
torch.set_num_threads(1)
args = sys.argv[1:]
no_draft = "--no-draft" in args
lanes = [int(a) for a in args if not a.startswith("--")]
target, tok = load_model(None, "bfloat16")
eng0 = make_engine(target, tok, "none", spec="decode")
picked = {w: workloads.pick(workloads.load(), w, 2) for w in ("code_edit", "code_gen", "prose")}
mixed = [p for group in zip(*picked.values()) for p in group]
ps = [eng0.apply_chat([{"role": "user", "content": p["user"]}]) for p in mixed]
max_len = max(map(len, ps)) + 64
T = collections.Counter()
project = DFlash2.project
def counted(self, raw, positions):
    t = time.perf_counter()
    try: return project(self, raw, positions)
    finally:
        T["rows"] += raw.shape[0]; T["calls"] += 1; T["project_s"] += time.perf_counter() - t
        T["row_bytes"] = raw[0].numel() * raw.element_size()
DFlash2.project = counted
depth = [0]
def timed(name):
    f = getattr(ModelBackend, name)
    def g(*a, **k):
        depth[0] += 1
        t = time.perf_counter()
        try: return f(*a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0: T[name + "_s"] += time.perf_counter() - t
    setattr(ModelBackend, name, g)
for name in ("observe", "snapshot", "restore", "catch_up"):
    timed(name)
if no_draft:
    AG.plan_drafts = lambda caps, *a, **k: (0,) * len(caps)
print(f"cpu {torch.backends.cpu.get_cpu_capability()}, no_draft={no_draft}")
for n in lanes:
    batch = [(f"p{j}", ps[j % len(ps)]) for j in range(n)]
    eng = make_engine(target, tok, "dflash2", k=7, lanes=n, max_len=max_len, plan="measured")
    run_batch(eng, batch[:1], 4)
    for rep in range(3):
        T.clear()
        t0 = time.perf_counter()
        runs = run_batch(eng, batch, 48)
        wall = time.perf_counter() - t0
        prompt = sum(len(p) for _, p in batch)
        print(f"{n} lanes rep {rep}: batch {wall * 1e3:.0f} ms, prompt rows {prompt}, projected rows {T['rows']} "
              f"in {T['calls']} calls ({T['row_bytes']} B a raw row), project {T['project_s'] * 1e3:.1f} ms; "
              + ", ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in sorted(T.items()) if k.endswith("_s")
                          and k != "project_s"), flush=True)
