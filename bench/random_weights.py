"""An artifact of a real model's shape with random weights: for a machine the real weights cannot reach.

A lent GPU machine takes a repository of at most a few tens of MB and reaches no model hub, so a benchmark of time
per pass there (`bench.cuda_graphs`, `bench.agents --device cuda`) runs on the same shapes with random values: a
pass streams the same bytes and launches the same kernels whatever the values are. What random weights cannot say
is anything that depends on the text (acceptance, the tokens chosen, when a request ends): never report those from
such an artifact.

    python -m speclane.bench.random_weights --out DIR [--like PATH]          # the shape of PATH (default: the
                                                                               # embedded default model), its tokenizer
    python -m speclane.bench.random_weights --out DIR --hybrid [--hidden 1024 --layers 24 --vocab 151936]
    python -m speclane.bench.random_weights --out DIR --moe [--hidden 2048 --layers 4 --experts 128 --top 8]
    python -m speclane.bench.random_weights --out DIR --shape-only [--like PATH]   # the shape alone, no weights

`--like` keeps the artifact's config and tokenizer files and its tensors' names and shapes (from its safetensors
headers, or from a `shapes.json` that `--shape-only` wrote: a few MB that can go where the weights cannot).
`--hybrid` writes a `qwen3_5_text` target (three Gated DeltaNet layers to one attention layer), `--moe` a
`qwen3_moe` one with Qwen3-30B-A3B's layer shape (hidden 2048, 128 routed experts of inner size 768, top 8, 32
query and 4 KV heads of 128) and fewer layers; their tensor names and shapes are taken from transformers' own model
class built on the meta device (no weights made), and they have no tokenizer. A random model does not route as
text does, nor uniformly: its router favours a few experts of each layer, and a greedy decode from random
ids repeats itself, so a cache's hit rate on it says nothing of real text, in either direction
(`bench.routing_trace --random-ids` measures it; `bench.expert_tier --routing` replays text's instead). Values: norms 1
(0 where the model adds 1 to them), the Gated DeltaNet's `A_log` log U(1, 16) and `dt_bias` 1, every other
matrix N(0, 0.02), written in bf16.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

STD = 0.02


def shapes_of(directory: Path) -> dict[str, list[int]]:
    """Every tensor's name and shape in a directory's safetensors files, read from their headers alone."""
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with open(file, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        header.pop("__metadata__", None)
        out.update({name: info["shape"] for name, info in header.items()})
    return out


def hybrid_config(hidden: int, layers: int, vocab: int) -> dict:
    """A qwen3_5_text config: every fourth layer attention, heads of 256 (attention) and 128 (Gated DeltaNet)."""
    from speclane.bench import installed_kernels_first

    installed_kernels_first()
    from transformers import Qwen3_5TextConfig

    heads = max(1, hidden // 128)
    cfg = Qwen3_5TextConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 7 // 2,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 128),
        num_key_value_heads=max(1, hidden // 512),
        head_dim=256,
        linear_num_key_heads=heads * 2,
        linear_num_value_heads=heads * 2,
        vocab_size=vocab,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        tie_word_embeddings=True,
    )
    return cfg.to_dict()


def moe_config(hidden: int, layers: int, vocab: int, experts: int, top: int) -> dict:
    """A qwen3_moe config of Qwen3-30B-A3B's proportions at `hidden` (every layer MoE, no shared expert)."""
    from speclane.bench import installed_kernels_first

    installed_kernels_first()
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        moe_intermediate_size=hidden * 3 // 8,
        num_experts=experts,
        num_experts_per_tok=top,
        norm_topk_prob=True,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 512),
        head_dim=128,
        vocab_size=vocab,
        tie_word_embeddings=False,
    )
    return cfg.to_dict()


