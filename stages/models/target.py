"""Target: the model under speculation. Loads an artifact, allocates per-slot state, runs passes, commits runs.

Owns the contract of docs/architecture.md ("The target model"): `Target.load`, `new_state`, `forward` (writes KV
rows and returns logits, hidden, taps and Gated DeltaNet records without moving any slot's committed state) and
`commit` (copies the committed row's record into each recurrent slot, device-side only). A slot's KV length is not
kept here: it is the lane's (host), given to each pass as `RowBatch.lane_start`.
Not here: the per-layer math (attention.py, gated_deltanet.py, moe.py, ops.py), accept rules, tokenizers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from speclane.kernels.dense_layer import dense_layer
from speclane.kernels.fused_head import fuses, head_tokens, tokens_from_logits
from speclane.kernels.kv_commit import commit_records
from speclane.kernels.packed import PackedWeight
from speclane.kernels.rowwise import add_rms_norm
from speclane.stages.contract.errors import ConfigError, ContractError
from speclane.stages.models.attention import attention
from speclane.stages.models.config import FULL, ModelConfig
from speclane.stages.models.dense import dense_layers, pack_dense
from speclane.stages.models.expert_cache import ExpertCache, check_budget
from speclane.stages.models.expert_slots import ExpertCounts
from speclane.stages.models.gated_deltanet import gated_deltanet
from speclane.stages.models.layout import PassLayout
from speclane.stages.models.moe import moe
from speclane.stages.models.moe_files import mapped_cache
from speclane.stages.models.ops import DECODE_ROUTE_MAX_ROWS, linear, mlp, rope_tables
from speclane.stages.models.quantize import quantize_weights
from speclane.stages.models.state import KEY_BLOCK, AttnCache, GdnCache, PassOutput, RowBatch, TargetState
from speclane.stages.models.weights import ModelWeights, load_weights

Tensor = torch.Tensor


def _gemma() -> type:
    from speclane.stages.models.gemma import GemmaTarget

    return GemmaTarget


# Families whose decoder layer is not the one below run their own subclass, found by model_type at load.
OWN_LAYERS = {"gemma3_text": _gemma}


class Target:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        dtype: torch.dtype,
        device: torch.device,
        hidden_taps: tuple[int, ...],
        pack: bool = True,
        experts: ExpertCache | None = None,
    ):
        self.cfg = cfg
        self.tap(hidden_taps)
        self.device = torch.device(device)
        # pack=False keeps the row-major layout where the packed one would serve (a benchmark's side-by-side)
        self.cfg, self.weights, self.dtype = (
            cfg,
            pack_dense(cfg, weights, dtype, self.device) if pack else weights,
            dtype,
        )
        self._dense = dense_layers(cfg, self.weights, dtype, self.device)
        self.artifact_dir: Path | None = None  # set by `load`: where companion files (dflash2, mtp) are looked up
        self.experts = experts  # the routed experts' fast tier (expert_cache.py); None: every expert resident

    def tap(self, layers: tuple[int, ...]) -> None:
        """Read the outputs of decoder `layers` (0-based) as every pass's `PassOutput.taps`, in this order: what
        a drafter declares it reads (its `taps`), applied by the engine once, when it is built."""
        bad = [i for i in layers if not 0 <= i < self.cfg.num_layers]
        if bad:
            raise ContractError(f"hidden_taps {bad} out of range: the model has {self.cfg.num_layers} layers")
        self.hidden_taps = tuple(layers)

    @classmethod
    def load(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.bfloat16,
        device="cpu",
        hidden_taps: tuple[int, ...] = (),
        quant: str = "none",
        pack: bool = True,
        expert_cache_bytes: int | None = None,
    ) -> Target:
        """Read an HF-style directory (config.json + *.safetensors); weights are kept in `dtype`, the linear
        layers' as int8 with `quant="int8"` (stages/models/quantize.py). `expert_cache_bytes`: the fast tier's
        budget for routed experts, which then stay in the files, read in place on a miss (on a GPU, in pinned host
        memory; expert_cache.py; a dense model or a budget below one expert is refused)."""
        cfg = ModelConfig.load(path)
        if cls is Target and cfg.model_type in OWN_LAYERS:
            cls = OWN_LAYERS[cfg.model_type]()
        if expert_cache_bytes is not None:  # refused before the weights load
            check_budget(cfg, expert_cache_bytes, dtype, torch.device(device))
        routed = expert_cache_bytes is None  # with a cache the routed experts are read in place, never loaded
        weights = quantize_weights(cls.read_weights(path, cfg, dtype, device, routed_experts=routed), quant)
        experts = None if routed else mapped_cache(path, cfg, dtype, expert_cache_bytes, device)
        target = cls(cfg, weights, dtype, device, tuple(hidden_taps), pack=pack, experts=experts)
        target.artifact_dir = Path(path)
        return target

    @staticmethod
    def read_weights(path: str | Path, cfg: ModelConfig, dtype, device, routed_experts: bool = True) -> ModelWeights:
        """The artifact's tensors in the records this class's layers read (weights.py)."""
        return load_weights(path, cfg, dtype, device, routed_experts=routed_experts)

    def new_state(self, slots: int, max_len: int) -> TargetState:
        """Zeroed caches for `slots` lanes of up to `max_len` positions each (KV rounded up to whole key blocks).
        A model with a sliding window refuses a `max_len` past it: attention here reads every key of a lane, which
        equals the window's attention only while a lane holds no more positions than the window."""
        cfg, dev = self.cfg, self.device
        if cfg.sliding_window and max_len > cfg.sliding_window:
            raise ConfigError(
                f"--max-len {max_len}: this {cfg.model_type} model attends over a sliding window of "
                f"{cfg.sliding_window} positions, which speclane does not apply past the window; use --max-len "
                f"{cfg.sliding_window} or less (prompt + output)"
            )
        cap = -(-max_len // KEY_BLOCK) * KEY_BLOCK
        layers = []
        for kind in cfg.layer_types:
            if kind == FULL:
                # Zeros, not empty: masked keys still meet their values with weight 0, and 0 * NaN would be NaN.
                shape = (slots, cfg.num_kv_heads, cap, cfg.head_dim)
                layers.append(
                    AttnCache(
                        k=torch.zeros(shape, dtype=self.dtype, device=dev),
                        v=torch.zeros(shape, dtype=self.dtype, device=dev),
                    )
                )
            else:
                layers.append(
                    GdnCache(
                        conv=torch.zeros(
                            slots, cfg.gdn_conv_dim, cfg.gdn_conv_kernel - 1, dtype=self.dtype, device=dev
                        ),
                        recurrent=torch.zeros(
                            slots,
                            cfg.gdn_value_heads,
                            cfg.gdn_key_dim,
                            cfg.gdn_value_dim,
                            dtype=torch.float32,
                            device=dev,
                        ),
                    )
                )
        return TargetState(layers=tuple(layers), max_len=max_len)

    @torch.no_grad()
    def forward(
        self,
        batch: RowBatch,
        state: TargetState,
        record: str = "rows",
        logits: str = "all",
        layout: PassLayout | None = None,
    ) -> PassOutput:
        """All lanes' rows through every layer in one pass; see docs/architecture.md for what is written where.
        `logits="last"`: only each lane's last row goes through the output head (prefill samples nothing else);
        `"none"`: no row does, `PassOutput.logits` is [0, vocab] (the round takes its tokens from `head_tokens`).
        `layout`: the batch's PassLayout built by the caller (CUDA graph capture, bench/cuda_graphs.py: built
        outside the capture, refilled in place before each replay); otherwise built here from the host lengths.
        Nothing in here reads a device value on the host."""
        if record not in ("rows", "last"):
            raise ContractError(f"Target.forward: record must be 'rows' or 'last', got {record!r}")
        if logits not in ("all", "last", "none"):
            raise ContractError(f"Target.forward: logits must be 'all', 'last' or 'none', got {logits!r}")
        cfg, w = self.cfg, self.weights
        lay = layout or PassLayout.build(batch, state.max_len, self.key_capacity(state))
        cos, sin = rope_tables(batch.positions, cfg.rotary_dim, cfg.rope_theta)
        eps = cfg.rms_norm_eps
        x = w.embed[batch.tokens]  # [rows, hidden], ours: updated in place
        records, taps = [], {}
        # past the decode route a wide chunk goes op by op: its linears are GEMMs that read each weight once
        fused = self._dense if lay.rows <= DECODE_ROUTE_MAX_ROWS else (None,) * len(self._dense)
        counted = self.experts.counts() if self.experts is not None else None
        for i, (lw, cache) in enumerate(zip(w.layers, state.layers)):
            dense = fused[i]
            if dense is not None:  # the whole layer in one call, bit-identical to the op-by-op route below
                dense_layer(dense, x, cos, sin, cache.k, cache.v, lay.write_slot, lay.write_pos, lay.row_keys)
                records.append(None)
            else:
                h = add_rms_norm(x, None, lw.input_norm, eps)
                if cfg.layer_types[i] == FULL:
                    h, rec = attention(h, lw.mixer, cfg, cache, lay, cos, sin), None
                else:
                    h, rec = gated_deltanet(h, lw.mixer, cfg, cache, lay, record)
                records.append(rec)
                h = add_rms_norm(x, h, lw.post_norm, eps)
                ffn = moe(h, lw.mlp, cfg, self.experts, i) if cfg.moe_layers[i] else mlp(h, lw.mlp)
                add_rms_norm(x, ffn, None, eps)
            if i in self.hidden_taps:
                taps[i] = x.clone()
        if logits == "none":
            logits = x.new_zeros(0, cfg.vocab_size, dtype=torch.float32)
        else:
            normed = add_rms_norm(x, None, w.final_norm, eps)
            head_in = normed if logits == "all" else normed.index_select(0, batch.cu_rows[1:] - 1)
            logits = linear(head_in, w.lm_head if w.head is None else w.head, out_dtype=torch.float32)
        tap = (
            torch.stack([taps[i] for i in self.hidden_taps], dim=1) if taps else x.new_zeros(x.shape[0], 0, x.shape[1])
        )
        return PassOutput(
            logits=logits,
            hidden=x,
            taps=tap,
            records=tuple(records),
            record=record,
            experts=None if counted is None else self.experts.counts().since(counted),
        )

    def fuses_head(self, rows: int) -> bool:
        """Whether `head_tokens` on a pass of `rows` rows runs the fused C kernel (kernels/fused_head.py), which
        writes no logits. Not for a subclass with its own `forward` (its own head arithmetic, such as a soft-cap),
        nor past the decode route with a row-major head (the logits `forward` writes come from a GEMM there)."""
        head = self.weights.lm_head if self.weights.head is None else self.weights.head
        probe = torch.empty(0, self.cfg.hidden_size, dtype=self.dtype, device=self.device)
        return (
            type(self).forward is Target.forward
            and (isinstance(head, PackedWeight) or rows <= DECODE_ROUTE_MAX_ROWS)
            and fuses(probe, head)
        )

    @torch.no_grad()
    def head_tokens(self, hidden: Tensor, temperature: Tensor, u: Tensor) -> Tensor:
        """int64 [rows]: each row's own token from `hidden` [rows, hidden] (a pass's `PassOutput.hidden`): the
        argmax of its logits where temperature[r] is 0, else the inverse-CDF draw at u[r] of softmax(logits /
        temperature[r]) (top-k and top-p off): the tokens accept would draw from `forward`'s logits of those rows.
        The fused kernel where it serves (`fuses_head`), else the logits written and read (kernels/fused_head.py)."""
        if type(self).forward is not Target.forward:
            raise ContractError(f"{type(self).__name__} makes its logits its own way: read them from forward")
        w = self.weights
        normed = add_rms_norm(hidden, None, w.final_norm, self.cfg.rms_norm_eps)
        head = w.lm_head if w.head is None else w.head
        if isinstance(head, PackedWeight) or len(normed) <= DECODE_ROUTE_MAX_ROWS:
            return head_tokens(normed, head, temperature, u)  # the C kernel where it serves, else its twin
        return tokens_from_logits(linear(normed, head, out_dtype=torch.float32), temperature, u)

    @staticmethod
    def key_capacity(state: TargetState) -> int:
        return -(-state.max_len // KEY_BLOCK) * KEY_BLOCK

    @property
    def config(self) -> ModelConfig:
        return self.cfg

    def expert_stats(self) -> ExpertCounts | None:
        """The expert cache's running counters since load (every pass's `PassOutput.experts` summed, with the
        slots and their bytes); None when every routed expert is resident (no cache, or a dense model)."""
        return None if self.experts is None else self.experts.counts()

    @torch.no_grad()
    def commit(self, state: TargetState, batch: RowBatch, committed_len: Tensor, out: PassOutput) -> None:
        """Each recurrent slot takes the record of its lane's last committed row (or the lane's record under "last"):
        the recurrent_replay stage. A lane with committed_len 0 is left untouched. No host sync. The keys and values
        need no commit: `forward` wrote them, and the caller's KV length (the lane's) says how many count."""
        if out.record == "rows":
            cu, n = batch.cu_rows, committed_len
        else:  # one record a lane: lane l's is row l, taken when the lane committed anything
            cu = torch.arange(len(batch.lane_rows) + 1, dtype=torch.int64, device=committed_len.device)
            n = (committed_len > 0).to(torch.int64)
        for cache, rec in zip(state.layers, out.records):
            if rec is not None:
                commit_records(cache.conv, rec.conv.to(cache.conv.dtype), cu, n, batch.slots)
                commit_records(cache.recurrent, rec.recurrent, cu, n, batch.slots)
