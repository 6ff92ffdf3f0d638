"""The raw script behind a figure of docs/serving-load.md (kept with its output, not a bench): a 2000-token
prefill in 32-row chunks against one 2000-row chunk, as raw target passes and through the engine (prefill_rows),
alternated, 2 repeats; seconds per prefill. Run from the repository root:
OMP_NUM_THREADS=1 taskset -c 1 python docs/img/serving-load/chunk_prefill.py"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # this checkout's code, not an installed one
import torch  # noqa: E402
from speclane.stages.models.loading import load_model  # noqa: E402
from speclane.stages.models.state import RowBatch  # noqa: E402
from speclane.pipeline.runtime.engine import Engine  # noqa: E402
from speclane.pipeline.runtime.request import GenerateRequest  # noqa: E402
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16", "cpu", "none")
ids = [1000 + i % 5000 for i in range(2000)]
def raw(chunk):
    st = target.new_state(1, 2100)
    t0 = time.perf_counter()
    for s in range(0, 2000, chunk):
        b = RowBatch.build([(0, s, ids[s:s + chunk])])
        out = target.forward(b, st, record="last", logits="last")
        target.commit(st, b, torch.tensor([len(ids[s:s + chunk])]), out)
    return time.perf_counter() - t0
engines = {c: Engine(target, tok, max_lanes=1, max_len=4096, checkpoint_bytes=0, prefill_rows=c) for c in (32, 2000)}
def eng(chunk):
    e = engines[chunk]
    t0 = time.perf_counter()
    e.generate([GenerateRequest(prompt_ids=ids, max_tokens=1)])
    return time.perf_counter() - t0
res = {}
for rep in range(2):
    for c in ((32, 2000) if rep % 2 == 0 else (2000, 32)):
        res.setdefault(("raw", c), []).append(raw(c))
        res.setdefault(("engine", c), []).append(eng(c))
from speclane import stages  # noqa: E402

print("code:", Path(stages.__file__).parent.parent)
for k, v in res.items():
    print(k, [round(x, 1) for x in v])
