"""The memory plan holds against the real tensors: each line equals the bytes of what a real load, state or drafter
holds (exactly for weights, KV, recurrent state and the drafter; the activations as their estimate documents), and
with an expert cache the drafter and the wide rounds come out of the cache's budget, as the engine then loads it."""

import shutil

import attrs
import pytest
import torch

from speclane.pipeline.runtime.memory_plan import Model, Setting, advise, lay_out
from speclane.pipeline.runtime.model_bytes import Build
from speclane.stages.contract.resources import Resources
from speclane.stages.drafters import build_backend
from speclane.stages.drafters.model_backend import ModelBackend
from speclane.stages.models import drafter_weights as dw
from speclane.stages.models.artifact import resolve
from speclane.stages.models.state import AttnCache, RowBatch
from speclane.stages.models.target import Target
from speclane.stages.models.weights import MoeWeights
from tests.memory.held import nbytes, tensors
from tests.models.family_artifacts import family_artifacts  # noqa: F401  (a fixture)
from tests.models.target_artifacts import FAMILIES, artifacts, prompt  # noqa: F401  (fixtures)

CPU = torch.device("cpu")
DTYPES = (torch.float32, torch.bfloat16)  # bfloat16: the packed copies, where this CPU's build makes them


@pytest.fixture(scope="module")
def tiny(artifacts, tmp_path_factory):  # noqa: F811
    """family -> a copy of its tiny artifact with fresh mtp and dflash2 files beside it (shortlist ranks int32,
    as fit-drafter writes them)."""
    out = {}
    for name, (path, _) in artifacts.items():
        dst = tmp_path_factory.mktemp("plan") / name
        shutil.copytree(path, dst)
        cfg = Model(dst).cfg
        ranks = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(0)).to(torch.int32)
        for backend in ("mtp", "dflash2"):
            torch.manual_seed(1)
            dw.export(backend, dw.new_net(backend, cfg), dst, {}, {"shortlist.ranks": ranks})
        out[name] = dst
    return out


def _setting(dtype=torch.bfloat16, quant="none", **kw) -> Setting:
    return Setting(build=Build(dtype, CPU, quant), **{"lanes": 3, "max_len": 100, **kw})


def _target_lines(target: Target, lanes: int, max_len: int) -> dict[str, int]:
    """What the loaded target and a fresh state really hold, by line."""
    routed = [
        w
        for lw in target.weights.layers
        if isinstance(lw.mlp, MoeWeights)
        for w in (lw.mlp.gate_up, lw.mlp.down)
        if w is not None
    ]
    cache = target.experts
    state = target.new_state(lanes, max_len)
    attn = [c for c in state.layers if isinstance(c, AttnCache)]
    gdn = [c for c in state.layers if not isinstance(c, AttnCache)]
    slow = sum(t.nbytes for layer in cache.slow.layers.values() for parts in layer for t in parts) if cache else 0
    return {
        "dense": nbytes(tensors(target.weights), minus=routed),
        "experts_fast": nbytes(routed) if cache is None else nbytes([cache.gate_up, cache.down]),
        "experts_slow": slow,
        "kv": nbytes([c.k for c in attn] + [c.v for c in attn]),
        "recurrent": nbytes([c.conv for c in gdn] + [c.recurrent for c in gdn]),
    }


