"""One submission in one process: ``python -m normcore.classroom.runner NB RESULTS ...``.

:mod:`normcore.classroom.grade` starts this module as a child process per submission.  It
sets the memory limit (``RLIMIT_AS``, inherited by the kernel), starts a fresh kernel with
nbclient and executes the prepared notebook with a time limit per cell (a cell over the
limit is interrupted and the next one runs), matplotlib's backend set to ``Agg`` in the
kernel's environment.  Each executed cell and the kernel's pid are appended to the results
file as they happen, so the grader knows how far a notebook got even when it has to kill it
at the notebook's time limit.

A kernel that dies (killed by a signal: ``os.kill(os.getpid(), 9)``, the system's
out-of-memory killer; or ended: ``os._exit(3)``) stops the notebook: the runner records a
``dead kernel`` event with the cell that was running and how the kernel ended
(:func:`kernel_end`), which the grader reports as ``kernel died``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import tempfile


from .capture import RESULTS_ENV
TIMEOUT_ERROR = "CellTimeout"


def _append(path: str, entry: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")


def kernel_end(returncode: int | None) -> dict:
    """How a kernel process ended, from its return code: ``{"signal": 9, "signal_name":
    "SIGKILL"}`` (killed by a signal), ``{"exit_code": 3}``, or ``{}`` if unknown."""
    if returncode is None:
        return {}
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return {"signal": -returncode, "signal_name": name}
    return {"exit_code": returncode}


def limit_memory(megabytes: int) -> None:
    """Cap this process's (and its children's) address space at ``megabytes``."""
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run(notebook: str, results: str, cell_timeout: int, memory: int) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    limit_memory(memory)
    os.environ[RESULTS_ENV] = results
    # the kernel inherits it: pyplot under the kernel's inline backend took up to 10 s to
    # import (benchmarks/grading.py --startup); a figure cell still shows with %matplotlib
    os.environ["MPLBACKEND"] = "Agg"
    nb = nbformat.read(notebook, as_version=4)

    class Client(NotebookClient):
        async def async_start_new_kernel(self, **kwargs):
            await super().async_start_new_kernel(**kwargs)
            # the kernel runs in a session of its own: tell the grader whom to stop
            process = getattr(self.km.provisioner, "process", None)
            self.kernel_process = process   # kept: its return code says how it ended
            _append(results, {"event": "kernel", "pid": getattr(process, "pid", None)})

    running = {"cell": None}

    def on_cell_execute(cell, cell_index):
        running["cell"] = cell_index

    def on_cell_executed(cell, cell_index, execute_reply):
        content = execute_reply.get("content", {}) if execute_reply else {}
        entry = {"event": "cell", "index": cell_index, "status": content.get("status", "ok")}
        if entry["status"] == "error":
            entry["ename"] = content.get("ename", "")
            entry["evalue"] = str(content.get("evalue", ""))[:300]
        _append(results, entry)

    with tempfile.TemporaryDirectory(prefix="normcore-grade-") as workdir:
        client = Client(
            nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
            interrupt_on_timeout=True, record_timing=False,
            error_on_timeout={"ename": TIMEOUT_ERROR, "traceback": [],
                              "evalue": f"the cell ran longer than {cell_timeout} s"},
            resources={"metadata": {"path": workdir}},
            on_cell_execute=on_cell_execute, on_cell_executed=on_cell_executed)
        client.kernel_process = None
        try:
            client.execute()
        except DeadKernelError as e:
            _append(results, {"event": "dead kernel", "detail": str(e)[:300],
                              "cell": running["cell"], **_ended(client.kernel_process)})
        except Exception as e:  # noqa: BLE001 - reported in the grade sheet, not raised
            _append(results, {"event": "runner error",
                              "detail": f"{type(e).__name__}: {str(e)[:300]}"})
    _append(results, {"event": "done"})
    return 0


def _ended(process) -> dict:
    """:func:`kernel_end` of the kernel's process (waited for a few seconds at most)."""
    if process is None:
        return {}
    try:
        return kernel_end(process.wait(timeout=5))
    except Exception:  # noqa: BLE001 - still running, or not ours to wait for
        return kernel_end(process.poll())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m normcore.classroom.runner")
    parser.add_argument("notebook")
    parser.add_argument("results")
    parser.add_argument("--cell-timeout", type=int, default=60)
    parser.add_argument("--memory", type=int, default=4096, help="MB; 0 for no limit")
    a = parser.parse_args(argv)
    return run(a.notebook, a.results, a.cell_timeout, a.memory)


if __name__ == "__main__":
    sys.exit(main())
