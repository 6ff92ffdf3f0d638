"""target_pass: every lane's rows (anchor + drafts, or a prompt chunk) through all target layers in one pass.

Attention writes keys and values for every row; Gated DeltaNet layers record per row what they need to
restore (`record="rows"`), or only each lane's final state (`record="last"`, prefill). Logits come out in
float32 for every row, or only for each lane's last row when that is all the round samples from (prefill).

`logits="tokens"`: a round that needs nothing of a row but its own token (the draw accept makes at every row for a
deterministic drafter: `draft_probs` absent, no lane with top-k, top-p or logprobs) takes every row's token from the
fused output head (`Target.head_tokens`), which writes no [rows, vocab] logits (`logits` is then [0, vocab]): the
tokens accept would draw from the logits (greedy bit for bit; a sampled one can differ only at a float32 near-tie of
the CDF). Any other round, or a target or machine the fused kernel does not serve, gets every row's logits as under
"all". Uniforms are those accept would use (stages/accept.py: keyed by request seed and output position).
"""

from __future__ import annotations

import itertools

import attrs
import torch

from speclane.stages.accept import uniform_at
from speclane.stages.contract.lanes import Lane
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register
from speclane.stages.models.state import PassOutput, RowBatch, TargetState


def _one_of(*choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(choices)}, got '{value}'")

    return check


def _draws_only(lane_view, draft_probs, vocab: int) -> bool:
    """Whether accept needs of every row only its own token: a deterministic drafter, no top-k/top-p, no logprobs."""
    return (
        lane_view is not None
        and draft_probs is None
        and all(
            not r.logprobs and (r.top_k <= 0 or r.top_k >= vocab) and r.top_p >= 1.0
            for r in (lane.request for lane in lane_view)
        )
    )


def row_draws(lane_view, lane_rows: tuple[int, ...], dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(temperature, u) float32 [rows] on `dev`: each row's lane temperature, and for a sampling lane the uniform
    accept draws row j of the lane (of its `lane_rows`) with (output position len(out_ids) + j, stream 0); 0 for
    greedy."""
    rows = sum(lane_rows)
    temps = [lane.request.temperature for lane in lane_view]
    if not any(t > 0 for t in temps):  # a greedy round hashes no uniform
        return torch.zeros(rows, dtype=torch.float32, device=dev), torch.zeros(rows, dtype=torch.float32, device=dev)
    t, u = [], []
    for lane, temp, n in zip(lane_view, temps, lane_rows):
        t += [temp] * n
        u += [uniform_at(lane.seed, len(lane.out_ids) + j, 0) if temp > 0 else 0.0 for j in range(n)]
    return torch.tensor(t, dtype=torch.float32).to(dev), torch.tensor(u, dtype=torch.float32).to(dev)


@register
@attrs.frozen
class TargetPass(Stage):
    kind = "target_pass"
    inputs = (
        Port("target", "object", doc="the target model"),
        Port("target_state", "record", doc="KV caches, conv and recurrent state", record=TargetState),
        Port("batch", "record", record=RowBatch),
        Port(
            "lane_view",
            "record",
            ("lanes",),
            "host",
            optional=True,
            record=Lane,
            doc='logits="tokens": the lanes\' sampling settings and seeds',
        ),
        Port(
            "draft_probs",
            "float32",
            ("lanes", "k", "vocab"),
            "device",
            optional=True,
            doc='logits="tokens": present for a drafter that samples, whose rejection sampling reads logits',
        ),
        Port(
            "prompt_rows",
            "int",
            ("lanes",),
            "host",
            optional=True,
            doc="a step's one pass: a prompt chunk's lane (> 0) samples only its last row",
        ),
    )
    outputs = (
        Port(
            "logits",
            "float32",
            ("logit_rows", "vocab"),
            "device",
            doc="every row, each lane's last, or none: [0, vocab]",
        ),
        Port("tokens", "int64", ("token_rows",), "device", optional=True, doc='logits="tokens": rows\' own tokens'),
        Port("cu_logits", "int64", ("lanes+1",), "device", doc="offsets of each lane's logit (or token) rows"),
        Port("pass_out", "record", doc="hidden, taps, recurrent records", record=PassOutput),
    )
    # each row's keys and values go into the KV cache past its lane's committed length: scratch a rerun overwrites
    touches = ("target_state",)
    record: str = attrs.field(default="rows", validator=_one_of("rows", "last"))
    logits: str = attrs.field(default="all", validator=_one_of("all", "last", "tokens"))

    def run(self, target, target_state, batch, lane_view=None, draft_probs=None, prompt_rows=None):
        if prompt_rows is not None and any(prompt_rows):
            return self._with_prompts(target, target_state, batch, lane_view, draft_probs, prompt_rows)
        if (
            self.logits == "tokens"
            and _draws_only(lane_view, draft_probs, target.cfg.vocab_size)
            and getattr(target, "fuses_head", lambda rows: False)(sum(batch.lane_rows))
        ):
            out = target.forward(batch, target_state, record=self.record, logits="none")
            tokens = target.head_tokens(out.hidden, *row_draws(lane_view, batch.lane_rows, batch.cu_rows.device))
            return {"logits": out.logits, "tokens": tokens, "cu_logits": batch.cu_rows, "pass_out": out}
        mode = "last" if self.logits == "last" else "all"
        out = target.forward(batch, target_state, record=self.record, logits=mode)
        if mode == "all":
            cu = batch.cu_rows
        else:
            cu = torch.arange(len(batch.lane_rows) + 1, dtype=torch.int64, device=batch.cu_rows.device)
        return {"logits": out.logits, "tokens": None, "cu_logits": cu, "pass_out": out}

    def _with_prompts(self, target, target_state, batch, lane_view, draft_probs, prompt_rows):
        """A step's one pass: a decoding lane's rows all give a token (or logits), a prompt lane's last row only
        (what it samples when its chunk ends the prompt), so the head reads none of a chunk's other rows where the
        fused head serves; elsewhere every row's logits are made and the sampled rows taken from them."""
        dev = batch.cu_rows.device
        heads = tuple(1 if p else n for n, p in zip(batch.lane_rows, prompt_rows))
        picked = [r for end, h in zip(itertools.accumulate(batch.lane_rows), heads) for r in range(end - h, end)]
        rows = torch.tensor(picked, dtype=torch.int64).to(dev)
        cu = torch.tensor([0, *heads], dtype=torch.int64).cumsum(0).to(dev)
        if (
            self.logits == "tokens"
            and _draws_only(lane_view, draft_probs, target.cfg.vocab_size)
            and getattr(target, "fuses_head", lambda rows: False)(len(picked))
        ):
            out = target.forward(batch, target_state, record=self.record, logits="none")
            tokens = target.head_tokens(out.hidden.index_select(0, rows), *row_draws(lane_view, heads, dev))
            return {"logits": out.logits, "tokens": tokens, "cu_logits": cu, "pass_out": out}
        out = target.forward(batch, target_state, record=self.record, logits="all")
        out = attrs.evolve(out, logits=out.logits.index_select(0, rows))
        return {"logits": out.logits, "tokens": None, "cu_logits": cu, "pass_out": out}
