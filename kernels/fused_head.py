"""The output head's tokens without its logits: each row's greedy argmax, or its inverse-CDF draw from softmax(logits /
temperature), made from logits that never leave the cache.

Owns: `head_tokens` (dispatcher), `head_tokens_cpu` (the C kernel `sl_head_tokens`, kernels/cpu/rows.c), `fuses`
(whether the C kernel serves a head and its rows) and the torch twins: `tokens_from_logits` (the accept rule's
token at every row, read from written logits, as kernels/accept.py draws it for a deterministic drafter) and
`head_tokens_ref` (the head's logits as the decode route writes them, then `tokens_from_logits`). Not here: when a
round may take tokens instead of logits (stages/target_pass.py), the accept rule (kernels/accept.py), uniforms
(stages/accept.py keys them by request seed and output position).

Contract, per row r of x [rows, K] and the head weight [vocab, K]: temperature[r] == 0 gives the first index of the
largest logit; temperature[r] > 0 gives the first token whose cumulative weight exp(l / t - max) passes u[r] times
the total, the draw of `sample_from_uniform_ref` after `process_logits_ref` with top-k and top-p off. Greedy tokens
equal the twin's bit for bit (the C kernel makes every logit with the calls the head's linear makes); a sampled
token can differ only where u[r] * total lies within float32 rounding of a boundary between two tokens, since the
C kernel sums its own exps blockwise in float64 and the twin normalises torch's float32 exps first.
"""

from __future__ import annotations

import torch

from speclane.kernels import cpu_build
from speclane.kernels._triton import check, checks_values
from speclane.kernels.decode_linear import decode_linear
from speclane.kernels.packed import PackedWeight, packed_linear
from speclane.kernels.quant import Int8Weight
from speclane.kernels.sampling import process_logits_ref, row_argmax, sample_from_uniform_ref

Tensor = torch.Tensor
_CODES = {torch.float32: 0, torch.bfloat16: 1}
_I8, _PACKED, _PACKED_I8 = 2, 3, 4


def _check(x: Tensor, temperature: Tensor, u: Tensor) -> None:
    rows = x.shape[0] if x.dim() == 2 else -1
    check(x.dim() == 2 and x.is_floating_point(), f"x must be float [rows, K], got {x.dtype} {tuple(x.shape)}")
    for name, t in (("temperature", temperature), ("u", u)):
        check(
            t.shape == (rows,) and t.dtype == torch.float32,
            f"{name} must be float32 [rows={rows}], got {t.dtype} {tuple(t.shape)}",
        )
        check(t.device == x.device, f"{name} on {t.device}, x on {x.device}")
    if checks_values(x):  # value ranges: host reads every round, so tests only (kernels/_triton.py)
        check(bool((temperature >= 0).all()), "temperature must be >= 0 (0 = greedy)")
        check(bool(((u >= 0) & (u < 1)).all()), "u must be in [0, 1)")


def tokens_from_logits(logits: Tensor, temperature: Tensor, u: Tensor) -> Tensor:
    """int64 [rows]: per row of float32 `logits` [rows, vocab] the argmax (temperature 0) or the inverse-CDF draw at
    u of softmax(logits / temperature), top-k and top-p off: the token kernels/accept.py draws at that row."""
    _check(logits, temperature, u)
    token = row_argmax(logits)
    sampled = torch.nonzero(temperature > 0).flatten()
    if sampled.numel():
        n = sampled.numel()
        off_k, off_p = torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.float32)
        p = process_logits_ref(logits[sampled].float(), temperature[sampled], off_k.to(u.device), off_p.to(u.device))
        token[sampled] = sample_from_uniform_ref(p.contiguous(), u[sampled].contiguous())
    return token


def head_logits(x: Tensor, weight: Tensor | Int8Weight | PackedWeight, bias: Tensor | None = None) -> Tensor:
    """float32 [rows, vocab]: the head's logits as the decode route writes them (packed or row-major)."""
    if isinstance(weight, PackedWeight):
        return packed_linear(x, weight, bias, out_dtype=torch.float32)
    return decode_linear(x, weight, bias, out_dtype=torch.float32)


