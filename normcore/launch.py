r"""Run a function in ``W`` processes joined in a process group, on this machine.

:func:`run` starts ``world_size`` processes on 127.0.0.1, joins them in a gloo process group
and returns each rank's result to the caller::

    from normcore.launch import run
    from normcore.experiments.sync import compare_per_device_vs_sync
    results = run(compare_per_device_vs_sync, 3, 0, [4, 1, 3])   # one dict per rank

On Linux it forks (about 0.1 s for a world, against ~3 s to spawn fresh interpreters that
import torch).  Forking is safe here because the children set ``torch.set_num_threads(1)``
before any torch op (a forked child must not reuse the parent's OpenMP pool; PyTorch's
DataLoader workers do the same) and because the parent has no gloo process group of its own
(if it has one, :func:`run` spawns instead).  With fork, the function may even be defined in
a notebook; with ``start_method="spawn"`` it must be importable.

This module imports nothing from normcore: it is a launcher, usable for any function.
"""
from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["run", "free_port", "RemoteTraceback"]


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (shown as the ``__cause__``)."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (bind port 0, let the OS choose, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write(path: str, obj) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: the parent never reads half a file


def _bootstrap(rank: int, world_size: int, port: int, fn: Callable, args: tuple, kwargs: dict,
               out_dir: str, timeout: float, backend: str = "gloo", threads: int = 1) -> None:
    """One rank: join the group, run ``fn``, leave the group (always), write the result."""
    # Before any torch op: one intra-op thread per rank.  A forked child must not use the
    # parent's OpenMP thread pool (it hangs), and W ranks share the cores anyway.
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    path = os.path.join(out_dir, f"rank{rank}.pt")
    failed_at = None  # when this rank failed: the earliest failure is the root cause
    try:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        try:
            result = fn(*args, **kwargs)
            dist.barrier()  # nobody tears down the store (hosted by rank 0) while others use it
        except BaseException:
            # stamped before destroy_process_group, which makes the other ranks fail
            failed_at = time.time()
            raise
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()  # destroys every group, even if fn raised
        envelope = {"ok": True, "result": result, "initialized": dist.is_initialized()}
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        try:
            blob = pickle.dumps(exc)
            pickle.loads(blob)
        except Exception:  # noqa: BLE001 - an exception that does not survive pickling
            blob = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
        envelope = {"ok": False, "exc": blob, "tb": traceback.format_exc(),
                    "time": failed_at or time.time()}
    _write(path, envelope)
    if not envelope["ok"]:
        sys.exit(1)


def _default_start_method() -> str:
    if sys.platform.startswith("linux") and not (dist.is_available() and dist.is_initialized()):
        return "fork"
    return "spawn"


def run(fn: Callable, world_size: int, *args, timeout: float = 60.0,
        start_method: str | None = None, backend: str = "gloo", **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` in ``world_size`` processes joined in a process group.

    Each process is one rank of a ``backend`` (gloo) group on 127.0.0.1 with a free port
    chosen now (``MASTER_ADDR``, ``MASTER_PORT``, ``env://``).  Returns the ranks' return
    values, in rank order (they travel back with ``torch.save``: tensors, dicts, lists...).

    * ``destroy_process_group`` always runs, in a ``finally`` in the worker.
    * An exception in a worker is re-raised here, the same type and message, with the
      worker's traceback chained as ``__cause__``; the other ranks are stopped.
    * ``timeout`` (seconds) bounds the whole run, and is the process group's timeout too: a
      rank waiting for a collective that another rank never joins fails, it does not hang.
      The children are always gone when ``run`` returns or raises.
    * ``start_method``: ``None`` forks on Linux (fast; see the module docstring) unless this
      process has a process group of its own, then spawns.  ``"spawn"`` and ``"forkserver"``
      need ``fn`` importable (a notebook-defined function is not: use the ready-made
      workers of :mod:`normcore.experiments.sync`).
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"run: world_size must be a positive int, got {world_size!r}")
    if not timeout > 0:
        raise ValueError(f"run: timeout must be > 0 seconds, got {timeout!r}")
    ctx = mp.get_context(start_method or _default_start_method())
    for attempt in range(3):  # retry only if someone took the free port in between
        with tempfile.TemporaryDirectory(prefix="normcore-dist-") as out_dir:
            port = free_port()
            procs = [ctx.Process(target=_bootstrap, name=f"normcore-rank{r}",
                                 args=(r, world_size, port, fn, args, kwargs, out_dir, timeout,
                                       backend))
                     for r in range(world_size)]
            try:
                for p in procs:
                    p.start()
                deadline = time.monotonic() + timeout
                failed = False
                while not failed and any(p.exitcode is None for p in procs):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        waiting = [r for r, p in enumerate(procs) if p.exitcode is None]
                        raise TimeoutError(
                            f"run({getattr(fn, '__name__', fn)}, {world_size}): rank(s) {waiting} "
                            f"did not finish within timeout={timeout} s. Usually a rank waits "
                            f"in a collective that another rank never joins (e.g. different "
                            f"numbers of forward or backward calls in training mode).")
                    wait([p.sentinel for p in procs if p.exitcode is None], timeout=min(left, 1.0))
                    failed = any(p.exitcode not in (None, 0) for p in procs)
            finally:
                for p in procs:  # stop whatever still runs (after a failure or a timeout)
                    if p.exitcode is None and p.pid is not None:
                        p.terminate()
                for p in procs:
                    if p.pid is not None:
                        p.join(5)
                        if p.exitcode is None:
                            p.kill()
                            p.join()
            envelopes = {}
            for r in range(world_size):
                path = os.path.join(out_dir, f"rank{r}.pt")
                if os.path.exists(path):
                    envelopes[r] = torch.load(path, weights_only=False)
        errors = {r: e for r, e in envelopes.items() if not e["ok"]}
        if errors:
            if attempt < 2 and any("EADDRINUSE" in e["tb"] or "address already in use"
                                   in e["tb"].lower() for e in errors.values()):
                continue
            rank, first = min(errors.items(), key=lambda kv: kv[1]["time"])  # the root cause
            exc = pickle.loads(first["exc"])
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised on rank {rank} of {world_size} in "
                             f"normcore.launch.run({getattr(fn, '__name__', fn)}, ...))")
            raise exc from RemoteTraceback(f'\n"""\n[rank {rank}] {first["tb"]}"""')
        missing = [r for r in range(world_size) if r not in envelopes]
        if missing:
            codes = {r: procs[r].exitcode for r in missing}
            raise RuntimeError(f"run: rank(s) {missing} exited without a result "
                               f"(exit codes {codes}); a crash, or os._exit in the worker")
        leaked = [r for r, e in envelopes.items() if e["initialized"]]
        if leaked:  # cannot happen with the finally above; checked so a regression is loud
            raise RuntimeError(f"run: rank(s) {leaked} still had a process group at exit")
        return [envelopes[r]["result"] for r in range(world_size)]
    raise AssertionError("unreachable")
