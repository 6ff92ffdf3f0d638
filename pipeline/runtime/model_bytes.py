"""What a model's tensors take in memory, counted from its config and its files' headers, never its weights.

Owns: the bytes of every tensor the loaders keep, in the form they keep it: the target's weights (`target_bytes`:
q|k|v and gate|up fused, float32 norm scales, int8 linears with their row scales under `--quant int8`, and the
packed copies the AVX512-BF16 build reads, stages/models/dense.py: a one-call layer's linears in place of their
row-major form, the output head beside it), its per-lane state (`state_bytes`: keys and values rounded up to whole
key blocks, Gated DeltaNet conv and recurrent state), one routed expert in a slot and the routed experts in the files
(`file_expert_bytes`), a model drafter's weights with its drafting copies, proposal head and window
(`drafter_bytes`), what one row of a pass leaves behind (`row_bytes`), and what a load holds only while it runs
(`load_transient`). Each count follows its loader; the tests hold each against the tensors a real load makes. Not
here: which of these a configuration holds and whether they fit (memory_plan.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch
from pydantic import ValidationError

from speclane.kernels import cpu_build
from speclane.kernels.packed import COLS
from speclane.kernels.quant import QUANT_ROWS
from speclane.stages.contract.errors import ArtifactError
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.config import FULL, LINEAR, ModelConfig
from speclane.stages.models.draft_layer import DraftLayer, Linear
from speclane.stages.models.families import canonical_names
from speclane.stages.models.state import KEY_BLOCK

F32, I32, I64 = 4, 4, 8


@attrs.frozen
class Build:
    """How this process would hold a model: compute dtype, device and weight quantization."""

    dtype: torch.dtype
    device: torch.device
    quant: str = "none"

    @property
    def elem(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()

    @property
    def packs(self) -> bool:
        """Whether the loaders pack (kernels/packed.py): bf16 compute on a CPU whose C kernels are the AVX512-BF16
        build; then a bf16 or int8 [out, in] weight with `in` even is packed where its loader packs."""
        return self.device.type == "cpu" and self.dtype == torch.bfloat16 and cpu_build.bf16_kernels()

    def packed(self, out: int, inner: int, int8: bool = False) -> int:
        """A packed [out, inner] weight, bf16 or int8 with its float32 row scales: columns padded to whole blocks of
        32, and the 64 bytes its allocation spares to start on a cache line; 0 where none is made."""
        if not (self.packs and inner % 2 == 0):
            return 0
        return -(-out // COLS) * COLS * inner * (1 if int8 else 2) + 64 + (F32 * out if int8 else 0)

    def linear(self, out: int, inner: int) -> int:
        """A linear weight the quantizer turns to int8 (stages/models/quantize.py), else in the compute dtype."""
        return out * inner + F32 * out if self.quant == "int8" else out * inner * self.elem

    def packed_linear(self, out: int, inner: int) -> int:
        """A linear weight its loader packs where the build packs, else as `linear`."""
        return self.packed(out, inner, self.quant == "int8") or self.linear(out, inner)


def header(path: Path) -> dict[str, tuple[str, list[int], int]]:
    """name -> (dtype, shape, bytes) of every tensor in the artifact's `*.safetensors` files (first file wins)."""
    out: dict[str, tuple[str, list[int], int]] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        for name, info in file_header(file).items():
            out.setdefault(name, info)
    return out


def file_header(file: Path) -> dict[str, tuple[str, list[int], int]]:
    """name -> (dtype, shape, bytes) of one safetensors file, read from its header alone."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            entries = json.loads(f.read(size))
        entries.pop("__metadata__", None)
        return {
            name: (info["dtype"], list(info["shape"]), info["data_offsets"][1] - info["data_offsets"][0])
            for name, info in entries.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"{file}: cannot read its safetensors header ({exc}); check the file") from exc


def _one_call(cfg: ModelConfig, i: int) -> bool:
    """stages/models/dense.py's rule for a layer that runs as one C call (and has its linears packed)."""
    return not (cfg.layer_types[i] != FULL or cfg.moe_layers[i] or cfg.attn_output_gate or cfg.head_dim % 8)