def head_tokens_ref(
    x: Tensor, weight: Tensor | Int8Weight | PackedWeight, temperature: Tensor, u: Tensor, bias: Tensor | None = None
) -> Tensor:
    """The torch twin: the logits written (`head_logits`), then `tokens_from_logits`."""
    _check(x, temperature, u)
    return tokens_from_logits(head_logits(x, weight, bias), temperature, u)


def _weight_code(x: Tensor, weight) -> tuple[int, Tensor, Tensor | None] | None:
    """(the C side's weight code, its data, its float32 scale or None), or None where the C kernel cannot read it."""
    if isinstance(weight, PackedWeight):
        ok = x.dtype == torch.bfloat16 and weight.inner == x.shape[1] and cpu_build.bf16_kernels()
        q8 = weight.scale is not None
        return (_PACKED_I8 if q8 else _PACKED, weight.data, weight.scale) if ok else None
    w, scale = (weight.q, weight.scale) if isinstance(weight, Int8Weight) else (weight, None)
    if not (w.dim() == 2 and w.shape[1] == x.shape[1] and w.is_contiguous() and w.device.type == "cpu"):
        return None
    if scale is not None:
        ok = w.dtype == torch.int8 and scale.dtype == torch.float32 and scale.is_contiguous()
        return (_I8, w, scale) if ok else None
    return (_CODES[w.dtype], w, None) if w.dtype == x.dtype else None


def _cpu_plan(x: Tensor, weight, bias: Tensor | None):
    """(weight code, data, scale) where the C kernel serves `x`, this weight and bias; else None."""
    if cpu_build.library() is None or x.device.type != "cpu" or x.dim() != 2 or x.dtype not in _CODES:
        return None
    if bias is not None and not (bias.dtype in _CODES and bias.is_contiguous() and bias.shape == (weight.shape[0],)):
        return None
    return _weight_code(x, weight)


def fuses(x: Tensor, weight, bias: Tensor | None = None) -> bool:
    """True when `head_tokens` runs the C kernel for `x` [rows, K] and this weight: float32 or bf16 rows on the CPU,
    the library built, the weight in a form the decode route's C linear reads, the bias (if any) of x's dtype."""
    return _cpu_plan(x, weight, bias) is not None


def _run(x: Tensor, weight, plan, temperature: Tensor, u: Tensor, bias: Tensor | None, threads: int | None) -> Tensor:
    code, data, scale = plan
    x, temperature, u = x.contiguous(), temperature.contiguous(), u.contiguous()
    tokens = torch.empty(x.shape[0], dtype=torch.int64)
    rc = cpu_build.library().sl_head_tokens(
        x.data_ptr(),
        _CODES[x.dtype],
        data.data_ptr(),
        code,
        None if scale is None else scale.data_ptr(),
        None if bias is None else bias.data_ptr(),
        _CODES.get(getattr(bias, "dtype", None), 0),
        x.shape[0],
        x.shape[1],
        weight.shape[0],
        temperature.data_ptr(),
        u.data_ptr(),
        tokens.data_ptr(),
        threads or torch.get_num_threads(),
    )
    check(rc == 0, f"sl_head_tokens failed (code {rc})")
    return tokens


def head_tokens_cpu(
    x: Tensor,
    weight: Tensor | Int8Weight | PackedWeight,
    temperature: Tensor,
    u: Tensor,
    bias: Tensor | None = None,
    threads: int | None = None,
) -> Tensor:
    """The C kernel (needs `fuses(x, weight, bias)`): int64 [rows], no [rows, vocab] logits written."""
    _check(x, temperature, u)
    plan = _cpu_plan(x, weight, bias)
    check(plan is not None, "head_tokens_cpu: the C kernel does not serve these rows and weight (see `fuses`)")
    return _run(x, weight, plan, temperature, u, bias, threads)


def head_tokens(
    x: Tensor, weight: Tensor | Int8Weight | PackedWeight, temperature: Tensor, u: Tensor, bias: Tensor | None = None
) -> Tensor:
    """Dispatcher: the C kernel where `fuses` says it serves, else the torch twin (the same tokens, logits written)."""
    _check(x, temperature, u)
    plan = _cpu_plan(x, weight, bias)
    if plan is None:
        return tokens_from_logits(head_logits(x, weight, bias), temperature, u)
    return _run(x, weight, plan, temperature, u, bias, None)
