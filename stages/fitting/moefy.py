"""MoEfication: a dense llama-family target's MLPs split into routed experts by co-activation on real text, with a
fitted router per layer, saved as a MoE model whose routing has the locality of text.

Why this target: a benchmark of an expert cache is only as honest as its routing. Random routing has no locality
(every expert equally likely at every token), so it understates what a cache can hold; a real MoE download does
not fit this project's machines. Splitting the embedded default model's SwiGLU neurons by which ones fire together
on text, and routing each token to the experts a fitted router says hold most of its activation, gives routing that
follows the text (code tokens and prose tokens choose different experts, a repeated phrase chooses its experts again)
at a size that runs on one core.

Owns: the teacher pass (the dense model in float32 over token sequences, layer by layer, keeping each MLP's input and
its SwiGLU activation), the split (a shared expert of the neurons most active on average; the rest clustered into
equal experts by balanced k-means on their activation patterns), the router (ridge regression from the MLP input to
each expert's activation mass), the look-ahead statistics (layer i+1's router applied to layer i's MLP input: the
prefetch a cache could issue one layer early), and the command that writes it:

    python -m speclane.stages.fitting.moefy --out DIR [--model DENSE_LLAMA_DIR]

The output is a `qwen2_moe` directory (`moe_dir.py`) that `--model DIR` loads, with `--expert-cache` or without;
`moefied` builds the Target over it. The layout is that of stages/models/moe.py: softmax router, top-k renormalised,
a shared expert with a sigmoid gate; the router's logits are scaled small so the renormalised weights are close to
1/k, and each expert's down projection is scaled by k, so a token's routed output is close to the sum of its
experts' neurons. Not here: the expert cache (stages/models/expert_cache.py), the benchmark (speclane.bench.experts).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from pydoc_data.topics import topics

import attrs
import torch
import torch.nn.functional as F
from safetensors import safe_open

from speclane.stages.fitting.data import held_out
from speclane.stages.fitting.moe_dir import write_moe_dir
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.expert_cache import DEFAULT_POLICY
from speclane.stages.models.ops import apply_rope, rms_norm, rope_tables
from speclane.stages.models.state import RowBatch
from speclane.stages.models.target import Target
from speclane.stages.models.weights import ModelWeights, load_weights

Tensor = torch.Tensor
VERSION = 3  # bump when the fit's output changes, so an older cached artifact is refitted


@attrs.frozen
class MoefySettings:
    """The MoE shape (`experts` routed experts a layer, `top_k` chosen a token, `shared` neurons in the shared
    expert; the rest split equally) and the fit's text (`sequences` of `length` tokens)."""

    experts: int = 32
    top_k: int = 4
    shared: int = 512
    sequences: int = 16
    length: int = 256
    feature_tokens: int = 3072  # tokens whose activations describe a neuron for the clustering
    iterations: int = 6
    ridge: float = 1e-2
    seed: int = 0

    def key(self) -> str:
        return json.dumps({"v": VERSION, **attrs.asdict(self)}, sort_keys=True)


def teacher(w: ModelWeights, cfg: ModelConfig, ids: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    """For ids [sequences, length]: per layer in order, the MLP input [tokens, hidden] and its SwiGLU activation
    [tokens, intermediate], computed in float32 by the dense model (w loaded in float32, full attention only)."""
    b, t = ids.shape
    nh, kvh, hd, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    cos, sin = rope_tables(torch.arange(t).repeat(b), cfg.rotary_dim, cfg.rope_theta)
    x = w.embed[ids].reshape(b * t, -1).float()
    for lw in w.layers:
        q, k, v = (rms_norm(x, lw.input_norm, eps) @ lw.mixer.qkv.T).split([nh * hd, kvh * hd, kvh * hd], -1)
        q = apply_rope(q.reshape(b * t, nh, hd), cos, sin).reshape(b, t, nh, hd).transpose(1, 2)
        k = apply_rope(k.reshape(b * t, kvh, hd), cos, sin).reshape(b, t, kvh, hd).transpose(1, 2)
        v = v.reshape(b, t, kvh, hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + o.transpose(1, 2).reshape(b * t, nh * hd) @ lw.mixer.o.T
        h = rms_norm(x, lw.post_norm, eps)
        gate, up = (h @ lw.mlp.gate_up.T).chunk(2, dim=-1)
        act = F.silu(gate) * up
        yield h, act
        x = x + act @ lw.mlp.down.T


def balanced_clusters(features: Tensor, groups: int, iterations: int, seed: int) -> Tensor:
    """features [n, d] (n a multiple of `groups`) -> [groups, n // groups] neuron indices: balanced k-means on
    cosine similarity, each cluster exactly n // groups members (greedy assignment by descending similarity)."""
    n = features.shape[0]
    size = n // groups
    f = F.normalize(features, dim=1)
    gen = torch.Generator().manual_seed(seed)
    centres = f[torch.randperm(n, generator=gen)[:groups]]
    members = torch.zeros(groups, size, dtype=torch.int64)
    for _ in range(iterations):
        order = (f @ centres.T).flatten().argsort(descending=True).tolist()  # neuron * groups + cluster
        taken, fill, left = [False] * n, [0] * groups, n
        for flat in order:
            neuron, c = divmod(flat, groups)
            if taken[neuron] or fill[c] == size:
                continue
            members[c, fill[c]] = neuron
            taken[neuron], fill[c], left = True, fill[c] + 1, left - 1
            if not left:
                break
        centres = F.normalize(f[members].mean(dim=1), dim=1)
    return members.sort(dim=1).values


def fit_router(h: Tensor, mass: Tensor, ridge: float) -> Tensor:
    """Ridge regression h [tokens, hidden] -> mass [tokens, experts]: the router [experts, hidden]."""
    gram = h.T @ h
    gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0])
    return torch.linalg.solve(gram, h.T @ mass).T.contiguous()


