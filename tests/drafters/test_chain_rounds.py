"""Invariant 1 with the chained backends: greedy output with suffix+mtp and suffix+dflash2 equals output with
speculation off on the three target families, in runs where both parts draft (the trees on the repetitive prompts
and on each prompt's second run, drafted from the first one's answer; the network on the others)."""

import pytest
import torch

from tests.drafters.conftest import write_drafter
from tests.round.conftest import engine, mixed_prompts, requests, targets  # noqa: F401  (fixture)

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def cases(targets, tmp_path_factory):  # noqa: F811
    """family -> (prompts, their tokens with speculation off, each run alone, a directory of drafter files)."""
    torch.set_num_threads(1)
    out = {}
    for name, target in targets.items():
        directory = tmp_path_factory.mktemp(f"chain-{name}")
        for backend in ("mtp", "dflash2"):
            write_drafter(backend, target, directory)
        prompts = mixed_prompts(4)
        alone = [engine(target).generate(requests([p], MAX_TOKENS))[0].tokens for p in prompts]
        out[name] = (prompts, alone, directory)
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text", "qwen3_next"])
@pytest.mark.parametrize("name", ["suffix+mtp", "suffix+dflash2"])
@pytest.mark.parametrize("k, lanes", [(2, 3), (7, 4)])
def test_greedy_output_equals_speculation_off(family, name, k, lanes, targets, cases):  # noqa: F811
    prompts, alone, directory = cases[family]
    eng = engine(targets[family], name, k=k, max_lanes=lanes, options={"path": str(directory)})
    eng.drafter_state.costs.clock = lambda: 0.0  # the network's time reads as free, so both parts draft whatever load
    got = eng.generate(requests(prompts + prompts, MAX_TOKENS))
    assert [r.tokens for r in got] == alone + alone
    rounds, stats = eng.drafter_state.rounds, eng.stats(list(eng.retired))
    assert rounds["suffix"] > 0 and rounds["model"] > 0, rounds
    assert 0 < stats["accepted"] < stats["drafted"], stats