def target_bytes(cfg: ModelConfig, b: Build) -> tuple[int, int]:
    """(dense, routed): what `Target.load` keeps of everything but the routed experts, and the routed experts when
    every one is loaded (stacked, in the compute dtype)."""
    h, e, vocab = cfg.hidden_size, b.elem, cfg.vocab_size
    dense = vocab * h * e * (1 if cfg.tie_word_embeddings else 2) + h * F32  # embedding (+ head), final norm
    # the target's own head beside the row-major one the drafters read: int8, or a packed bf16 copy
    dense += b.packed_linear(vocab, h) if b.quant == "int8" else b.packed(vocab, h)
    nh, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qkv = nh * hd * (2 if cfg.attn_output_gate else 1) + 2 * kvh * hd
    routed = 0
    for i, kind in enumerate(cfg.layer_types):
        dense += 2 * h * F32
        packed = b.packs and _one_call(cfg, i) and all(n % 2 == 0 for n in (h, nh * hd, cfg.intermediate_size))
        lin = b.packed_linear if packed else b.linear
        if kind == FULL:
            bias = (qkv + h * cfg.attention_o_bias) * e * cfg.attention_bias  # Qwen2: q/k/v only
            dense += lin(qkv, h) + lin(h, nh * hd) + bias + 2 * hd * F32 * cfg.qk_norm
        else:
            nv, dv = cfg.gdn_value_heads, cfg.gdn_value_dim
            dense += b.linear(cfg.gdn_conv_dim + nv * dv + 2 * nv, h) + b.linear(h, nv * dv)
            dense += (cfg.gdn_conv_dim * cfg.gdn_conv_kernel + 2 * nv + dv) * F32
        if cfg.moe_layers[i]:
            shared = cfg.shared_expert_intermediate_size
            dense += (cfg.num_experts * h + (3 * shared * h + h) * (shared > 0)) * e  # router, shared expert, gate
            routed += cfg.num_experts * expert_bytes(cfg, b)
        else:
            inter = cfg.intermediate_size
            dense += lin(2 * inter, h) + lin(h, inter) + (2 * inter + h) * e * cfg.mlp_bias
    return dense, routed


def load_transient(cfg: ModelConfig, b: Build) -> int:
    """What loading holds for a moment past what it keeps, the larger of two moments: packing, where the row-major
    linears of the layers `pack_dense` packs live beside their packed forms until the load returns (none where the
    build does not pack); and under `--quant int8`, quantizing, where every linear the quantizer turns to int8 is
    still held in the compute dtype beside its int8 form until `quantize_weights` returns, plus one block of float32
    rows (kernels/quant.py, `QUANT_ROWS`)."""
    h, nh, hd, inter = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.intermediate_size
    qkv = nh * hd * (2 if cfg.attn_output_gate else 1) + 2 * cfg.num_kv_heads * hd
    packing = 0
    if b.packs and all(n % 2 == 0 for n in (h, nh * hd, inter)):
        one = b.linear(qkv, h) + b.linear(h, nh * hd) + b.linear(2 * inter, h) + b.linear(h, inter)
        packing = one * sum(_one_call(cfg, i) for i in range(len(cfg.layer_types)))
    if b.quant != "int8":
        return packing
    plain = attrs.evolve(b, quant="none")
    originals, widest = 0, max(inter, nh * hd)
    for i, kind in enumerate(cfg.layer_types):
        if kind == FULL:
            originals += plain.linear(qkv, h) + plain.linear(h, nh * hd)
        else:
            nv, dv = cfg.gdn_value_heads, cfg.gdn_value_dim
            originals += plain.linear(cfg.gdn_conv_dim + nv * dv + 2 * nv, h) + plain.linear(h, nv * dv)
            widest = max(widest, nv * dv)
        if not cfg.moe_layers[i]:
            originals += plain.linear(2 * inter, h) + plain.linear(h, inter)
    return max(packing, originals + 2 * QUANT_ROWS * max(h, widest) * F32)


