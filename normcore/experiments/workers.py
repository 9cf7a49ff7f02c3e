r"""The worker processes of :func:`normcore.experiments.runner.run`, kept from one call to the next.

A chapter runs several sweeps one after the other.  If each call started its own processes, each
would pay again for starting Python and torch, for the imports of the optimizer's first step and
for building its data set: a few seconds a process, on two cores a good part of a chapter's
minute.  So the processes are started once (:func:`pool`) and kept until Python exits or
:func:`shutdown`; a call that needs another number of them, or whose environment (the variables
and the import path a process inherits when it starts) has changed, replaces them.

Runs can also be handed to the processes before they are needed (:func:`submit`, by the run's
cache key) and collected later (:func:`take`): :func:`~normcore.experiments.runner.start` uses
this so that a chapter's later sweeps train while the chapter draws its figures.

The workers ignore SIGINT.  Jupyter interrupts a kernel by signalling its process group, which
holds the workers too: without this, an interrupt, or the end of a kernel, would kill them
mid-queue with a traceback each and leave a broken pool behind.  An interrupt stops the
notebook's wait; the runs already begun finish in the background.  A pool that broke anyway
(a worker killed) is not kept: the next call starts new processes.
"""
from __future__ import annotations

import atexit
import concurrent.futures as cf
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["pool", "kept", "shutdown", "submit", "take"]

_KEPT: dict[str, Any] = {}
_STARTED: dict[str, cf.Future] = {}      # runs handed over ahead of time, by cache key


def _setting() -> tuple:
    """What a worker inherits when it starts: the environment and the import path."""
    return tuple(sorted(os.environ.items())), tuple(sys.path)


def _ignore_interrupt() -> None:
    """Each worker's initializer: SIGINT is for the notebook's process, not for its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def kept() -> int | None:
    """The number of kept worker processes, if they were started in the current setting and
    none of them died."""
    if not _KEPT or _KEPT["setting"] != _setting() or getattr(_KEPT["pool"], "_broken", False):
        return None
    return _KEPT["workers"]


def pool(workers: int) -> cf.ProcessPoolExecutor:
    """``workers`` worker processes, the kept ones if they fit, else new ones (kept)."""
    if kept() != workers:
        shutdown()
        ctx = multiprocessing.get_context("spawn")   # fork would copy torch's threads
        _KEPT.update(workers=workers, setting=_setting(),
                     pool=cf.ProcessPoolExecutor(workers, mp_context=ctx,
                                               initializer=_ignore_interrupt))
    return _KEPT["pool"]


def shutdown() -> None:
    """Stop the kept worker processes; runs handed over and not begun are dropped."""
    _STARTED.clear()
    if _KEPT:
        executor = _KEPT.pop("pool")
        _KEPT.clear()
        executor.shutdown(wait=True, cancel_futures=True)


atexit.register(shutdown)       # before the interpreter takes apart what the pool needs


def submit(key: str, fn: Callable[..., Any], *args: Any, workers: int) -> None:
    """Hand the run ``key`` (``fn(*args)``) to the worker processes, unless it is there."""
    if key not in _STARTED:
        _STARTED[key] = pool(workers).submit(fn, *args)


def take(key: str) -> cf.Future | None:
    """The run ``key`` handed over by :func:`submit` (and forget it), or ``None``."""
    fut = _STARTED.pop(key, None)
    return None if fut is None or fut.cancelled() else fut
