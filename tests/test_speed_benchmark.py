"""benchmarks/speed.py times ops, not the C library's heap: with its steady heap a buffer freed
by one call is reused by the next without page faults, where glibc's defaults often hand it
back to the OS and the next call pays a fault per page (whichever side of the table that is)."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import platform
import subprocess
import sys

import pytest

SPEED = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "speed.py"

#: two 8 MB buffers made, touched and freed, as a forward and a backward leave them; the
#: faults of the last four of eight rounds (the first ones grow the heap)
ROUNDS = """
import resource, torch
n = 2 << 20
faults = []
for _ in range(8):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = torch.empty(n).fill_(1.0)
    b = torch.empty(n).fill_(1.0)
    del a, b
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(sum(faults[4:]))
"""


def _speed():
    spec = importlib.util.spec_from_file_location("speed", SPEED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(tunables: str | None = None) -> dict:
    """This process's environment with ``GLIBC_TUNABLES`` set to ``tunables``, or removed."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    return env if tunables is None else {**env, "GLIBC_TUNABLES": tunables}


def _faults(tunables: str | None) -> int:
    run = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True,
                         timeout=120, env=_env(tunables))
    assert run.returncode == 0, run.stderr
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="GLIBC_TUNABLES: glibc only")
def test_steady_heap_reuses_freed_buffers_without_page_faults():
    # the defaults give the buffers back: up to 2 x 2048 pages of 4 KB refaulted a round
    assert _faults(None) >= 2048
    assert _faults(_speed().STEADY_HEAP) < 64


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="GLIBC_TUNABLES: glibc only")
def test_the_table_runs_with_the_steady_heap_and_reports_it():
    code = ("import runpy, sys; sys.argv = [{path!r}, '--quick', '--reps', '1', '--only', "
            "'weight_standardize'{extra}]; runpy.run_path({path!r}, run_name='__main__')")
    for extra, heap in (("", "default heap"), (", '--steady-heap'", "steady heap")):
        run = subprocess.run([sys.executable, "-c", code.format(path=str(SPEED), extra=extra)],
                             capture_output=True, text=True, timeout=300, env=_env())
        assert run.returncode == 0, run.stderr
        assert heap in run.stdout.splitlines()[0]
        assert "weight_standardize" in run.stdout


def test_per_call_times_the_small_inputs_in_microseconds_apart_from_the_target(tmp_path):
    path = str(SPEED)
    code = (f"import runpy, sys; sys.argv = [{path!r}, '--per-call', '--reps', '1', '--only', "
            f"'group_norm G=32']; runpy.run_path({path!r}, run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=_env())
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "per call on small inputs, not held to the target" in lines[0]
    assert "normcore us" in lines[1] and "torch us" in lines[1]
    rows = [line for line in lines if line.startswith("group_norm G=32")]
    small = str(_speed().SIZES["per-call"]["image"])
    # contiguous and channels_last, fwd and fwd+bwd, each at the small shape, none flagged
    assert len(rows) == 4 and all(small in row for row in rows), rows
    assert not any("> target" in row for row in rows)
    assert lines[-1].startswith("largest ratio:")
    # with --json, which measures other layers, it is refused, not ignored
    both = subprocess.run([sys.executable, str(SPEED), "--per-call", "--quick", "--reps", "1",
                           "--json", str(tmp_path / "cost.json")],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert both.returncode == 2 and "give one of them" in both.stderr, both.stderr
