"""accept: per lane the longest run of drafts the target itself would choose, plus the target's next token.

One kernel, `speclane.kernels.accept`, for every drafter. A deterministic drafter (no `draft_probs`, a one-hot q) takes
its sample-and-compare rule (exact: with a one-hot q, rejection sampling reduces to it): draw the target's token at
every row (argmax, or inverse-CDF sampling of p after temperature, top-k and top-p) and accept drafts while they equal
it; the first mismatch is itself the residual sample. A drafter that samples its drafts hands its q, and the kernel runs
rejection sampling (min(1, p/q), residual max(p - q, 0)). The statistics tests (tests/kernels/test_accept_stats.py)
cover both rules as they run here.

Uniforms are keyed by (request seed, output position), not drawn from a stream: the token at output position t
sees the same uniform whatever the load, the row budget or the drafts, so a seeded request gives the same
text with speculation on or off. Nothing here leaves the device except the host-made uniforms going in.

Where target_pass hands each row's own token instead of logits (`tokens`: its fused head, a round of a deterministic
drafter whose lanes ask for no top-k, top-p or logprobs), the same rule runs on those tokens (`accept_tokens`):
they are the draws it would make from the logits.

For the lanes whose request asks for `logprobs`, the target's own log-probabilities of each committed token are
read here, where the logits are: committed token j of a lane was chosen at the lane's logit row j (the draft it
accepted, the residual or the bonus), and the log_softmax of that row's raw float32 logits (before temperature,
top-k and top-p) is reported, with its `top_logprobs` most likely tokens. A round where no lane asks computes none.
"""

from __future__ import annotations

import attrs
import torch

from speclane.kernels.accept import accept, accept_tokens
from speclane.stages.contract.errors import ContractError
from speclane.stages.contract.events import RowLogprobs
from speclane.stages.contract.lanes import Lane
from speclane.stages.contract.ports import Port
from speclane.stages.contract.registry import Stage, register

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform_at(seed: int, position: int, stream: int) -> float:
    """A uniform in [0, 1) for output `position` of the request seeded `seed`; stream 0 samples, 1 accepts."""
    return (_mix(_mix(seed) ^ (position * 2 + stream)) >> 40) / float(1 << 24)


def _uniforms(lanes, width: int, stream: int, device) -> torch.Tensor:
    return (
        torch.tensor(
            [[uniform_at(l.seed, len(l.out_ids) + j, stream) for j in range(width)] for l in lanes], dtype=torch.float32
        )
        .reshape(len(lanes), width)
        .to(device)
    )


def _params(lanes, device):
    t = torch.tensor([l.request.temperature for l in lanes], dtype=torch.float32, device=device)
    k = torch.tensor([l.request.top_k for l in lanes], dtype=torch.int64, device=device)
    p = torch.tensor([l.request.top_p for l in lanes], dtype=torch.float32, device=device)
    return t, k, p


@register
@attrs.frozen
class Accept(Stage):
    kind = "accept"
    inputs = (
        Port("logits", "float32", ("logit_rows", "vocab"), "device", doc="[0, vocab] where tokens come instead"),
        Port("tokens", "int64", ("token_rows",), "device", optional=True, doc="rows' own tokens (target_pass)"),
        Port("cu_logits", "int64", ("lanes+1",), "device"),
        Port("drafts", "int64", ("lanes", "k"), "device"),
        Port("draft_len", "int", ("lanes",), "host"),
        Port("draft_probs", "float32", ("lanes", "k", "vocab"), "device", optional=True),
        Port("lane_view", "record", ("lanes",), "host", record=Lane),
        Port("final", "bool", ("lanes",), "host", optional=True, doc="prefill: lanes whose prompt is done"),
    )
    outputs = (
        Port("committed", "int64", ("lanes", "k1"), "device", doc="-1 past committed_len"),
        Port("committed_len", "int64", ("lanes",), "device", doc="1 to k + 1 (0: nothing to commit)"),
        Port("logprobs", "record", record=RowLogprobs, optional=True, doc="None unless a lane asks for them"),
    )

    def run(self, logits, cu_logits, drafts, draft_len, lane_view, draft_probs=None, final=None, tokens=None):
        if tokens is not None:
            committed, committed_len = self._from_tokens(tokens, cu_logits, drafts, draft_len, lane_view, draft_probs)
            return {"committed": committed, "committed_len": _final(committed_len, final), "logprobs": None}
        dev = logits.device
        k = drafts.shape[1]
        t, tk, tp = _params(lane_view, dev)
        # greedy lanes read no uniform: a round of greedy lanes hashes none
        if any(lane.request.temperature > 0 for lane in lane_view):
            u_sample = _uniforms(lane_view, k + 1, 0, dev)
        else:
            u_sample = torch.zeros(len(lane_view), k + 1, dtype=torch.float32, device=dev)
        u_accept = _uniforms(lane_view, k, 1, dev) if draft_probs is not None else None
        committed, committed_len, _ = accept(
            logits,
            cu_logits,
            drafts,
            torch.tensor(draft_len, dtype=torch.int64).to(dev),
            draft_probs,
            t,
            tk,
            tp,
            u_accept,
            u_sample,
        )
        return {
            "committed": committed,
            "committed_len": _final(committed_len, final),
            "logprobs": _logprobs(logits, cu_logits, committed, lane_view),
        }

    @staticmethod
    def _from_tokens(tokens, cu_logits, drafts, draft_len, lane_view, draft_probs):
        if draft_probs is not None or any(lane.request.logprobs for lane in lane_view):
            raise ContractError(
                "accept: rows' tokens serve only a deterministic drafter's round whose lanes ask for no logprobs; "
                "this round needs the logits (target_pass must hand them)"
            )
        lens = torch.tensor(draft_len, dtype=torch.int64).to(tokens.device)
        committed, committed_len, _ = accept_tokens(tokens, cu_logits, drafts, lens)
        return committed, committed_len


def _final(committed_len, final):
    """Prefill: a lane whose prompt is not done commits nothing."""
    if final is not None and not all(final):
        return committed_len * torch.tensor(final, dtype=torch.int64).to(committed_len.device)
    return committed_len


def _logprobs(logits, cu_logits, committed, lane_view) -> RowLogprobs | None:
    """Log-probabilities of every lane's committed run (zeros for the lanes that do not ask); None when none asks."""
    asking = [i for i, lane in enumerate(lane_view) if lane.request.logprobs]
    if not asking:
        return None
    dev, (lanes, k1) = logits.device, committed.shape
    top = max(lane_view[i].request.top_logprobs for i in asking)
    which = torch.tensor(asking, dtype=torch.int64, device=dev)
    rows = (cu_logits[:-1][which, None] + torch.arange(k1, device=dev)).clamp(max=logits.shape[0] - 1)  # [m, k1]
    lp = torch.log_softmax(logits[rows].float(), dim=-1)  # [m, k1, vocab]
    chosen = torch.zeros(lanes, k1, dtype=torch.float32, device=dev)
    chosen[which] = lp.gather(2, committed[which].clamp(min=0)[..., None])[..., 0]
    top_values, top_ids = lp.topk(top, dim=-1)  # [m, k1, top]
    ids = torch.zeros(lanes, k1, top, dtype=torch.int64, device=dev)
    values = torch.zeros(lanes, k1, top, dtype=torch.float32, device=dev)
    ids[which], values[which] = top_ids, top_values
    return RowLogprobs(chosen=chosen, top_ids=ids, top_values=values)
