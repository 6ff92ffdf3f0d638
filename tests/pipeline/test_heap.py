"""pipeline/heap.py: freed large buffers are reused as they are, not mapped and faulted in again every step (the
fitting loop's kernel time). Each case runs in a child process: the malloc policy is process-wide and would
outlive the test."""
import subprocess
import sys

import pytest

# A step shaped like a fitting step's head: three buffers over glibc's 32 MB mmap ceiling, made and freed.
CHILD = """
import resource, sys, torch
from pipeline.heap import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
late = 0
for step in range(16):
    before = faults()
    logits = torch.ones(450, 40000)
    probs = logits.softmax(-1)
    grad = probs * 2
    del logits, probs, grad
    late += faults() - before if step >= 8 else 0
print(took, late)
"""


def _late_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True).stdout
    took, faults = out.split()
    return took, int(faults)


def test_freed_large_buffers_are_reused_without_page_faults():
    took, kept = _late_faults("keep")
    if took != "True":
        pytest.skip("not glibc: keep_freed_memory has nothing to set")
    _, plain = _late_faults("plain")
    pages = 8 * 3 * 450 * 40000 * 4 // 4096   # steps 8..15, three 72 MB buffers each, every page touched
    assert plain > pages // 2, f"the default policy faulted only {plain} pages: the test no longer shows the cost"
    assert kept < pages // 10, f"{kept} page faults over 8 steps whose buffers were freed before"
