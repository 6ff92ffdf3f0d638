"""Benchmarks: ratios measured side by side in one run (see docs/benchmarks.md).

`installed_kernels_first()`, called before a bench imports transformers, makes the top-level name `kernels` the
installed distribution's (Hugging Face's, which transformers 5 imports when it is installed), not this repository's
kernels/ folder (`speclane.kernels`): run from the repository's root (`python -m speclane.bench...`), the root is
first on sys.path and would put the folder first, and transformers would then fail to import.
"""

import importlib
import importlib.util
import sys
from pathlib import Path


def installed_kernels_first() -> None:
    root = Path(__file__).resolve().parents[1]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]
    try:
        if "kernels" not in sys.modules and importlib.util.find_spec("kernels") is not None:
            importlib.import_module("kernels")
    finally:
        sys.path[:] = saved
