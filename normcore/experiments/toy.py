"""A toy experiment for the tests of :mod:`normcore.experiments.runner` (runs in microseconds).

:func:`noisy_mean` draws ``n`` normal values with mean ``mu`` from its seed and returns their
mean, the number of calls made in this process, and the process id: what a test needs to see
that a run was read from the cache, or made in a worker process.
"""
from __future__ import annotations

import os
import time

import torch

from .runner import Experiment

__all__ = ["noisy_mean", "NOISY_MEAN"]

_CALLS = 0


def noisy_mean(seed: int, mu: float = 0.0, n: int = 16, sleep: float = 0.0) -> dict[str, float]:
    """The mean of ``n`` draws from ``N(mu, 1)``, seeded; and how it was computed."""
    global _CALLS
    _CALLS += 1
    torch.manual_seed(seed)          # the global generator: run() must restore the caller's
    if sleep:
        time.sleep(sleep)
    value = float(torch.randn(n, dtype=torch.float64).mean()) + mu
    return {"mean": value, "calls": _CALLS, "pid": os.getpid(),
            "threads": torch.get_num_threads()}


NOISY_MEAN = Experiment("toy.noisy_mean", noisy_mean, held_equal="n draws per run")
