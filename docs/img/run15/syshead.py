"""A shared system prompt (CPython's own docs, ~N tokens) with different user questions, one after another: time to
first token with the chat head checkpoint (this commit) against the same engine with `Keeper.head` returning 0
(the interval and prompt-end checkpoints alone, as before), alternated. usage: python syshead.py REPEATS"""
import sys, time, statistics, torch, pydoc_data.topics as T
from speclane.pipeline.runtime.keeper import Keeper
from speclane.pipeline.runtime.engine import Engine
from speclane.pipeline.runtime.request import SpecKnobs, parse_request
from speclane.stages.models.loading import load_model
torch.set_num_threads(1)
target, tok = load_model(None, "bfloat16")
system = "You are a Python expert. Reference:\n" + T.topics["for"][:2400]
users = ["How do I loop over a dict's items?", "What does else after a for loop do?",
         "Explain break and continue.", "Can a for loop modify its list?", "What is an iterator?"]
head0 = Keeper.head
def engine(on):
    e = Engine(target, tok, spec="verify", knobs=SpecKnobs(backend="none"), max_lanes=1, max_len=4096)
    if not on:
        e.keeper.head = lambda ids, messages: 0
    return e
res = {"head": [], "before": []}
for rep in range(int(sys.argv[1])):
    for name in (("head", "before") if rep % 2 == 0 else ("before", "head")):
        eng = engine(name == "head")
        ttft = []
        for u in users:
            req = parse_request({"messages": [{"role": "system", "content": system}, {"role": "user", "content": u}], "max_tokens": 4})
            lane = eng.submit(req)
            while eng.busy():
                eng.step()
            ttft.append(lane.t_first - lane.t_submit)
        res[name].append(ttft)
        print(name, "prompt", len(lane.prompt_ids), "marks", lane.checkpoint_at, "reused", lane.prefix_reused,
              "ttft ms", [round(t * 1e3) for t in ttft], flush=True)
for i in range(len(users)):
    r = [b[i] / h[i] for h, b in zip(res["head"], res["before"])]
    print(f"request {i + 1}: ttft before / head median {statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}]")
