"""Controls for the model drafters (issue 18): small fits that decide "bug or capacity" in minutes.

Owns: the copy task (sequences whose answer repeats a span of the prompt verbatim, run through the target for its
taps; the labels are the copied text itself, which a working induction path predicts at every block position),
a short fitting loop with the knobs the controls vary (which block rows count and how they are weighted, the
learning rate schedule, anchors a step), and acceptance counted on the same anchors for either drafter, so a
dflash2 and an mtp figure compare like with like. The loop is `fit.py`'s (AdamW 0.9/0.95, weight decay 0.01,
clipping at 1, one sequence a step, bf16 autocast) without its data building, checkpoints or export.
Not here: the commands that run the controls and print their figures (`bench/drafter_controls.py`), the losses'
math (`losses.py`).
"""

from __future__ import annotations

import math
import random
import time
from typing import Callable

import attrs
import torch

from speclane.stages.fitting import data as fit_data
from speclane.stages.fitting import losses as fit_losses
from speclane.stages.models.dense import unpacked

Tensor = torch.Tensor


def copy_items(count: int, seed: int, vocab: tuple[int, int], prompt_len: int, span: int):
    """`count` (kind, prompt ids, prompt + answer ids): the prompt is `prompt_len` random tokens drawn without
    repeats from ids vocab[0] .. vocab[1] - 1 (so each token names one place in it), the answer a `span`-token
    stretch of the prompt copied verbatim from a random offset."""
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        prompt = rng.sample(range(*vocab), prompt_len)
        at = rng.randrange(prompt_len - span + 1)
        items.append(("copy", prompt, prompt + prompt[at : at + span]))
    return items


def copy_sequences(
    target, count: int, seed: int, vocab: tuple[int, int], prompt_len: int = 128, span: int = 96
) -> list[dict]:
    """Copy-task sequences with the target's taps (`fit_data.forced`); without `next`, so every label is the
    copied text's next token (`fit_losses._chain_labels`). Their tokens are numbered from vocab[0]: a drafter
    fitted on them reads `embed[vocab[0]:vocab[1]]` and drafts through `head[vocab[0]:vocab[1]]` (the copy task's
    own vocabulary, which keeps the output head's product small enough for a control on one core)."""
    seqs = fit_data.forced(target, copy_items(count, seed, vocab, prompt_len, span))
    for q in seqs:
        del q["next"]
        q["tokens"] = q["tokens"] - vocab[0]
    return seqs


