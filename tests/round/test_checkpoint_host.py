"""The checkpoint store's host tier (a GPU engine's retained lanes: device memory first, then host RAM): when the
device budget is full the least recently used checkpoints move to the host instead of being dropped, a segment
moves once no checkpoint on the device holds it, each memory's bytes stay within its budget, and a turn served from
a checkpoint on the host decodes as a fresh prefill does. On a CPU the two memories are one, so here the "host" copy
is a clone (distinct storage), which is what a restore must then read."""

import pytest
import torch

from speclane.pipeline.runtime.checkpoints import CheckpointStore
from speclane.pipeline.runtime.keeper import HOST_CHECKPOINT_BYTES
from speclane.stages.models.target import Target
from tests.round.conftest import engine, prompt, requests

CLONES: list[torch.Tensor] = []


def _to_host(t: torch.Tensor) -> torch.Tensor:
    c = t.clone()
    CLONES.append(c)
    return c


def _storages(ck) -> set[int]:
    tensors = [t for s in ck.segments() for pair in (s.kv if hasattr(s, "kv") else ((s.k, s.v),)) for t in pair]
    tensors += [t for pair in ck.target.states if pair is not None for t in pair]
    return {t.untyped_storage().data_ptr() for t in tensors}


def _served_from_a_checkpoint_as_a_fresh_prefill(eng, target, follow: list[int]) -> None:
    hits = eng.checkpoints.hits
    got = eng.generate(requests([follow], max_tokens=8))[0].tokens
    assert eng.checkpoints.hits == hits + 1
    fresh = engine(target, "ngram", k=3, max_lanes=1)
    fresh.checkpoints = None
    assert got == fresh.generate(requests([follow], max_tokens=8))[0].tokens


def _bytes_on(store, host: bool) -> int:
    """What the store should count for one memory, recomputed from its entries."""
    own = sum(ck.nbytes for t, ck in store._entries.items() if store.on_host(t) == host)
    segs = {
        id(s): s.nbytes for ck in store._entries.values() for s in ck.segments() if store._segments[id(s)][3] == host
    }
    return own + sum(segs.values())


def test_a_full_device_moves_the_oldest_to_the_host_and_serves_from_there(targets):
    target = targets["qwen3_5_text"]  # attention and Gated DeltaNet layers: keys and recurrent states
    eng = engine(target, "ngram", k=3, max_lanes=1)
    first = [prompt(40, seed=61 + i) for i in range(3)]
    probe = CheckpointStore(1 << 30)
    eng.checkpoints = probe
    eng.generate(requests([first[0]], max_tokens=6))
    one = probe.bytes_held // len(probe._entries)  # about one checkpoint's bytes
    store = CheckpointStore(3 * one, host_budget_bytes=4 * one, to_host=_to_host)
    eng.checkpoints = store
    answers = [eng.generate(requests([p], max_tokens=6))[0] for p in first]  # two checkpoints each
    assert store.spills >= 2 and store.stats()["host_entries"] >= 2
    assert store.bytes_held <= store.budget_bytes and store.host_bytes_held <= store.host_budget_bytes
    assert store.bytes_held == _bytes_on(store, False) and store.host_bytes_held == _bytes_on(store, True)
    # the first conversation's checkpoints are the oldest: on the host, in the clones' storage
    follow = first[0] + list(answers[0].tokens) + prompt(6, seed=70)
    (ck,) = [
        c
        for t, c in store._entries.items()
        if len(t) < len(follow)
        and list(t) == follow[: len(t)]
        and len(t) == max(len(u) for u in store._entries if list(u) == follow[: len(u)])
    ]
    assert store.on_host(ck.tokens)
    assert _storages(ck) <= {c.untyped_storage().data_ptr() for c in CLONES}
    _served_from_a_checkpoint_as_a_fresh_prefill(eng, target, follow)


def test_without_a_host_budget_the_oldest_are_dropped(targets):
    eng = engine(targets["llama"], "ngram", k=3, max_lanes=1)
    assert eng.checkpoints.host_budget_bytes == 0  # the default on a CPU: the model's memory is host memory
    probe = CheckpointStore(1 << 30)
    eng.checkpoints = probe
    eng.generate(requests([prompt(40, seed=71)], max_tokens=6))
    store = CheckpointStore(probe.bytes_held, to_host=_to_host)  # about one turn's checkpoints
    eng.checkpoints = store
    for i in range(3):
        eng.generate(requests([prompt(40, seed=72 + i)], max_tokens=6))
    assert store.spills == 0 and store.evictions >= 4 and store.host_bytes_held == 0
    assert store.bytes_held <= store.budget_bytes


def test_a_host_budget_too_small_for_a_checkpoint_drops_it_instead(targets):
    eng = engine(targets["llama"], "ngram", k=3, max_lanes=1)
    store = CheckpointStore(1 << 30)
    eng.checkpoints = store
    eng.generate(requests([prompt(40, seed=81)], max_tokens=6))
    small = CheckpointStore(store.bytes_held, host_budget_bytes=1000, to_host=_to_host)
    eng.checkpoints = small
    for i in range(2):
        eng.generate(requests([prompt(40, seed=82 + i)], max_tokens=6))
    assert small.spills == 0 and small.evictions > 0 and small.host_bytes_held == 0


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (its checkpoints move to pinned host memory); on a CPU the two memories are one",
)
def test_on_a_gpu_the_oldest_move_to_pinned_host_memory_and_serve_from_there(artifacts):
    target = Target.load(artifacts["qwen3_5_text"][0], dtype=torch.float32, device="cuda")
    eng = engine(target, "ngram", k=3, max_lanes=1)
    assert eng.checkpoints.host_budget_bytes == HOST_CHECKPOINT_BYTES  # the default with the model on a GPU
    first = [prompt(40, seed=91 + i) for i in range(3)]
    eng.generate(requests([first[0]], max_tokens=6))
    one = eng.checkpoints.bytes_held // len(eng.checkpoints._entries)
    store = CheckpointStore(3 * one, host_budget_bytes=4 * one)  # the default host copy
    eng.checkpoints = store
    answers = [eng.generate(requests([p], max_tokens=6))[0] for p in first]
    assert store.spills >= 2 and store.bytes_held <= store.budget_bytes
    spilled = [ck for t, ck in store._entries.items() if store.on_host(t)]
    held = [t for ck in spilled for s in ck.segments() for pair in s.kv for t in pair]
    assert held and all(t.device.type == "cpu" and t.is_pinned() for t in held)
    follow = first[0] + list(answers[0].tokens) + prompt(6, seed=99)
    _served_from_a_checkpoint_as_a_fresh_prefill(eng, target, follow)