def _recall(pred: Tensor, mass: Tensor, k: int) -> float:
    """The share of the best k experts' activation energy that the predicted top k hold, averaged over tokens."""
    best = mass.topk(k, dim=-1).values.sum(-1)
    got = mass.gather(1, pred.topk(k, dim=-1).indices).sum(-1)
    return float((got / best.clamp_min(1e-9)).mean())


def moefy(base: Path, out: Path, s: MoefySettings, ids: Tensor) -> dict:
    """Fit the MoE of the dense model at `base` on token sequences ids [sequences, length] and write it as the
    qwen2_moe directory `out` (`moe_dir.write_moe_dir`). Returns the fit's record, also `out`/moe.json (shape,
    per-layer router recall, look-ahead)."""
    cfg = ModelConfig.load(base)
    if cfg.model_type != "llama" or any(cfg.moe_layers):
        raise ValueError(f"moefy: {base} must be a dense llama-family model, got {cfg.model_type}")
    inter = cfg.intermediate_size
    if (inter - s.shared) % s.experts or not 0 < s.top_k <= s.experts:
        raise ValueError(f"moefy: {inter} - {s.shared} shared neurons must split into {s.experts} experts")
    w = load_weights(base, cfg, torch.float32, "cpu")
    e_inter, p = (inter - s.shared) // s.experts, cfg.tensor_prefix
    tensors: dict[str, Tensor] = {}
    stats = {"recall": [], "lookahead": [], "kept_energy": []}
    previous = None  # (MLP input of layer i - 1)
    for i, (h, act) in enumerate(teacher(w, cfg, ids)):
        lw, a = w.layers[i].mlp, act.square()  # energy: a few large activations carry a token's output
        shared = a.mean(0).topk(s.shared).indices.sort().values
        rest = torch.ones(inter, dtype=torch.bool)
        rest[shared] = False
        rest = rest.nonzero().flatten()
        members = rest[balanced_clusters(a[: s.feature_tokens, rest].T, s.experts, s.iterations, s.seed + i)]
        mass = a[:, members].sum(-1)  # [tokens, experts]
        router = fit_router(h, mass, s.ridge)
        stats["recall"].append(round(_recall(h @ router.T, mass, s.top_k), 4))
        chosen = mass.gather(1, (h @ router.T).topk(s.top_k, dim=-1).indices).sum(-1)
        kept = (a[:, shared].sum(-1) + chosen) / a.sum(-1).clamp_min(1e-9)  # what the MoE keeps of the layer
        stats["kept_energy"].append(round(float(kept.mean()), 4))
        if previous is not None:
            ahead, now = (previous @ router.T).topk(s.top_k).indices, (h @ router.T).topk(s.top_k).indices
            hit = (ahead[:, :, None] == now[:, None, :]).any(-1).float().mean()
            stats["lookahead"].append(round(float(hit), 4))
        previous = h
        # logits scaled to a spread far below 1: the renormalised top-k weights are close to 1/k (down is x k)
        scale = 1e-2 / float((h[:256] @ router.T).std().clamp_min(1e-9))
        gate, up = lw.gate_up[:inter], lw.gate_up[inter:]
        mp = f"{p}layers.{i}.mlp."
        tensors[mp + "gate.weight"] = router * scale
        for j, m in enumerate(members):
            tensors[f"{mp}experts.{j}.gate_proj.weight"] = gate[m].to(torch.bfloat16)
            tensors[f"{mp}experts.{j}.up_proj.weight"] = up[m].to(torch.bfloat16)
            tensors[f"{mp}experts.{j}.down_proj.weight"] = (lw.down[:, m] * s.top_k).to(torch.bfloat16)
        tensors[mp + "shared_expert.gate_proj.weight"] = gate[shared]
        tensors[mp + "shared_expert.up_proj.weight"] = up[shared]
        tensors[mp + "shared_expert.down_proj.weight"] = lw.down[:, shared] * 2  # sigmoid(0) = 1/2 undone
        tensors[mp + "shared_expert_gate.weight"] = torch.zeros(1, cfg.hidden_size)
    with safe_open(str(next(base.glob("*.safetensors"))), "pt") as f:
        for name in f.keys():
            if ".mlp." not in name:
                tensors[name] = f.get_tensor(name)
    record = {
        "settings": json.loads(s.key()),
        "num_experts": s.experts,
        "experts_per_token": s.top_k,
        "moe_intermediate_size": e_inter,
        "shared_expert_intermediate_size": s.shared,
        "fit_tokens": int(ids.numel()),
        "router_recall_mean": round(sum(stats["recall"]) / len(stats["recall"]), 4),
        "kept_energy_mean": round(sum(stats["kept_energy"]) / len(stats["kept_energy"]), 4),
        "lookahead_hit_mean": round(sum(stats["lookahead"]) / max(1, len(stats["lookahead"])), 4),
        **stats,
    }
    write_moe_dir(base, out, tensors, record)
    return record


