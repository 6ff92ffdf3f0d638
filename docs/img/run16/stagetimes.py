"""Where a 4- or 8-lane batch's time goes, off against dflash2 with the plan forced to draft nothing, alternated
in one process: per verify-round stage and per prefill pass, ms a batch (median over repeats), from the engines'
stage timers (`--stage-times`). usage: python stagetimes.py REPEATS LANES..."""
import sys, time, statistics, collections, torch
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
AG.plan_drafts = lambda caps, *a, **k: (0,) * len(caps)
reps = int(sys.argv[1])
print(f"cpu {torch.backends.cpu.get_cpu_capability()}")
for n in [int(x) for x in sys.argv[2:]]:
    batch = [(f"p{j}", ps[j % len(ps)]) for j in range(n)]
    engs = {"off": make_engine(target, tok, "none", spec="decode", lanes=n, max_len=max_len),
            "dflash2": make_engine(target, tok, "dflash2", k=7, lanes=n, max_len=max_len, plan="measured")}
    got = {k: collections.defaultdict(list) for k in engs}
    for e in engs.values():
        run_batch(e, batch[:1], 4)
    for rep in range(reps):
        for name, e in (engs.items() if rep % 2 == 0 else reversed(engs.items())):
            e.times.seconds.clear(), e.prefill_times.seconds.clear()
            t0 = time.perf_counter()
            runs = run_batch(e, batch, 48, timed=True)
            got[name]["batch"].append(time.perf_counter() - t0)
            for k, v in runs[0].stage_s.items():
                got[name][k].append(v)
            got[name]["prefill (all stages)"].append(sum(e.prefill_times.seconds.values()))
    keys = sorted(set(got["off"]) | set(got["dflash2"]), key=lambda k: -statistics.median(got["off"].get(k, [0])))
    print(f"{n} lanes, {reps} alternated repeats, ms a batch (median): stage: off / dflash2 no drafts")
    for k in keys:
        a, b = (statistics.median(got[x][k]) * 1e3 if got[x].get(k) else 0.0 for x in ("off", "dflash2"))
        print(f"  {k:28s} {a:8.1f} / {b:8.1f}")
    r = [b / a for a, b in zip(got["off"]["batch"], got["dflash2"]["batch"])]
    print(f"  batch time dflash2/off per pair: median {statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]", flush=True)
