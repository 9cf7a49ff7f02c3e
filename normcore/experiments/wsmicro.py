r"""Weight Standardization + GroupNorm at a real micro-batch, against BatchNorm at a large one.

The claim behind it (Qiao et al. 2019): GN with WS on every convolution, trained with 1
image per GPU, matches or outperforms BN trained with large batches.  In the paper the
micro-batch is a *device's* batch: the authors' code accumulates the gradients of many
micro-batches into one step, so GN + WS takes the same steps, of the same total batch, as
BN.  Here the micro-batch is the optimizer's own: each Adam step sees ``batch`` signals.

The network is :func:`normcore.experiments.minibatch.cnn` (four ``conv1d - norm - ReLU``
blocks on MNIST-1D, strided), with ``norm`` one of ``"ws+gn"``, ``"gn"`` or ``"bn"``; BN
at a batch of ``N`` normalizes each training batch with its own statistics over its
``N L`` values per channel (``N >= 2``) and is evaluated with its running statistics.
Every run of a seed starts from the same initial weights and draws its batches from the
same shuffled stream of the 4,000 training signals (a fresh permutation each epoch), ``batch``
at a time: a run of ``steps`` steps sees the first ``batch * steps`` signals of the stream,
so a micro-batch run at equal steps sees a part of what the large-batch run sees.

What :func:`trained` returns: ``test_accuracy`` and ``test_error`` on the 1,000 test
signals in eval mode, ``train_loss`` (the mean loss of the last tenth of the steps, on
their own batches), and ``examples``, ``batch * steps``.

The learning-rate rule: the same Adam learning rate (``3e-3``, the minibatch experiment's)
at every batch size, as the paper keeps one schedule for all; ``lr`` changes it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from .. import datasets
from .minibatch import batches, cnn
from .runner import Experiment

__all__ = ["trained", "TRAIN", "NORMS", "LR"]

#: The norms compared: WS + GN, GN alone, BN.
NORMS = ("ws+gn", "gn", "bn")
#: Adam's learning rate at every batch size (the minibatch experiment's).
LR = 3e-3


def _check(norm: str, batch: int, steps: int, lr: float) -> None:
    if norm not in NORMS:
        raise ValueError(f"wsmicro: unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
    for name, value in (("batch", batch), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"wsmicro: {name} must be a positive int, got {value!r}")
    if norm == "bn" and batch < 2:
        raise ValueError(f"wsmicro: BN needs a batch of at least 2 signals for its batch "
                         f"statistics to vary, got batch={batch}; use GN or WS + GN at 1")
    if not (isinstance(lr, (int, float)) and 0 < lr < 1):
        raise ValueError(f"wsmicro: lr must be a number in (0, 1), got {lr!r}")


def trained(seed: int, norm: str, batch: int, steps: int, lr: float = LR) -> dict[str, float]:
    """Train :func:`~normcore.experiments.minibatch.cnn` with ``norm`` for ``steps`` Adam
    steps of ``batch`` signals each; the metrics above."""
    _check(norm, batch, steps, lr)
    data = datasets.mnist1d()
    torch.manual_seed(seed)                    # the initial weights: the same for every config
    model = cnn(norm, "strided", group=max(batch, 2), batch=max(batch, 2))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    draw = batches(data.y, batch, "iid", torch.Generator().manual_seed(1000 + seed))
    tail = max(1, steps // 10)
    losses = []
    for t in range(steps):
        idx = next(draw)
        loss = TF.cross_entropy(model(data.x[idx]), data.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if t >= steps - tail:
            losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        accuracy = float((model(data.x_test).argmax(1) == data.y_test).float().mean())
    return {"test_accuracy": accuracy, "test_error": 1.0 - accuracy,
            "train_loss": sum(losses) / len(losses), "examples": float(batch * steps)}


#: The chapter's runs: configs ``{"norm", "batch", "steps"}`` (and ``lr``).
TRAIN = Experiment("wsmicro.cnn", trained,
                   held_equal="the same initial weights per seed, Adam at the same learning "
                              "rate, one shuffled stream of training signals read batch by "
                              "batch; the steps as each config says")
