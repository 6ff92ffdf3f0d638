"""What the model drafters are fitted to, and how their acceptance is measured on held-out sequences.

Owns: one loss per drafter over one sequence from `fit_data` (prompt + the target's greedy answer + the target's
taps), and the matching greedy acceptance count, which replays exactly what a verify round would accept: drafts
count while they equal the target's own next tokens. Anchors are answer tokens only (a prompt is prefilled, never
drafted), and the context a drafter reads is every committed position before the anchor, as at run time.
A teacher-forced sequence carries `next`, the target's own greedy token after each row; its text need not agree
with it, so draft j is labelled with the target's choice and counts only while the text agreed with the target
for drafts 1..j-1 (then the text is the very prefix a verify round would have drafted on). On generated answers
the text is the target's choice everywhere and both rules reduce to "the next tokens".
With a `Teacher` the losses fit the target's whole next-token distribution at those rows (soft labels: cross-
entropy against it, which is KL plus the target's own entropy) instead of its argmax alone; acceptance is
counted the same way either way.
Not here: data (`fit_data.py`), the loop, checkpoints and export (`fit.py`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from speclane.stages.models.lookup import lookup_rows

Tensor = torch.Tensor
DECAY = 4.0  # later block positions only count when all before them were accepted: weight exp(-(j - 1) / DECAY)


class Teacher(NamedTuple):
    """What turns a row's recorded last-layer output (the last tap) into the target's next-token distribution:
    its final norm's scale and epsilon (the output head is the losses' `head`)."""

    final_norm: Tensor
    eps: float


def _token_loss(logits: Tensor, labels: Tensor, seq, rows: Tensor, head: Tensor, teacher: Teacher | None) -> Tensor:
    """Per-draft loss [N] of logits [N, vocab] whose label is the target's choice after row rows[i]: cross-entropy
    against that token, or with a teacher against the target's distribution there."""
    if teacher is None:
        return F.cross_entropy(logits.float(), labels, reduction="none")
    p = teacher_probs(seq, rows, head, teacher)
    return -(p * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


@torch.no_grad()
def teacher_probs(seq, rows: Tensor, head: Tensor, teacher: Teacher) -> Tensor:
    """The target's next-token distribution [N, vocab] after rows [N] (clamped to the last recorded row)."""
    h = seq["taps"][:, -1]
    h = h[rows.clamp(max=h.shape[0] - 1)].float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + teacher.eps) * teacher.final_norm
    return torch.softmax((h.to(head.dtype) @ head.T).float(), dim=-1)


def _rows(first: Tensor, width: int) -> Tensor:
    """[C, width]: the row whose next token draft j (1..width) of a chain starting at row `first` is."""
    return first[:, None] + torch.arange(width)


def seq_lookup(seq, cfg) -> tuple[Tensor, Tensor]:
    """Prompt lookup's candidates and suffix lengths [L, block_size - 1] at every position of `seq` taken as the
    anchor (`lookup.lookup_rows` over the tokens up to it, as the backend looks up a lane's tokens), computed once
    per sequence and kept in it."""
    key = ("lookup", cfg.lookup_min_n, cfg.lookup_max_n, cfg.block_size - 1)
    if key not in seq:
        tokens = seq["tokens"].tolist()
        seq[key] = lookup_rows(tokens, list(range(len(tokens))), cfg.block_size - 1, cfg.lookup_min_n, cfg.lookup_max_n)
    return seq[key]


