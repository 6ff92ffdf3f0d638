"""`speclane cache`: what the GGUF conversion cache holds (sizes and sources), and `--clear` to empty it.

Where the cache is and how an entry is keyed belong to stages/models/artifact.py; this module only shows it.
"""

from __future__ import annotations

import argparse

from speclane.stages.models.artifact import cache_entries, cache_root, clear_cache


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="list the GGUF conversion cache with sizes ($SPECLANE_CACHE), or --clear it")
    p.add_argument("--clear", action="store_true", help="remove every conversion (the next load converts again)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = cache_root()
    if args.clear:
        print(f"removed {_mb(clear_cache())} from {root / 'gguf'}")
        return 0
    entries = cache_entries()
    for path, size, source in entries:
        print(f"{_mb(size):>10}  {path.name}  {source}")
    print(f"{_mb(sum(size for _, size, _ in entries)):>10}  in all, {len(entries)} entries in {root / 'gguf'}")
    return 0


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