def expert_bytes(cfg: ModelConfig, b: Build) -> int:
    """One routed expert in a slot (or stacked): gate, up and down in the compute dtype."""
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size * b.elem


def file_expert_bytes(cfg: ModelConfig, tensors: dict, where: Path) -> int:
    """The routed experts' bytes in the artifact's files, as they are stored there (under the names the loaders
    read: a family that names its experts otherwise, Mixtral, is renamed first)."""
    rename = canonical_names(cfg.model_type)
    if rename is not None:
        tensors = {rename(k): v for k, v in tensors.items()}
    total = 0
    for layer in (n for n, moe in enumerate(cfg.moe_layers) if moe):
        for j in range(cfg.num_experts):
            for part in ("gate_proj", "up_proj", "down_proj"):
                name = f"{cfg.tensor_prefix}layers.{layer}.mlp.experts.{j}.{part}.weight"
                if name not in tensors:
                    raise ArtifactError(
                        f"{where}: tensor '{name}' is missing; the config names {cfg.num_experts} "
                        "routed experts a MoE layer"
                    )
                total += tensors[name][2]
    return total


def state_bytes(cfg: ModelConfig, b: Build, lanes: int, max_len: int) -> tuple[int, int]:
    """(kv, recurrent) of `Target.new_state(lanes, max_len)`: keys and values [lanes, kv heads, capacity, head_dim]
    per attention layer, capacity rounded up to whole key blocks; conv (compute dtype) and recurrent (float32)
    state per Gated DeltaNet layer."""
    cap = -(-max_len // KEY_BLOCK) * KEY_BLOCK
    attention = cfg.layer_types.count(FULL)
    kv = attention * 2 * lanes * cfg.num_kv_heads * cap * cfg.head_dim * b.elem
    return kv, cfg.layer_types.count(LINEAR) * lanes * _gdn_state(cfg, b)


def _gdn_state(cfg: ModelConfig, b: Build) -> int:
    """One lane's (or one row's record of) conv and recurrent state of one Gated DeltaNet layer."""
    conv = cfg.gdn_conv_dim * (cfg.gdn_conv_kernel - 1) * b.elem
    return conv + cfg.gdn_value_heads * cfg.gdn_key_dim * cfg.gdn_value_dim * F32


def row_bytes(cfg: ModelConfig, b: Build, taps: int, kept: bool) -> int:
    """An estimate of what one row of a pass holds: its hidden state and tapped layers' copies, its widest linear
    output (the widest activation), and where `kept` (a verify row) its float32 logits and the Gated DeltaNet
    record a row leaves in every such layer."""
    h = cfg.hidden_size
    gdn = cfg.gdn_conv_dim + cfg.gdn_value_heads * (cfg.gdn_value_dim + 2) if LINEAR in cfg.layer_types else 0
    moe = (
        max(2 * cfg.moe_intermediate_size, 2 * cfg.shared_expert_intermediate_size, cfg.num_experts)
        if any(cfg.moe_layers)
        else 0
    )
    qkv = (cfg.num_heads * (2 if cfg.attn_output_gate else 1) + 2 * cfg.num_kv_heads) * cfg.head_dim
    widest = max(qkv, gdn, moe, 2 * cfg.intermediate_size, h)
    held = (1 + taps) * h * b.elem + widest * b.elem
    if kept:
        held += cfg.vocab_size * F32 + cfg.layer_types.count(LINEAR) * _gdn_state(cfg, b)
    return held


@attrs.frozen
class DrafterBytes:
    """A model drafter's memory: `weights` (net, drafting copies, proposal head, tensors stored beside the net),
    `window` a lane (window keys and values, its count, the carried vector) and `pending` (the bound on rows
    observed but not yet projected, ModelBackend.PENDING_ROWS); `taps` target layers it reads."""

    weights: int
    window: int
    pending: int
    taps: int


def drafter_bytes(name: str, where: Path | None, cfg: ModelConfig, b: Build, head: str, options: dict) -> DrafterBytes:
    """What `stages/drafters/model_backend.py` holds for backend `name` over this target, from the drafter's json
    config and file header: the net is built on the meta device and prepared for drafting there, so its shapes are
    the real ones and nothing is allocated."""
    weights_path, config_path = dw.locate(name, where, cfg)
    cfg_cls, net_cls = dw.CONFIGS[name]
    try:
        dcfg = cfg_cls.model_validate(json.loads(config_path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise ArtifactError(f"{config_path}: not a valid {name} config ({exc})") from exc
    if not weights_path.is_file():
        raise ArtifactError(f"{weights_path}: missing; --spec-backend {name} needs it beside {config_path.name}")
    with torch.device("meta"):
        net = net_cls(dcfg).to(b.dtype)
    net.prepare_drafting()
    total = sum(p.numel() for p in net.parameters()) * b.elem
    layers = [m for m in net.modules() if isinstance(m, DraftLayer)]
    inside = {id(m) for layer in layers for m in layer.modules()}
    reads = [
        w
        for layer in layers
        for w in (layer.qkv, layer.mlp.gate_up, layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight)
    ]
    reads += [m.weight for m in net.modules() if isinstance(m, Linear) and id(m) not in inside and m.bias is None]
    copies = [
        v
        for m in net.modules()
        for v in vars(m).values()
        if isinstance(v, torch.Tensor) and all(v is not w for w in reads)
    ]
    total += sum(b.packed(*w.shape) for w in reads)  # unpacked, each is a view of parameters
    total += sum(b.packed(*c.shape) or c.numel() * b.elem for c in copies)
    tensors = file_header(weights_path)
    stored = {n: tensors[n] for n in dw.EXTRA[name] if n in tensors}
    total += sum(info[2] for info in stored.values())
    h, vocab = cfg.hidden_size, cfg.vocab_size
    q8 = b.dtype == torch.bfloat16 and h % 4 == 0 and b.device.type == "cpu" and cpu_build.bf16_kernels()
    head_rows = 0  # rows of an int8 proposal head this drafter makes for itself
    if head == "shortlist" and "shortlist.ranks" in stored:
        rows = int(options.get("shortlist_tokens", getattr(dcfg, "shortlist_tokens", ModelBackend.SHORTLIST_TOKENS)))
        head_rows = max(1, min(rows, vocab))
        total += b.packed(head_rows, h, int8=True) or head_rows * (h + F32)  # the int8 rows and their scales
        ranks = stored["shortlist.ranks"]
        total += 0 if ranks[0] == "I64" else ranks[1][0] * I64  # ids: a view of the ranks as int64
    elif (
        b.quant != "int8"
        and b.device.type == "cpu"
        and b.dtype in (torch.float32, torch.bfloat16)
        and cpu_build.library() is not None
    ):
        # an int8 copy of the head (packed where the build packs), unless the target's own head is int8
        head_rows = vocab
        total += b.packed(vocab, h, int8=True) or vocab * (h + F32)
    total += head_rows * I32 if q8 else 0  # int8-rows heads (kernels/q8.py) keep each column's sum
    if cpu_build.library() is not None and b.device.type == "cpu" and b.dtype in (torch.float32, torch.bfloat16):
        total += len(layers) * 2 * h * F32  # each layer's one-call form keeps its norms in float32
        if name == "mtp" and q8 and head_rows:
            total += 3 * h * F32  # the one-call proposal's three norms (kernels/draft_chain.py)
    size = int(options.get("window", dcfg.window))
    scratch = ModelBackend.DRAFT_ROWS if name == "mtp" else getattr(dcfg, "block_size", ModelBackend.DRAFT_ROWS)
    window = 2 * len(layers) * (size + scratch) * net.kv_dim * b.elem + I64 + h * b.elem
    taps = len(getattr(dcfg, "target_layers", ()))
    vectors = taps + bool(getattr(dcfg, "paired", False)) if taps else 2  # per row: its taps, or state and token
    pending = ModelBackend.PENDING_ROWS * (vectors * h * b.elem + I64)
    return DrafterBytes(weights=total, window=window, pending=pending, taps=taps)
