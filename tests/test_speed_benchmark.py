"""benchmarks/speed.py times ops, not the C library's heap: with its steady heap a buffer freed
by one call is reused by the next without page faults, where glibc's defaults hand it back to
the OS and the next call pays a fault per page (whichever side of the table that is)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

SPEED = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "speed.py"

#: two 8 MB buffers made, touched and freed, as a forward and a backward leave them; the
#: faults of the last four rounds (the first two settle the allocator's thresholds)
ROUNDS = f"""
import importlib.util, resource, sys, torch
spec = importlib.util.spec_from_file_location("speed", {str(SPEED)!r})
speed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(speed)
if sys.argv[1] == "steady":
    assert speed.steady_heap()
n = 2 << 20
faults = []
for _ in range(6):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = torch.empty(n).fill_(1.0)
    b = torch.empty(n).fill_(1.0)
    del a, b
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(sum(faults[2:]))
"""


def _faults(heap: str) -> int:
    run = subprocess.run([sys.executable, "-c", ROUNDS, heap], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, Linux")
def test_steady_heap_reuses_freed_buffers_without_page_faults():
    # the defaults give both buffers back each round: 2 x 2048 pages of 4 KB, refaulted
    assert _faults("default") >= 4 * 2048
    assert _faults("steady") < 64