def _dflash2_states(net, seq, embed, anchors: Tensor) -> Tensor:
    taps = seq["taps"].float()  # [R, n, hidden], R = L - 1 rows ran
    rows = torch.arange(taps.shape[0])
    feats = net.features(taps)
    entries = feats
    if net.cfg.paired:  # entry q: row q - 1's feature (zero before the first: a slot's carry) + token q
        prev = torch.cat([feats.new_zeros(1, feats.shape[1]), feats[:-1]])
        entries = net.pair(prev, embed[seq["tokens"][: len(rows)].long()])
    k, v = net.context_kv(entries, rows)  # [R, layers, kv]
    mask = (rows[None] < anchors[:, None]) & (rows[None] >= anchors[:, None] - net.cfg.window)
    # one window for every anchor, broadcast inside the block: expanded here, each layer's slice of it would have
    # cost a zero-filled [anchors, layers, R, kv] gradient in backward (a third of a fitting step, measured)
    lookup = None
    if net.cfg.looks_up:
        cand, level = seq_lookup(seq, net.cfg)
        lookup = net.lookup_input(embed, cand[anchors], level[anchors])
    return net.block(
        embed[seq["tokens"][anchors].long()],
        feats[anchors - 1],
        anchors,
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        mask,
        lookup,
    )