def schedule(lr: float, warmup: int, steps: int, step: int, shape: str = "cosine") -> float:
    """Linear warm-up, then cosine to zero at `steps` (`shape="cosine"`, fit-drafter's) or flat (`"constant"`)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if shape == "constant":
        return lr
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))


@attrs.frozen
class ControlFit:
    """One control fit's knobs; every other setting is fit-drafter's."""

    backend: str  # dflash2 | mtp
    steps: int
    lr: float
    seed: int = 0
    warmup: int = 50
    shape: str = "cosine"  # learning rate schedule: cosine | constant
    anchors: int = 48  # dflash2: anchors a step (0: every answer position, as mtp fits)
    width: int | None = None  # dflash2: block rows whose loss counts (1: the first draft's alone)
    decay: float = fit_losses.DECAY  # weight of draft j: exp(-(j - 1) / decay); inf: all alike
    depth: int = 3  # mtp: chained drafts fitted
    same_anchors: bool = False  # mtp: fit only the anchors dflash2 would draw (`anchors` of them), not all
    autocast: bool = False  # bf16 autocast as fit-drafter does (slower than float32 on a CPU without bf16 hardware)


def step_loss(c: ControlFit, net, seq: dict, embed: Tensor, head: Tensor, gen: torch.Generator):
    """(loss, labels that counted) of one sequence, or None when it has no answer position to fit."""
    cand = fit_losses.answer_anchors(seq, 1)
    if len(cand) == 0:
        return None
    if c.anchors:
        cand = cand[torch.randperm(len(cand), generator=gen)[: c.anchors]].sort().values
    if c.backend == "mtp":
        return fit_losses.mtp_loss(
            net, seq, embed, head, c.depth, decay=c.decay, chains=cand - 1 if c.same_anchors else None
        )
    return fit_losses.dflash2_loss(net, seq, embed, head, cand, width=c.width, decay=c.decay)


def run_fit(
    c: ControlFit,
    net,
    train: list[dict],
    embed: Tensor,
    head: Tensor,
    every: int = 0,
    check: Callable[[int], None] | None = None,
    log: Callable[[str], None] = print,
) -> list:
    """Fit `net` in place for `c.steps` steps on `train`; `check(step)` runs every `every` steps (a curve).
    Returns the loss of every step."""
    torch.manual_seed(c.seed)
    gen = torch.Generator().manual_seed(c.seed)
    rng = random.Random(c.seed)
    opt = torch.optim.AdamW(net.parameters(), lr=c.lr, weight_decay=0.01, betas=(0.9, 0.95))
    net.train()
    losses, step, t0 = [], 0, time.time()
    while step < c.steps:
        seq = train[rng.randrange(len(train))]
        for group in opt.param_groups:
            group["lr"] = schedule(c.lr, c.warmup, c.steps, step, c.shape)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.autocast):
            fitted = step_loss(c, net, seq, embed, head, gen)
        if fitted is None:
            continue
        fitted[0].backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        losses.append(float(fitted[0].detach()))
        if step % 50 == 0:
            log(
                f"{c.backend} step {step}/{c.steps} loss {sum(losses[-50:]) / 50:.3f} "
                f"{step / (time.time() - t0):.2f} steps/s"
            )
        if every and check is not None and step % every == 0:
            check(step)
    net.eval()
    return losses


@torch.no_grad()
def drafts_at(backend: str, net, seq: dict, embed: Tensor, head: Tensor, anchors: Tensor, width: int) -> Tensor:
    """Greedy drafts [anchors, width] after each anchor: dflash2's block rows 1..width; mtp's chain fed the text's
    tokens, which is the chain fed its own drafts wherever the drafts before were accepted (the only drafts
    acceptance counts, when the text is the target's own)."""
    if backend == "dflash2":
        return (fit_losses._dflash2_states(net, seq, embed, anchors)[:, 1 : width + 1] @ head.T).argmax(-1)
    return (fit_losses._mtp_chain(net, seq, embed, width, anchors - 1) @ head.T).argmax(-1).T


@torch.no_grad()
def acceptance(backend: str, net, seqs: list[dict], embed: Tensor, head: Tensor, width: int = 7) -> dict:
    """Greedy acceptance on every answer anchor with `width` labels after it (the same anchors for either
    drafter): P(draft j accepted) and tokens a round at k = width."""
    net.eval()
    acc = []
    for q in seqs:
        anchors = fit_losses.answer_anchors(q, width)
        if len(anchors) == 0:
            continue
        labels, _ = fit_losses._chain_labels(q, anchors, width)
        drafts = drafts_at(backend, net, q, embed, head, anchors, width)
        acc.append(torch.cumprod((drafts == labels).long(), dim=1).float())
    rate = torch.cat(acc).mean(0)
    return {
        "anchors": sum(len(a) for a in acc),
        "accept": [round(x, 4) for x in rate.tolist()],
        "tau": round(1 + float(rate.sum()), 4),
    }


@torch.no_grad()
def init_from_target(net, target) -> None:
    """dflash2's layers start as the target's top `num_layers` decoder layers (its last one last): norms,
    attention, and the MLP where the intermediate sizes match (otherwise it stays as drawn). A head start of the
    same hidden size; the target must be a plain attention model with unquantized weights."""
    cfg, layers = target.cfg, [unpacked(lw) for lw in target.weights.layers]
    top = layers[len(layers) - len(net.layers) :]
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for mine, theirs in zip(net.layers, top):
        mix = theirs.mixer
        if not isinstance(getattr(mix, "qkv", None), Tensor) or mix.qkv.shape[0] != q_rows + 2 * kv_rows:
            raise ValueError(
                "init_from_target: the target's top layers must be plain attention layers with "
                "unquantized q|k|v weights (no gate, no int8)"
            )
        a = mine.self_attn
        q, k, v = mix.qkv.float().split([q_rows, kv_rows, kv_rows])
        for dst, src in ((a.q_proj, q), (a.k_proj, k), (a.v_proj, v), (a.o_proj, mix.o.float())):
            dst.weight.copy_(src)
        mine.input_layernorm.weight.copy_(theirs.input_norm.float())
        mine.post_attention_layernorm.weight.copy_(theirs.post_norm.float())
        gate_up = getattr(theirs.mlp, "gate_up", None)
        if isinstance(gate_up, Tensor) and gate_up.shape[0] == 2 * mine.mlp.gate_proj.weight.shape[0]:
            gate, up = gate_up.float().chunk(2)
            mine.mlp.gate_proj.weight.copy_(gate)
            mine.mlp.up_proj.weight.copy_(up)
            mine.mlp.down_proj.weight.copy_(theirs.mlp.down.float())
    net.norm.weight.copy_(target.weights.final_norm.float())