def moefied(out: Path, dtype: torch.dtype, budget_bytes: int | None = None, policy: str = DEFAULT_POLICY) -> Target:
    """The MoEfied directory `out` loaded on a CPU as `--model out` loads it: every routed expert resident
    (`budget_bytes` None) or an expert cache of that budget over the file read in place, running `policy`. Its
    drafters' files are found as for any model (beside it, else the shipped ones fitted to these shapes)."""
    target = Target.load(out, dtype=dtype, expert_cache_bytes=budget_bytes)
    if target.experts is not None and policy != target.experts.policy:
        target.experts.reset(policy)
    return target


def fit_ids(tokenizer, s: MoefySettings) -> Tensor:
    """[sequences, length] token ids of real text the fit may see: half Python standard-library source, half its
    prose (pydoc topics), from the files the drafter fitting trains on (never the held-out ones the bench
    prompts come from), cut into windows of `length` tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in root.glob("*.py") if not held_out(str(f)))
    rng = random.Random(s.seed)
    prose = [
        topics[k] for k in sorted(topics) if not held_out(f"pydoc_data.topics:{k}")
    ]  # as bench/workloads.py names them
    rng.shuffle(files)
    rng.shuffle(prose)
    windows: list[list[int]] = []
    for pool, want in ((files, s.sequences // 2), (prose, s.sequences - s.sequences // 2)):
        got = 0
        for item in pool:
            text = item.read_text(errors="replace") if isinstance(item, Path) else item
            ids = tokenizer.encode(text)
            for at in range(0, len(ids) - s.length + 1, s.length * 4):  # spread over the document
                windows.append(ids[at : at + s.length])
                got += 1
                if got == want:
                    break
            if got == want:
                break
    return torch.tensor(windows, dtype=torch.int64)


@torch.no_grad()
def agreement(dense: Target, moe: Target, ids: list[int]) -> float:
    """The share of positions of `ids` (one sequence, teacher-forced) where the two targets' greedy tokens agree."""
    picks = []
    for target in (dense, moe):
        state = target.new_state(1, len(ids) + 1)
        out = target.forward(RowBatch.build([(0, 0, ids)]), state, record="last", logits="all")
        picks.append(out.logits.argmax(-1))
    return float((picks[0] == picks[1]).float().mean())


def main(argv: list[str] | None = None) -> int:
    """`python -m speclane.stages.fitting.moefy --out DIR [--model DENSE] [--experts N ...]`: MoEfy the dense
    llama-family model (the embedded default unless --model) on the fit's text and write the qwen2_moe directory
    DIR; the MoE's shape and the fit's text size default to `MoefySettings`' (what the benchmark runs)."""
    from speclane.stages.models.artifact import resolve
    from speclane.stages.models.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(prog="python -m speclane.stages.fitting.moefy", description=main.__doc__)
    parser.add_argument("--out", required=True, type=Path, help="the directory to write (replaced if it exists)")
    parser.add_argument("--model", default=None, help="a dense llama-family model (default: the embedded one)")
    d = MoefySettings()
    for name in ("experts", "top_k", "shared", "sequences", "length"):
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, default=getattr(d, name), help=f"default {getattr(d, name)}")
    args = parser.parse_args(argv)
    base = resolve(args.model)
    s = attrs.evolve(d, **{k: getattr(args, k) for k in ("experts", "top_k", "shared", "sequences", "length")})
    record = moefy(base, args.out, s, fit_ids(Tokenizer.load(base), s))
    print(
        f"wrote {args.out}: {record['num_experts']} routed experts a layer, top {record['experts_per_token']}, "
        f"router recall {record['router_recall_mean']:.2f}; run it with `speclane generate --model {args.out}`"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
