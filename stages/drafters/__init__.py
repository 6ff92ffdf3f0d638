"""Draft backends for the `draft` stage, keyed by name: none, ngram, dflash2, mtp, suffix, and the chains
suffix+mtp and suffix+dflash2 (chain.py).

A backend proposes up to k tokens after each lane's anchor, and keeps whatever per-slot state it reads
(an n-gram index, a window of the target's hidden states, suffix trees). The draft stage and stream_emit call
it; the executor never names a backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from speclane.stages.contract.errors import SpecError, did_you_mean

if TYPE_CHECKING:  # the lists below are read by the command line's flags, which import no backend (nor torch)
    from speclane.stages.contract.resources import Resources
    from speclane.stages.drafters.base import DraftBackend

# The one list of backends: `--spec-backend`, the request and knob models and the draft stage all read it here.
SPEC_BACKENDS = ("none", "ngram", "dflash2", "mtp", "suffix", "suffix+mtp", "suffix+dflash2")
CHAINS = ("suffix+mtp", "suffix+dflash2")  # one module holds both (its BACKENDS); the others one BACKEND a module
# The suffix backends' default `cache_tokens`: tokens of earlier requests the cache tree keeps. Here beside the list,
# not in suffix.py, so that --suffix-cache-tokens' help states it without importing a backend (and torch).
CACHE_TOKENS = 200_000
# Controls for tests and benchmarks, not a --spec-backend: oracle replays known tokens.
CONTROLS = ("oracle",)
_MODULES = {
    name: f"speclane.stages.drafters.{'chain' if name in CHAINS else name}" for name in SPEC_BACKENDS + CONTROLS
}


def backend_class(name: str) -> type[DraftBackend]:
    if name not in _MODULES:  # the list users see is the one --spec-backend takes; controls stay unadvertised
        raise SpecError(
            f"unknown draft backend '{name}'{did_you_mean(name, SPEC_BACKENDS)}; known: {', '.join(SPEC_BACKENDS)}"
        )
    module = importlib.import_module(_MODULES[name])
    return module.BACKENDS[name] if name in CHAINS else module.BACKEND


def build_backend(name: str, options: dict[str, Any], head: str, resources: Resources) -> DraftBackend:
    return backend_class(name)(options=options, head=head, resources=resources)


def backend_names() -> tuple[str, ...]:
    """Every backend the draft stage accepts, controls included."""
    return tuple(_MODULES)
