"""The shared plain decode loop: where lanes stop, forced tokens, and prefill passes that do not change the tokens.

Its exactness against the engine and the drafters' reference is held where it is used (tests/round/test_round_state.py,
tests/models/test_target_state.py, the bench's null-drafter control).
"""

from __future__ import annotations

import torch
from target_artifacts import artifacts, family, prompt  # noqa: F401  (fixtures)

from speclane.stages.models.decode import greedy_decode, packs
from speclane.stages.models.target import Target


def test_lanes_stop_at_eos_forced_tokens_are_taken_and_packing_changes_nothing(family):
    name, path, _ = family
    target = Target.load(path, dtype=torch.float32)
    prompts = [prompt(9, seed=1), prompt(4, seed=2), prompt(13, seed=3)]
    free = greedy_decode(target, prompts, 6)
    assert [len(x) for x in free] == [6, 6, 6]
    # several whole prompts in one prefill pass: each row on the decode route, so the same tokens
    assert greedy_decode(target, prompts, 6, pack_rows=64) == free, name
    eos = free[0][2]
    cut = greedy_decode(target, prompts, 6, eos={eos})
    assert cut == [x[: x.index(eos) + 1] if eos in x else x for x in free]
    forced = [[1, 2, 3, 4], [4, 3, 2, 1], [5, 5, 5, 5]]
    seen = []
    assert greedy_decode(target, prompts, 4, forced=forced, on_pass=lambda lanes, b, o: seen.append(lanes)) == forced
    assert seen == [[0], [1], [2], [0, 1, 2], [0, 1, 2], [0, 1, 2]]  # one prompt a pass, then every lane a pass


def test_packs_fill_passes_and_a_long_sequence_goes_alone():
    assert list(packs([3, 4, 5, 9, 1], 8)) == [(0, 2), (2, 3), (3, 4), (4, 5)]