def _chain_labels(seq, first: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Labels [C, width] of a chain whose j-th draft (j = 1..width) follows row first + j - 1, and where each
    counts: the row exists, and the text after rows first .. first + j - 2 was the target's own choice."""
    tokens = seq["tokens"].long()
    nxt = seq["next"].long() if "next" in seq else tokens[1:]
    rows = _rows(first, width)
    inside = rows < len(nxt)
    at = rows.clamp(max=len(nxt) - 1)
    agree = (tokens[at + 1] == nxt[at]) & inside
    before = torch.cat([torch.ones_like(agree[:, :1]), agree[:, :-1]], dim=1)
    return nxt[at], inside & torch.cumprod(before.long(), dim=1).bool()


def _weighted(
    states: Tensor,
    labels: Tensor,
    valid: Tensor,
    rows: Tensor,
    seq,
    head: Tensor,
    teacher: Teacher | None,
    decay: float = DECAY,
) -> Tensor:
    """The decayed, masked mean loss of drafts [C, width] (states [C, width, hidden]; draft j weighs
    exp(-(j - 1) / DECAY) where it counts). The head runs only on drafts that count: the others weigh nothing, and on
    teacher-forced text they are a large share of each block's drafts."""
    w = torch.exp(-torch.arange(labels.shape[1]) / decay)[None] * valid
    keep = valid.reshape(-1)
    logits = states.reshape(-1, states.shape[-1])[keep] @ head.T
    ce = _token_loss(logits, labels.reshape(-1)[keep], seq, rows.reshape(-1)[keep], head, teacher)
    return (ce * w.reshape(-1)[keep]).sum() / w.sum().clamp(min=1)


def dflash2_loss(
    net,
    seq,
    embed,
    head,
    anchors: Tensor,
    teacher: Teacher | None = None,
    width: int | None = None,
    decay: float = DECAY,
) -> tuple[Tensor, int]:
    """Weighted cross-entropy of block rows 1..width (default all, S - 1) against the target's next tokens (or, with
    a teacher, its distributions); returns (loss, rows)."""
    width = width or net.cfg.block_size - 1
    states = _dflash2_states(net, seq, embed, anchors)[:, 1 : width + 1]
    labels, valid = _chain_labels(seq, anchors, width)
    return _weighted(states, labels, valid, _rows(anchors, width), seq, head, teacher, decay), int(valid.sum())


def answer_anchors(seq, width: int) -> Tensor:
    """Anchors with `width` labels after them, inside the answer."""
    return torch.arange(seq["start"], len(seq["tokens"]) - width)


@torch.no_grad()
def dflash2_accepts(net, seq, embed, head) -> Tensor:
    """[anchors, S - 1] bool: draft j accepted (it and every draft before it equal the target's tokens)."""
    width = net.cfg.block_size - 1
    anchors = answer_anchors(seq, width)
    if len(anchors) == 0:
        return torch.zeros(0, width, dtype=torch.bool)
    drafts = (_dflash2_states(net, seq, embed, anchors)[:, 1:] @ head.T).argmax(-1)
    labels, _ = _chain_labels(seq, anchors, width)
    return torch.cumprod((drafts == labels).long(), dim=1).bool()


def _mtp_chain(net, seq, embed, depth: int, chains: Tensor) -> Tensor:
    """Normed states [depth, C, hidden] (the head's inputs) of chains starting at pair t = chains: the pair
    (h_t, token t+1) drafts t+2, its state with token t+2 drafts t+3, ... . As in the backend, the pair at
    position u is (the state of row u - 1, token u): at u = 0 the state is zero (a slot's carry starts at zero and
    the window keeps that pair); a chain's first step sees the `window` pairs before it and itself, later steps
    also the chain's own earlier steps (tests/drafters/test_train_serve.py holds the two to each other)."""
    tokens = seq["tokens"].long()
    hidden = seq["taps"][:, -1].float()  # the last layer's output = out.hidden
    prev = torch.cat([hidden.new_zeros(1, hidden.shape[1]), hidden])  # [L]: the state before each token
    last = len(tokens) - 1
    u = torch.arange(len(tokens))
    rows = chains + 1
    x = net.fuse(prev[: len(tokens)], embed[tokens])
    back = u[:, None] - u[None]
    seen = (back >= 0) & (back <= net.cfg.window)  # itself and the window before it
    empty = x.new_zeros(1, 0, net.kv_dim)
    state, k, v = net.step(x[None], u[None], empty, empty, seen[None, :, :0], seen)
    keys, values, masks = [k], [v], [seen]
    outs = [net.head_in(state[0, rows])]
    eye = torch.eye(len(u), dtype=torch.bool)
    for d in range(2, depth + 1):
        x = net.fuse(state[0], embed[tokens[(u + d - 1).clamp(max=last)]])
        ext_k, ext_v = torch.cat(keys, dim=1), torch.cat(values, dim=1)
        state, k, v = net.step(x[None], (u + d - 1)[None], ext_k, ext_v, torch.cat(masks, dim=1)[None], eye)
        keys.append(k)
        values.append(v)
        masks.append(eye)
        outs.append(net.head_in(state[0, rows]))
    return torch.stack(outs)


def _mtp_labels(seq, chains: Tensor, depth: int) -> tuple[Tensor, Tensor]:
    """[depth, C]: the chain at pair t drafts the tokens after rows t + 1, t + 2, ..."""
    labels, valid = _chain_labels(seq, chains + 1, depth)
    return labels.T, valid.T


def mtp_chains(seq) -> Tensor:
    """Chains that start at the pair before an answer token (the state that drafted the anchor)."""
    return torch.arange(max(seq["start"] - 1, 0), len(seq["tokens"]) - 2)


def mtp_loss(
    net,
    seq,
    embed,
    head,
    depth: int,
    teacher: Teacher | None = None,
    decay: float = DECAY,
    chains: Tensor | None = None,
) -> tuple[Tensor, int]:
    """Weighted loss of `depth` chained drafts from every pair before an answer token (or from `chains`)."""
    chains = mtp_chains(seq) if chains is None else chains
    states = _mtp_chain(net, seq, embed, depth, chains).transpose(0, 1)  # [C, depth, hidden]
    labels, valid = _chain_labels(seq, chains + 1, depth)
    return _weighted(states, labels, valid, _rows(chains + 1, depth), seq, head, teacher, decay), int(valid.sum())


@torch.no_grad()
def mtp_accepts(net, seq, embed, head, depth: int) -> Tensor:
    chains = mtp_chains(seq)
    chains = chains[chains + depth + 1 < len(seq["tokens"])]
    if len(chains) == 0:
        return torch.zeros(0, depth, dtype=torch.bool)
    drafts = (_mtp_chain(net, seq, embed, depth, chains) @ head.T).argmax(-1)
    labels, _ = _mtp_labels(seq, chains, depth)
    return torch.cumprod((drafts == labels).long(), dim=0).bool().T
