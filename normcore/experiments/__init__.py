"""Small, seeded experiments behind the chapters' widgets and claims, one module each.

* :mod:`normcore.experiments.running`: the running-statistics simulator (chapter 3);
* :mod:`normcore.experiments.sync`: per-device, synchronized and full-batch BatchNorm over
  real processes (chapter 3);
* :mod:`normcore.experiments.prenorm`: Post-LN, Pre-LN and DeepNorm gradient norms at
  initialization (the LayerNorm chapter);
* :mod:`normcore.experiments.group`: a small CNN trained with GroupNorm at each number of
  groups ``G`` (the GroupNorm chapter);
* :mod:`normcore.experiments.ws`: a tiny CNN trained with BN, GN or WS + GN at any batch
  size (the Weight Standardization chapter);
* :mod:`normcore.experiments.transformer`: a tiny transformer on MNIST-1D with LayerNorm,
  RMSNorm, DyT or no norm, and the S-curves of its norms (chapter 9);
* :mod:`normcore.experiments.nfnet`: a small ResNet on the digits with BatchNorm or
  normalizer-free, and its signal propagation (chapter 9); both train with
  :mod:`normcore.experiments.training`;
* :mod:`normcore.experiments.speedup`: a sigmoid MLP on the digits with and without BN, the
  steps to a test accuracy (the papers' chapter);
* :mod:`normcore.experiments.minibatch`: a 1-D CNN on MNIST-1D whose BN takes its statistics
  over ghost batches of any size, dealt at random or by class, beside LN, IN, GN, WS + GN and
  Batch Renorm (:mod:`normcore.experiments.renorm`) (the papers' chapter);
* :mod:`normcore.experiments.wsmicro`: the same CNN with WS + GN, GN or BN at a real
  micro-batch of 1 or 2 signals against BN at 32 and 64, at equal steps and at equal
  examples (the papers' chapter).

Every run goes through :mod:`normcore.experiments.runner` (seeds, intervals, the cache);
:mod:`normcore.experiments.sweeps` names the full sweeps behind the figures, their reduced
versions and their committed results, and ``python -m normcore.experiments`` lists, runs and
shows them.

The running-statistics names are re-exported here (``experiments.simulate_running_stats``);
the process-based comparison is imported on first use (``experiments.sync``), since it
starts processes and needs :mod:`torch.distributed`, and so are the training experiments
(``experiments.prenorm``, ``experiments.group``, ``experiments.ws``, ...) and the registry
(``experiments.sweeps``).
"""
from __future__ import annotations

import importlib

from .running import *  # noqa: F403 - the running experiment's names, as its __all__ lists
from .running import __all__ as _running_all
from .._extras import require

require(__name__)   # without normcore[book]: an ImportError that names it

_LAZY = ("running", "sync", "prenorm", "group", "ws", "transformer", "nfnet", "training",
         "speedup", "minibatch", "renorm", "wsmicro",
         "sweeps")
__all__ = list(_running_all) + list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
