"""The backlog charge on and off in one process: off, then dflash2 and mtp each with the charge (this session's
plan) and without it (`catch_up_charges` returning zeros: the plan of 0bf7b89), one batch of LANES different
prompts per engine, alternated (order reversed every repeat), batch wall time per engine; ratios paired per
repeat against off. usage: python charge_ab.py REPEATS LANES..."""
import sys, time, statistics, torch
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
charge = AG.catch_up_charges
CHARGE = [True]
AG.catch_up_charges = lambda *a: charge(*a) if CHARGE[0] else (0.0,) * len(a[0])
reps = int(sys.argv[1])
print(f"cpu {torch.backends.cpu.get_cpu_capability()}")
for n in [int(x) for x in sys.argv[2:]]:
    batch = [(f"p{j}", ps[j % len(ps)]) for j in range(n)]
    engs = {"off": (make_engine(target, tok, "none", spec="decode", lanes=n, max_len=max_len), True)}
    for b in ("dflash2", "mtp"):
        for on in (False, True):
            engs[f"{b} {'charged' if on else 'uncharged'}"] = (
                make_engine(target, tok, b, k=7, lanes=n, max_len=max_len, plan="measured"), on)
    for e, _ in engs.values():
        run_batch(e, batch[:1], 4)
    got = {k: [] for k in engs}
    drafted = {k: 0 for k in engs}
    for rep in range(reps):
        for name, (e, on) in (list(engs.items()) if rep % 2 == 0 else list(reversed(engs.items()))):
            CHARGE[0] = on
            t0 = time.perf_counter()
            runs = run_batch(e, batch, 48)
            got[name].append(time.perf_counter() - t0)
            drafted[name] += sum(sum(r.lane.offered_at) for r in runs)
    print(f"{n} lanes, {reps} alternated repeats: batch s median; batch time off / engine paired per repeat")
    for name in engs:
        r = [a / b for a, b in zip(got["off"], got[name])]
        print(f"  {name:18s} {statistics.median(got[name]):.3f} s  on/off {statistics.median(r):.3f} "
              f"[{min(r):.3f}, {max(r):.3f}]  drafted {drafted[name]}", flush=True)
