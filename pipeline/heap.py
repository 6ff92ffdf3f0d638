"""Keeping freed memory in the process, for loops that allocate the same large buffers every step (fitting).

glibc serves every allocation of 32 MB or more with its own mmap and unmaps it on free, so the next step maps it
again and the kernel faults in and zero-fills every page. An mtp fitting step makes about ten such buffers (logits
and their gradients, [~450 rows, 49,152 tokens] in float32 are 88 MB each): 184k page faults and 0.43 s of kernel
time a step out of 1.8-2.0 s alone, and a step 1.5-2.1x slower than without them beside another job on the second
core (the zero-filling competes for memory bandwidth). Measured 2026-11-30, torch 2.13.0, one thread, this
project's CPU machine. With mmap off and the heap never trimmed below what it holds, a freed buffer is reused as is.

Owns: `keep_freed_memory()`. Glibc only; elsewhere it does nothing. The cost: the process keeps its high-water
mark (a fit's peak is one step's buffers over its data, reached in its first step anyway).
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1   # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: 2 GB of free heap top kept before any is returned


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to serve large blocks from the heap and keep them when freed. True if it took."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):   # not glibc (musl has no mallopt, macOS's libc neither)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
