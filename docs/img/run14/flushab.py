"""Usage: PYTHONPATH=<tree> OMP_NUM_THREADS=1 taskset -c 0 python flushab.py <label>. Flush cost of a 4-lane no-draft batch's backlog: prompt chunks, and 64 decode passes of 4 rows at once."""
import time, torch, statistics, sys
from speclane.stages.models.loading import load_model
from speclane.bench.measure import make_engine, run_batch
from speclane.bench import workloads
import speclane.stages.anchor_gather as AG
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
AG.plan_drafts = lambda caps, rates, costs: (0,) * len(caps)
eng = make_engine(target, tok, "dflash2", k=7, lanes=4, max_len=1024, plan="measured")
impl, st = eng.resources.drafter, eng.drafter_state
ps = [eng.apply_chat([{"role": "user", "content": p["user"]}]) for w in ("code_edit", "prose") for p in workloads.pick(workloads.load(), w, 2)]
impl.PENDING_ROWS = 10 ** 9
real = impl.flush
impl.flush = lambda state: None
run_batch(eng, [(f"p{i}", ps[i]) for i in range(4)], 70)
impl.flush = real
saved = list(st.pending)
big = [p for p in saved if p.raw.shape[0] > 8]
small = [p for p in saved if p.raw.shape[0] <= 8][:64]
print("prefill passes", len(big), "rows", sum(p.raw.shape[0] for p in big), "| decode passes", len(small), "rows", sum(p.raw.shape[0] for p in small))
def once(group):
    st.pending[:] = group
    t = time.perf_counter(); real(st); return time.perf_counter() - t
for name, g in (("prefill", big), ("decode64", small), ("decode1", small[:1])):
    ts = [once(g) for _ in range(15)]
    print(f"{sys.argv[1]} {name}: flush ms median {statistics.median(ts) * 1000:.2f} min {min(ts) * 1000:.2f}")
from torch.profiler import profile, ProfilerActivity
for _ in range(3): once(small)
st.pending[:] = small
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(5):
        st.pending[:] = small; real(st)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
