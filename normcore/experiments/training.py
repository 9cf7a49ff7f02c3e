r"""The training loop the chapters' small experiments share.

:func:`train_cosine`: ``steps`` optimizer steps on batches drawn with replacement from a
training set by a generator seeded from the run's seed (``1000 + seed``), the learning rate
following :func:`lr_factor`: a cosine from its initial value to 0, after an optional linear
warm-up; :func:`evaluate`: accuracy and loss in eval mode.  A run's batches thus depend on
its seed and the size of its training set only, so two models trained at the same seed see
the same batches, with or without a warm-up.

The schedule, with :math:`\eta` the optimizer's learning rate, :math:`t` the step
(``0 .. steps - 1``), :math:`T` = ``steps`` and :math:`W` = ``warmup``:

.. math::

    \eta_t = \eta \cdot \begin{cases} t / W & t < W \\
                                      \tfrac12 \big(1 + \cos(\pi (t - W) / (T - W))\big)
                                      & t \ge W \end{cases}

so :math:`\eta_0 = 0` with a warm-up (:math:`\eta` without), :math:`\eta_W = \eta`, and the
cosine reaches 0 at :math:`t = T`; with :math:`W = 0` it is the plain cosine.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

__all__ = ["train_cosine", "evaluate", "lr_factor", "check_schedule"]


def check_schedule(where: str, steps: int, warmup: int) -> None:
    """``steps >= 1`` and ``0 <= warmup < steps`` (both whole numbers), or a ValueError."""
    for name, v in (("steps", steps), ("warmup", warmup)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}: {name} must be a whole number of steps, got {v!r}")
    if steps < 1:
        raise ValueError(f"{where}: steps must be >= 1, got {steps}")
    if not 0 <= warmup < steps:
        raise ValueError(f"{where}: warmup must be from 0 (no warm-up) to steps - 1 = "
                         f"{steps - 1}, so that the cosine has steps left, got warmup={warmup}")


def lr_factor(t: int, steps: int, warmup: int = 0) -> float:
    """The learning rate at step ``t`` as a fraction of the initial one: ``t / warmup``
    during the warm-up, then the cosine from 1 to 0 over the remaining steps."""
    check_schedule("lr_factor", steps, warmup)
    if t < warmup:
        return t / warmup                                    # linear, from 0
    return 0.5 * (1 + math.cos(math.pi * (t - warmup) / (steps - warmup)))


def train_cosine(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                 y: torch.Tensor, steps: int, batch: int, seed: int,
                 warmup: int = 0) -> list[float]:
    """Train ``net`` in place: ``steps`` steps of ``batch`` examples of ``(x, y)`` drawn with
    replacement, cross-entropy loss, learning rate ``lr_0 * lr_factor(t, steps, warmup)``.
    Returns the training loss of every step's batch (before the step)."""
    check_schedule("train_cosine", steps, warmup)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: lr_factor(t, steps, warmup))
    gen = torch.Generator().manual_seed(1000 + seed)
    losses = []
    net.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        loss = TF.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    net.eval()
    return losses


def evaluate(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """``(accuracy, cross-entropy)`` of ``net`` on ``(x, y)``, without gradients."""
    with torch.no_grad():
        out = net(x)
    return float((out.argmax(1) == y).float().mean()), float(TF.cross_entropy(out, y))
