"""The training loop the chapters' small experiments share.

:func:`train_cosine`: ``steps`` optimizer steps on batches drawn with replacement from a
training set by a generator seeded from the run's seed (``1000 + seed``), the learning rate
following a cosine from its initial value to 0; :func:`evaluate`: accuracy and loss in eval
mode.  A run's batches thus depend on its seed and the size of its training set only, so two
models trained at the same seed see the same batches.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

__all__ = ["train_cosine", "evaluate"]


def train_cosine(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                 y: torch.Tensor, steps: int, batch: int, seed: int) -> None:
    """Train ``net`` in place: ``steps`` steps of ``batch`` examples of ``(x, y)`` drawn with
    replacement, cross-entropy loss, learning rate ``lr_0 (1 + cos(pi t / steps)) / 2``."""
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.5 * (1 + math.cos(math.pi * t / steps)))
    gen = torch.Generator().manual_seed(1000 + seed)
    net.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        loss = TF.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    net.eval()


def evaluate(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``(accuracy, cross-entropy)`` of ``net`` on ``(x, y)``, without gradients."""
    with torch.no_grad():
        out = net(x)
    return float((out.argmax(1) == y).float().mean()), float(TF.cross_entropy(out, y))