@pytest.mark.parametrize("quant", ["none", "int8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FAMILIES)
def test_target_lines_are_the_loaded_tensors(tiny, name, dtype, quant):
    lanes, max_len = 3, 100  # 100 positions: KV rounded up to two key blocks
    want = _target_lines(Target.load(tiny[name], dtype=dtype, quant=quant), lanes, max_len)
    plan = lay_out(Model(tiny[name]), _setting(dtype, quant, lanes=lanes, max_len=max_len))
    assert {k: plan.lines[k] for k in want} == want
    assert plan.lines["kv"] > 0 and (plan.lines["recurrent"] > 0) == (name != "llama")


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_expert_cache_is_its_slots_and_the_files(tiny, dtype):
    path = tiny["qwen3_next"]
    one = 3 * 48 * 24 * dtype.itemsize
    cache = 5 * one + 7  # five whole slots
    want = _target_lines(Target.load(path, dtype=dtype, expert_cache_bytes=cache), 2, 64)
    plan = lay_out(Model(path), _setting(dtype, lanes=2, max_len=64, expert_cache_bytes=cache))
    assert {k: plan.lines[k] for k in want} == want
    assert plan.expert_slots == 5 and plan.lines["experts_fast"] == 5 * one
    assert plan.lines["experts_slow"] == 4 * 7 * 3 * 48 * 24 * 4  # four MoE layers' experts, float32 in the files


def _drafter_held(target: Target, backend: str, head: str, options: dict, lanes: int) -> int:
    """What the real backend holds beside the target: its weights, copies and head, its state for `lanes`, and its
    bound on unprojected rows (PENDING_ROWS rows of what `raw_rows` makes of a real pass)."""
    drafter = build_backend(backend, options, head, Resources(target=target))
    state = drafter.new_state(lanes, 100)
    weights = nbytes(tensors(drafter, skip=(target,)), minus=tensors(target.weights))
    target.hidden_taps = drafter.taps
    batch = RowBatch.build([(0, 0, prompt(3))])
    out = target.forward(batch, target.new_state(1, 64), record="rows")
    raw = drafter.raw_rows(state, batch, out, torch.tensor([3]))
    return weights + nbytes(tensors(state)) + ModelBackend.PENDING_ROWS * (raw[0].nbytes + 8)


@pytest.mark.parametrize("quant", ["none", "int8"])
@pytest.mark.parametrize("head", ["full", "shortlist"])
@pytest.mark.parametrize("backend", ["mtp", "dflash2"])
@pytest.mark.parametrize("name", ["llama", "qwen3_next"])
def test_drafter_line_is_what_the_backend_holds(tiny, name, backend, head, quant):
    options = {"window": 24, "shortlist_tokens": 40}
    target = Target.load(tiny[name], dtype=torch.bfloat16, quant=quant)
    want = _drafter_held(target, backend, head, options, lanes=3)
    plan = lay_out(
        Model(tiny[name]), _setting(quant=quant, backend=backend, draft_tokens=3, head=head, options=options)
    )
    assert plan.lines["drafter"] == want


@pytest.mark.parametrize("backend", ["none", "ngram"])
def test_speculation_off_or_without_weights_holds_no_drafter(tiny, backend):
    plan = lay_out(Model(tiny["qwen3_next"]), _setting(backend=backend, draft_tokens=3))
    assert plan.lines["drafter"] == 0


@pytest.mark.parametrize("backend, head", [("dflash2", "shortlist"), ("mtp", "full")])
def test_the_embedded_default_model(backend, head):
    """The converted GGUF's directory, its drafters from the shipped assets; bfloat16, as served."""
    path = resolve(None)
    target = Target.load(path, dtype=torch.bfloat16)
    want = _target_lines(target, 2, 300)
    want["drafter"] = _drafter_held(target, backend, head, {}, lanes=2)
    plan = lay_out(Model(path), _setting(lanes=2, max_len=300, backend=backend, draft_tokens=7, head=head))
    assert {k: plan.lines[k] for k in want} == want


@pytest.mark.parametrize("name", ["qwen3_next", "llama"])
@pytest.mark.parametrize("lanes, rows", [(1, 0), (4, 0), (3, 8)])
def test_activations_cover_what_the_widest_passes_leave(tiny, name, lanes, rows):
    """Documented estimate: a verify round's rows each hold their logits, Gated DeltaNet records, taps and hidden
    state (and a widest linear output besides); a prefill chunk's rows their taps and hidden state, and its last row
    what a verify row holds. The real outputs of both passes fit the reserve."""
    target = Target.load(tiny[name], dtype=torch.bfloat16)
    s = _setting(lanes=lanes, max_len=256, backend="dflash2", draft_tokens=7, row_budget=rows, prefill_rows=40)
    plan = lay_out(Model(tiny[name]), s)
    target.hidden_taps = build_backend("dflash2", {}, "full", Resources(target=target)).taps
    state = target.new_state(lanes, 256)
    per_lane = s.verify_rows // lanes
    verify = RowBatch.build([(lane, 0, prompt(per_lane, lane)) for lane in range(lanes)])
    prefill = RowBatch.build([(0, 0, prompt(40))])
    for batch, record, logits in ((verify, "rows", "all"), (prefill, "last", "last")):
        out = target.forward(batch, state, record=record, logits=logits)
        held = nbytes(
            [out.logits, out.hidden, out.taps] + [t for r in out.records if r for t in attrs.astuple(r, recurse=False)]
        )
        assert held <= plan.lines["activations"]


def test_the_drafter_and_wide_rounds_come_out_of_the_expert_cache(tiny):
    path = tiny["qwen3_next"]
    model = Model(path)
    one = 3 * 48 * 24 * 2
    s = _setting(lanes=4, backend="mtp", draft_tokens=3, row_budget=8, prefill_rows=4)
    cache = lay_out(model, s).lines["drafter"] + 20 * one
    narrow = lay_out(model, attrs.evolve(s, expert_cache_bytes=cache))
    wide = lay_out(model, attrs.evolve(narrow.setting, row_budget=16))
    assert (narrow.setting.verify_rows, wide.setting.verify_rows) == (8, 16)
    assert narrow.expert_slots == 20 and 0 < wide.expert_slots < 20
    assert narrow.taken == narrow.lines["drafter"] > 0  # 8 rows: the reserve a narrow round has anyway
    assert wide.taken == wide.lines["drafter"] + wide.lines["activations"] - narrow.lines["activations"]
    assert wide.lines["activations"] > narrow.lines["activations"]
    for plan in (narrow, wide):
        assert plan.expert_slots == (cache - plan.taken) // one
        every = lay_out(model, attrs.evolve(plan.setting, expert_cache_bytes=None))  # the same, all resident
        assert plan.total == every.total - every.lines["experts_fast"] + plan.expert_slots * one
        target = Target.load(path, dtype=torch.bfloat16, expert_cache_bytes=plan.expert_budget)
        assert target.expert_stats().resident_bytes == plan.lines["experts_fast"]


def test_a_cache_the_drafter_empties_does_not_fit(tiny):
    plan = lay_out(Model(tiny["qwen3_next"]), _setting(backend="mtp", draft_tokens=3, expert_cache_bytes=1 << 16))
    assert plan.expert_slots == 0 and plan.fits is False
    assert "the expert cache holds no expert" in plan.problems[0]
    fix = next(f for f in advise(Model(tiny["qwen3_next"]), plan) if f.startswith("--expert-cache "))
    budget = int(float(fix.split()[1]) * (1 << 20))  # no --memory: the largest cache, every expert
    assert lay_out(Model(tiny["qwen3_next"]), attrs.evolve(plan.setting, expert_cache_bytes=budget)).expert_slots == 28


def test_each_advised_change_fits(tiny):
    model = Model(tiny["qwen3_next"])
    s = _setting(lanes=4, max_len=2048, backend="dflash2", draft_tokens=7, checkpoint_bytes=1 << 20)
    full = lay_out(model, s)
    plan = lay_out(model, s, memory=full.total - 20_000)
    assert plan.fits is False and plan.free == -20_000
    fixes = advise(model, plan)
    assert {f.split()[0] for f in fixes} == {
        "--lanes",
        "--context",
        "--expert-cache",
        "--spec-backend",
        "--checkpoint-memory",
        "--quant",
    }
    changes = {"--lanes": "lanes", "--context": "max_len", "--checkpoint-memory": "checkpoint_bytes"}
    for fix in fixes:
        flag, value = fix.split()
        if flag == "--expert-cache":
            budget = int(float(value) * (1 << 20))
            cached = lay_out(model, attrs.evolve(s, expert_cache_bytes=budget), plan.memory)
            larger = lay_out(model, attrs.evolve(s, expert_cache_bytes=budget + cached.one_expert), plan.memory)
            assert cached.fits and cached.expert_slots > 0 and not larger.fits
        if flag in changes:
            n = int(value) * (1 << 20 if flag == "--checkpoint-memory" else 1)
            assert lay_out(model, attrs.evolve(s, **{changes[flag]: n}), plan.memory).fits
            step = 64 if flag == "--context" else 1 << 20 if flag == "--checkpoint-memory" else 1
            assert not lay_out(model, attrs.evolve(s, **{changes[flag]: n + step}), plan.memory).fits  # the largest


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_the_moe_families_plan_is_what_the_target_holds(family_artifacts, family):
    """Mixtral names its experts otherwise on disk (`block_sparse_moe.experts.N.w1`): the plan reads them there."""
    path = family_artifacts[family][0]
    cache = 3 * 1024 * 1024
    target = Target.load(path, dtype=torch.float32, expert_cache_bytes=cache)
    want = _target_lines(target, 2, 64)
    plan = lay_out(Model(path), _setting(torch.float32, lanes=2, max_len=64, expert_cache_bytes=cache))
    assert {k: plan.lines[k] for k in want} == want
    assert plan.lines["experts_slow"] > 0
