"""GemmaTarget: the Gemma 3 text model (`gemma3_text`, or a `gemma3` wrapper's language model) as a Target.

Owns: Gemma's tensors (`read_weights`: four RMSNorms a layer, each a zero-centred (1 + w) scale, q/k norms, a
GELU-tanh gated MLP, the output head tied to the embedding) and its decoder layer, run op by op:
  x = embed[tokens] * sqrt(hidden)  (the scale rounded to the compute dtype, as transformers does)
  h = post_attention_norm(attention(input_norm(x)));  x += h
  h = post_feedforward_norm(mlp(pre_feedforward_norm(x)));  x += h
  logits = soft-cap(final_norm(x) @ embed.T)  (the cap only where configured)
Local layers attend over the last `cfg.local_window` positions with RoPE base `cfg.rope_local_theta`, global ones
over every position with `cfg.rope_theta` (and linear scaling `cfg.rope_factor`). Everything else of the Target
contract is inherited: the state (every layer a KV cache), `commit` (no recurrent layers: nothing to copy), the
PassOutput's hidden rows and taps. Gemma's layers never take the one-call C layer (kernels/dense_layer.py); their
linears still read the packed bf16 form where the build has it.
Not here: the attention and MLP arithmetic (gemma_attention.py), parsing config.json (gemma_config.py).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from speclane.kernels.rowwise import add_rms_norm
from speclane.stages.contract.errors import ArtifactError, ContractError
from speclane.stages.models.config import ModelConfig
from speclane.stages.models.gemma_attention import gelu_mlp, gemma_attention, rope_tables, softcap
from speclane.stages.models.layout import PassLayout
from speclane.stages.models.ops import linear
from speclane.stages.models.state import PassOutput, RowBatch, TargetState
from speclane.stages.models.target import Target
from speclane.stages.models.weights import AttentionWeights, MlpWeights, ModelWeights, _attention, _mlp, _Source

Tensor = torch.Tensor

# Where a `gemma3` wrapper's language model lives: transformers saves (and the hub holds) the first; the second
# is transformers' in-memory layout, which some tools write.
_WRAPPED = ("language_model.model.", "model.language_model.")


@attrs.frozen
class GemmaLayerWeights:
    input_norm: Tensor  # [hidden] fp32 scale, (1 + w)
    post_norm: Tensor  # the post-attention norm
    pre_ffn_norm: Tensor
    post_ffn_norm: Tensor
    mixer: AttentionWeights  # q/k norms set, no output gate
    mlp: MlpWeights  # gate | up, GELU-tanh


def read_gemma_weights(path: str | Path, cfg: ModelConfig, dtype: torch.dtype, device) -> ModelWeights:
    """Every tensor of a Gemma 3 text model, shapes checked against `cfg` (ArtifactError naming the tensor)."""
    src = _Source(Path(path), dtype, device)
    p, h = cfg.tensor_prefix, cfg.hidden_size
    if p in _WRAPPED and not src.has(f"{p}embed_tokens.weight"):
        p = next((q for q in _WRAPPED if src.has(f"{q}embed_tokens.weight")), p)
    embed = src.get(f"{p}embed_tokens.weight", (cfg.vocab_size, h))
    if cfg.tie_word_embeddings:
        lm_head = embed
    else:
        lm_head = src.get(
            "language_model.lm_head.weight" if p == _WRAPPED[0] else "lm_head.weight", (cfg.vocab_size, h)
        )
    layers = []
    for i in range(cfg.num_layers):
        lp = f"{p}layers.{i}."

        def norm(name: str) -> Tensor:
            return src.scale(f"{lp}{name}.weight", (h,), zero_centred=True)

        layers.append(
            GemmaLayerWeights(
                input_norm=norm("input_layernorm"),
                post_norm=norm("post_attention_layernorm"),
                pre_ffn_norm=norm("pre_feedforward_layernorm"),
                post_ffn_norm=norm("post_feedforward_layernorm"),
                mixer=_attention(src, cfg, lp + "self_attn."),
                mlp=_mlp(src, lp + "mlp.", h, cfg.intermediate_size, False),
            )
        )
    final_norm = src.scale(f"{p}norm.weight", (h,), zero_centred=True)
    return ModelWeights(embed=embed, layers=tuple(layers), final_norm=final_norm, lm_head=lm_head)


class GemmaTarget(Target):
    """A Target whose decoder layer is Gemma 3's; built by `Target.load` for a `gemma3_text` config."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, dtype, device, hidden_taps, pack=True, experts=None):
        if experts is not None:
            raise ArtifactError("a Gemma 3 model has no routed experts: --expert-cache does not apply")
        super().__init__(cfg, weights, dtype, device, hidden_taps, pack=pack)
        self._dense = (None,) * cfg.num_layers  # four norms a layer: never the one-call C layer
        self._embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=dtype, device=self.device)

    @staticmethod
    def read_weights(path, cfg: ModelConfig, dtype, device, routed_experts: bool = True) -> ModelWeights:
        return read_gemma_weights(path, cfg, dtype, device)

    @torch.no_grad()
    def forward(
        self,
        batch: RowBatch,
        state: TargetState,
        record: str = "rows",
        logits: str = "all",
        layout: PassLayout | None = None,
    ) -> PassOutput:
        """Target.forward's contract (docs/architecture.md) with Gemma's layer; no layer keeps a record."""
        if record not in ("rows", "last"):
            raise ContractError(f"Target.forward: record must be 'rows' or 'last', got {record!r}")
        cfg, w, eps = self.cfg, self.weights, self.cfg.rms_norm_eps
        lay = layout or PassLayout.build(batch, state.max_len, self.key_capacity(state))
        ropes = {
            False: rope_tables(batch.positions, cfg.head_dim, cfg.rope_theta, cfg.rope_factor),
            True: rope_tables(batch.positions, cfg.head_dim, cfg.rope_local_theta),
        }
        x = w.embed[batch.tokens] * self._embed_scale  # [rows, hidden], ours: updated in place
        taps = {}
        for i, (lw, cache) in enumerate(zip(w.layers, state.layers)):
            local = cfg.local_layers[i]
            h = add_rms_norm(x, None, lw.input_norm, eps)
            h = gemma_attention(h, lw.mixer, cfg, cache, lay, *ropes[local], cfg.local_window if local else 0)
            h = add_rms_norm(h, None, lw.post_norm, eps)
            h = add_rms_norm(x, h, lw.pre_ffn_norm, eps)
            h = add_rms_norm(gelu_mlp(h, lw.mlp), None, lw.post_ffn_norm, eps)
            add_rms_norm(x, h, None, eps)
            if i in self.hidden_taps:
                taps[i] = x.clone()
        normed = add_rms_norm(x, None, w.final_norm, eps)
        head_in = normed if logits == "all" else normed.index_select(0, batch.cu_rows[1:] - 1)
        out = linear(head_in, w.lm_head if w.head is None else w.head, out_dtype=torch.float32)
        if cfg.final_softcap:
            out = softcap(out, cfg.final_softcap)
        tap = (
            torch.stack([taps[i] for i in self.hidden_taps], dim=1) if taps else x.new_zeros(x.shape[0], 0, x.shape[1])
        )
        return PassOutput(logits=out, hidden=x, taps=tap, records=(None,) * cfg.num_layers, record=record, experts=None)