def meta_shapes(config: dict) -> dict[str, list[int]]:
    """Tensor names and shapes of transformers' model class for `config`, built on the meta device."""
    from speclane.bench import installed_kernels_first

    installed_kernels_first()
    import transformers

    kinds = {
        "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    }
    config_cls, model_cls = (getattr(transformers, n) for n in kinds[config["model_type"]])
    with torch.device("meta"):
        model = model_cls(config_cls(**config))
    out = {}
    for name, t in model.state_dict().items():
        # transformers 5 stacks a layer's experts in memory; checkpoints (and our loader) name each expert's own
        if name.endswith("mlp.experts.gate_up_proj"):  # [experts, 2 * inter, hidden]
            e, two_inter, hidden = t.shape
            for j in range(e):
                for part in ("gate", "up"):
                    out[f"{name.removesuffix('gate_up_proj')}{j}.{part}_proj.weight"] = [two_inter // 2, hidden]
        elif name.endswith("mlp.experts.down_proj"):  # [experts, hidden, inter]
            for j in range(t.shape[0]):
                out[f"{name.removesuffix('down_proj')}{j}.down_proj.weight"] = list(t.shape[1:])
        else:
            out[name] = list(t.shape)
    return out


def random_tensor(name: str, shape: list[int], adds_one: bool, gen: torch.Generator) -> torch.Tensor:
    dev = gen.device
    if name.endswith("A_log"):
        return torch.empty(shape, device=dev).uniform_(1, 16, generator=gen).log()
    if name.endswith("dt_bias"):
        return torch.ones(shape, device=dev)
    if len(shape) == 1 and "norm" in name:
        # the Gated DeltaNet's output norm scales by its weight; the model's other norms by 1 + weight
        zero = adds_one and "linear_attn.norm" not in name
        return torch.zeros(shape, device=dev) if zero else torch.ones(shape, device=dev)
    return torch.randn(shape, generator=gen, device=dev) * STD


def write(out: Path, config: dict, shapes: dict[str, list[int]], extra_files: list[Path] = (), seed: int = 0) -> None:
    """The artifact at `out`: config.json, model.safetensors (bf16), and `extra_files` copied beside them."""
    out.mkdir(parents=True, exist_ok=True)
    adds_one = config.get("model_type", "").startswith(("qwen3_5", "qwen3_next"))
    tied = config.get("tie_word_embeddings", False)
    # drawn on a GPU where there is one (a few GB of normals take a CPU thread minutes); the values differ by device
    gen = torch.Generator("cuda" if torch.cuda.is_available() else "cpu").manual_seed(seed)
    tensors = {
        name: random_tensor(name, shape, adds_one, gen).to(torch.bfloat16).cpu()
        for name, shape in shapes.items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}, indent=1))
    for f in extra_files:
        shutil.copy(f, out / f.name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speclane.bench.random_weights", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the directory to write")
    ap.add_argument("--like", default=None, help="the artifact whose shape to take (default: the embedded default)")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--hybrid", action="store_true", help="a qwen3_5_text target of the sizes below instead")
    kind.add_argument("--moe", action="store_true", help="a qwen3_moe target of the sizes below instead")
    kind.add_argument("--shape-only", action="store_true", help="write --like's config, tokenizer and shapes.json")
    ap.add_argument("--hidden", type=int, default=None, help="default 1024 (--hybrid), 2048 (--moe)")
    ap.add_argument("--layers", type=int, default=None, help="default 24 (--hybrid), 4 (--moe)")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--experts", type=int, default=128, help="--moe: routed experts a layer")
    ap.add_argument("--top", type=int, default=8, help="--moe: experts a token")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.hybrid or args.moe:
        hidden = args.hidden or (1024 if args.hybrid else 2048)
        layers = args.layers or (24 if args.hybrid else 4)
        if hidden % 128 or layers < 1 or args.vocab < 2 or not 1 <= args.top <= args.experts:
            ap.error(
                "--hidden must be a multiple of 128, --layers at least 1, --vocab at least 2, 1 <= --top <= --experts"
            )
        if args.hybrid:
            config = hybrid_config(hidden, layers, args.vocab)
        else:
            config = moe_config(hidden, layers, args.vocab, args.experts, args.top)
        write(out, config, meta_shapes(config))
    else:
        like = Path(args.like) if args.like and (Path(args.like) / "shapes.json").is_file() else None
        if like is None:
            from speclane.stages.models.artifact import resolve

            like = resolve(args.like)
        extra = [f for f in like.iterdir() if f.name.startswith("tokenizer") or f.name == "generation_config.json"]
        config = json.loads((like / "config.json").read_text())
        shapes = json.loads((like / "shapes.json").read_text()) if (like / "shapes.json").is_file() else shapes_of(like)
        if args.shape_only:
            out.mkdir(parents=True, exist_ok=True)
            (out / "shapes.json").write_text(json.dumps(shapes))
            (out / "config.json").write_text(json.dumps(config, indent=1))
            for f in extra:
                shutil.copy(f, out / f.name)
            print(f"wrote {out} (the shape alone: config, tokenizer, shapes.json)")
            return 0
        write(out, config, shapes, extra)
    print(f"wrote {out} (random weights: time per pass only, nothing that depends on the text)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
