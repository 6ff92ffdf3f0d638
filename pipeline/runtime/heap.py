"""The Python heap of a long-running command: start-up's objects set aside from the cyclic collector.

A collection of the oldest generation scans every object alive, and after start-up that is torch's, the
tokenizer's, jinja's and the model's: a full collection then takes longer than a drafter's proposal or a target
pass (CHANGELOG.md, 629651d, measured with `gc.callbacks`). Such a pause lands inside whatever the loop is doing (a
token's latency, a drafter's timed proposal). `gc.freeze()` moves everything alive into a permanent generation the
collector never scans (vLLM freezes its engine's start-up heap for the same reason); objects freed by their
reference counts still go at once. A command freezes once its engine is built and thaws when it returns, so a
process that runs several commands (the tests) does not keep their cycles for good.
"""

from __future__ import annotations

import contextlib
import gc


def freeze() -> None:
    """Collect what is already garbage, then set everything alive aside from later collections."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def scope():
    """Thaw on the way out whatever `freeze` set aside inside (the objects become collectable again)."""
    try:
        yield
    finally:
        gc.unfreeze()
