"""What objects really hold: the bytes of every distinct storage behind the tensors reachable from them (views of
one storage count it once, whole: a slice keeps its storage alive)."""

from __future__ import annotations

import mmap

import attrs
import torch
from torch import nn


def tensors(*roots, skip=()) -> list[torch.Tensor]:
    """Every tensor reachable from `roots` through attrs records, modules, containers and plain attributes; objects
    in `skip` (and their insides) are not entered."""
    found, seen = [], {id(x) for x in skip}

    def walk(obj):
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, mmap.mmap, type)):
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif isinstance(obj, nn.Module):
            for t in list(obj.parameters(recurse=False)) + list(obj.buffers(recurse=False)):
                walk(t)
            for v in vars(obj).values():
                walk(v)
            for m in obj.children():
                walk(m)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for v in obj:
                walk(v)
        elif attrs.has(type(obj)):
            for f in attrs.fields(type(obj)):
                walk(getattr(obj, f.name))
        elif hasattr(obj, "__dict__"):
            for v in vars(obj).values():
                walk(v)

    for root in roots:
        walk(root)
    return found


def nbytes(ts, minus=()) -> int:
    """Bytes of the storages behind the tensors `ts`, each once; storages any tensor of `minus` uses are left out."""
    gone = {t.untyped_storage().data_ptr() for t in minus}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}
    return sum(n for ptr, n in storages.items() if ptr not in gone)
