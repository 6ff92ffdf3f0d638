"""The torch operations one target pass dispatches on the device route (the one a GPU runs), counted on the meta
device, where nothing is computed: a pass that is bound by how many kernels it launches, not by the bytes it
streams, is bound by this count.

On the one GPU measured so far (docs/benchmarks.md, "NVIDIA H200") the eager pass took tens of ms and its CUDA graph
several ms, both far above the weights' streaming time: this says how many operations each pass holds and which.
Views (view, slice, permute, ...) launch nothing; the rest launch a kernel each on a GPU, except where the CUDA route
runs a triton kernel in place of a torch twin (the decode route's linear, whose twin pads its rows: a clone, a pad,
a product and a cast where CUDA launches one kernel; the KV commit; the routed experts; the Gated DeltaNet's per-row
rule, about eight operations a row where CUDA launches one kernel for all rows): there the twin's operations are
counted and the GPU launches fewer. Attention, norms, rotary and the Gated DeltaNet's conv run as counted.

    python -m speclane.bench.pass_ops [--model DIR] [--rows 1 8] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import sys

import attrs
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import speclane.kernels.moe as moe
from speclane.stages.models.layout import PassLayout
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target

VIEWS = frozenset(
    "view _unsafe_view slice unsqueeze squeeze permute expand t transpose select as_strided alias detach "
    "split split_with_sizes chunk unbind narrow reshape lift_fresh".split()
)


def to_meta(obj):
    """Every tensor inside a weights record moved to the meta device (attrs records, tuples, plain tensors)."""
    if isinstance(obj, torch.Tensor):
        return obj.to("meta")
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_meta(o) for o in obj)
    if attrs.has(type(obj)):
        return attrs.evolve(obj, **{f.name: to_meta(getattr(obj, f.name)) for f in attrs.fields(type(obj)) if f.init})
    return obj


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def count(target: Target, rows: int, context: int = 256) -> collections.Counter[str]:
    """Operations of one pass of `rows` rows after `context` positions, with a fixed layout (as a captured pass)."""
    state = target.new_state(slots=1, max_len=context + rows + 1)
    b = RowBatch.build([(0, context, list(range(rows)))])
    b = attrs.evolve(b, **{n: getattr(b, n).to("meta") for n in ("tokens", "positions", "cu_rows", "slots")})
    layout = PassLayout.build(b, state.max_len, Target.key_capacity(state), keys=Target.key_capacity(state))
    with torch.no_grad(), _Count() as c:
        target.forward(b, state, layout=layout)
    return c.ops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclane.bench.pass_ops", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="target artifact (default: the embedded default model)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    from speclane.stages.models.artifact import resolve

    real = Target.load(resolve(args.model), dtype=torch.bfloat16)
    target = Target(real.cfg, to_meta(real.weights), real.dtype, "meta", real.hidden_taps)
    layers = len(real.weights.layers)
    twin = moe.moe_experts_ref
    for rows in args.rows:
        moe.moe_experts_ref = _all_experts  # the twin groups rows on the host (no values on meta); the GPU's kernel not
        try:
            ops = count(target, rows)
        finally:
            moe.moe_experts_ref = twin
        launching = {k: v for k, v in ops.items() if k not in VIEWS}
        n = sum(launching.values())
        print(
            f"{rows} row(s): {sum(ops.values())} operations, {n} of them not views ({n / layers:.0f} a layer over "
            f"{layers} layers)"
        )
        print("  " + ", ".join(f"{k} {v}" for k, v in collections.Counter(launching).most_common(args.top)))
    return 0


def _all_experts(x, gate_up, down, top_i, top_w, linear=None):
    """The routed experts' output without grouping rows on the host: every expert on every row, weighted."""
    h = torch.einsum("rk,eok->reo", x, gate_up)
    gate, up = h.chunk(2, dim=-1)
    y = torch.einsum("rei,eoi->reo", torch.nn.functional.silu(gate) * up, down)
    weights = torch.zeros(x.shape[0], gate_up.shape[0], dtype=x.dtype, device=x.device).scatter(1, top_i, top_w)
    return torch.einsum("reo,re->ro", y, weights)


if __name__ == "__main__":
    sys.exit(main())
