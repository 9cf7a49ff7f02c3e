r"""BatchNorm speeds up training: a sigmoid MLP on the digits, with and without BN.

The claim behind it (Ioffe & Szegedy 2015, Fig. 1): on MNIST, a network of three fully
connected hidden layers of 100 sigmoid units reaches a given test accuracy in far fewer
steps when each hidden layer is batch-normalized, and the distribution of a sigmoid's input
stays put during training instead of drifting (the paper's Fig. 1b and 1c, the 15th, 50th
and 85th percentiles of one unit's input over training).  The same network in miniature:

* the data: scikit-learn's 1,797 handwritten digits (:func:`normcore.datasets.digits`),
  ``8 x 8`` images with values in [0, 1], flattened to 64 inputs; 1,437 train, 360 test;
* the model (:func:`mlp`): ``64 -> 100 -> 100 -> 100 -> 10``, every hidden layer
  ``linear - [BatchNorm1d] - sigmoid``, BN where the paper puts it, before the
  nonlinearity; PyTorch's default initialization, drawn from the seed, the same draw with
  and without BN (BN adds only its ``gamma = 1``, ``beta = 0``).  BN is
  ``torch.nn.BatchNorm1d``: :class:`normcore.nn.BatchNorm1d` computes the same function
  (chapter 2 checks it), and torch's fused kernel is about three times faster on these
  small tensors, which a chapter that trains in a minute needs;
* training (:func:`trained`): plain SGD at one learning rate ``lr`` for ``steps`` steps of
  ``batch`` (60, the paper's) images, shuffled each epoch by the seed, so that with and
  without BN a seed sees the same batches in the same order;
* measured every ``every`` steps on the 360 test images: the accuracy in eval mode (BN with
  its running statistics), and the 15th, 50th and 85th percentiles of the input of unit
  ``unit`` of the last hidden layer, the value that enters its sigmoid (``W x + b`` without
  BN, ``gamma x_hat + beta`` with it, ``x_hat`` normalized with the statistics of the 360
  images, as in a training step: the running averages lag behind early in training).

The metrics come flat, one float each (the runner stores numbers): ``acc@<step>`` at the
steps :func:`measured_steps` keeps (every 10 steps up to 100, then every 50) and
``q15@<step>``, ``q50@<step>``, ``q85@<step>`` at 10, 20, 50 and every 100 steps;
``steps_to``, the first measured step (of every 10) with an accuracy of at least
``threshold`` (``steps + every`` if it never gets there), with ``reached`` (1 or 0) and
``log2_steps_to`` (the paired difference of two configs' is the log of their ratio); and
``spread_change``, the absolute log of the ratio of the unit's spread (85th minus 15th
percentile) at the last step to its spread at step 10: 0 if the spread did not change.
:func:`curve` reads a curve back from :class:`runner.Results`.

Every random source is a seeded ``torch.Generator`` or ``torch.manual_seed``; with one thread
the numbers are the same on every run of the same machine; float32 training makes their
last digits depend on the CPU's kernels.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as TF

from .. import datasets
from .runner import Experiment, Results

__all__ = ["mlp", "trained", "curve", "measured_steps", "TRAIN", "PERCENTILES"]

#: The percentiles of the unit's input that the paper plots.
PERCENTILES = (15, 50, 85)


def _check(name: str, **ints: Any) -> None:
    for key, v in ints.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: {key} must be a positive int, got {v!r}")


def mlp(bn: bool, width: int = 100, depth: int = 3, d_in: int = 64,
        classes: int = 10) -> torch.nn.Sequential:
    """``depth`` hidden layers ``linear(width) - [BatchNorm1d] - sigmoid`` and a linear
    classifier; the linear layers are created in the same order with and without BN, so
    that one seed draws the same weights for both."""
    _check("mlp", width=width, depth=depth, d_in=d_in, classes=classes)
    nn = torch.nn
    layers: list[torch.nn.Module] = []
    for i in range(depth):
        layers.append(nn.Linear(d_in if i == 0 else width, width))
        if bn:
            layers.append(nn.BatchNorm1d(width))
        layers.append(nn.Sigmoid())
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def measured_steps(steps: int, every: int, dense: int = 100,
                   sparse: int = 50) -> tuple[list[int], list[int]]:
    """The steps whose accuracy a run keeps: every ``every`` steps up to ``dense``, then every
    ``sparse`` steps up to ``steps``; and those where it keeps the percentiles: ``every``,
    ``2 every``, ``5 every`` and every multiple of ``10 every``."""
    _check("measured_steps", steps=steps, every=every, dense=dense, sparse=sparse)
    if steps % every or dense % every or sparse % every or steps % sparse:
        raise ValueError(f"measured_steps: steps ({steps}), dense ({dense}) and sparse "
                         f"({sparse}) must be multiples of every ({every}), and steps of "
                         f"sparse, so that the last step is kept")
    kept = [t for t in range(every, steps + 1, every) if t <= dense or t % sparse == 0]
    spots = [t for t in kept if t in (every, 2 * every, 5 * every) or t % (10 * every) == 0]
    return kept, spots


def _training_inputs(net: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The last sigmoid's inputs for ``x`` in training mode (BN with the statistics of ``x``
    itself, what a training step sees), the running buffers left as they were."""
    buffers = [b.clone() for b in net.buffers()]
    net.train()
    with torch.no_grad():
        h = net[:-2](x)
        for b, kept in zip(net.buffers(), buffers):
            b.copy_(kept)
    return h


def trained(seed: int, bn: bool, lr: float = 1.0, steps: int = 1500, batch: int = 60,
            every: int = 10, unit: int = 0, threshold: float = 0.9) -> dict[str, float]:
    """Train :func:`mlp` (with BN if ``bn``) by SGD; measure the test accuracy every
    ``every`` steps (keeping the curve at :func:`measured_steps`), the percentiles of one
    unit's input, and the steps to ``threshold``."""
    kept, spots = measured_steps(steps, every)
    if not 0 < threshold <= 1:
        raise ValueError(f"trained: threshold is an accuracy in (0, 1], got {threshold}")
    if not 0 <= unit < 100:
        raise ValueError(f"trained: unit must index one of the 100 units, got {unit}")
    data = datasets.digits()
    x, y = data.x.flatten(1), data.y
    x_test, y_test = data.x_test.flatten(1), data.y_test
    torch.manual_seed(seed)                  # the weights: the same draw with and without BN
    net = mlp(bn)
    # foreach: one call per step for all the tensors, the same numbers as the loop over them
    opt = torch.optim.SGD(net.parameters(), lr=lr, foreach=True)
    gen = torch.Generator().manual_seed(1000 + seed)     # the batches: the same for both
    order, pos = torch.randperm(len(y), generator=gen), 0
    out: dict[str, float] = {}
    first = None
    for t in range(1, steps + 1):
        if pos + batch > len(y):
            order, pos = torch.randperm(len(y), generator=gen), 0
        idx = order[pos:pos + batch]
        pos += batch
        loss = TF.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if t % every:
            continue
        net.eval()
        with torch.no_grad():
            h = net[:-2](x_test)                 # the last sigmoid's inputs, (360, 100)
            acc = float((net[-2:](h).argmax(1) == y_test).float().mean())
        net.train()
        if first is None and acc >= threshold:
            first = t
        if t in kept:
            out[f"acc@{t}"] = acc
        if t in spots:
            pre = _training_inputs(net, x_test)[:, unit] if bn else h[:, unit]
            qs = torch.quantile(pre, torch.tensor([p / 100 for p in PERCENTILES]))
            for p, q in zip(PERCENTILES, qs.tolist()):
                out[f"q{p}@{t}"] = q
    # how much the unit's input distribution spread out or shrank from the first spot on
    p0, p1 = spots[0], spots[-1]
    spread0, spread1 = out[f"q85@{p0}"] - out[f"q15@{p0}"], out[f"q85@{p1}"] - out[f"q15@{p1}"]
    out["spread_change"] = abs(math.log(max(spread1, 1e-12) / max(spread0, 1e-12)))
    out["steps_to"] = float(first if first is not None else steps + every)
    out["reached"] = float(first is not None)
    out["log2_steps_to"] = math.log2(out["steps_to"])
    out["final_accuracy"] = out[f"acc@{steps}"]
    return out


_KEY = re.compile(r"^(?P<name>[a-z0-9_]+)@(?P<step>\d+)$")


def curve(results: Results, name: str, **where: Any) -> tuple[list[int], list[tuple[float, ...]]]:
    """A measured curve of one config: its steps, and for each step the values of the seeds
    (``name`` is ``"acc"``, ``"q15"``, ``"q50"`` or ``"q85"``)."""
    cfg: Mapping[str, Any] = results.config(**where)
    first = next(m for c, s, m in results.records if c == cfg)
    steps = sorted(int(m["step"]) for k in first if (m := _KEY.match(k)) and m["name"] == name)
    if not steps:
        raise KeyError(f"curve: no metric {name!r}@<step>; the curves are "
                       f"{sorted({m['name'] for k in first if (m := _KEY.match(k))})}")
    return steps, [results.values(f"{name}@{t}", **cfg) for t in steps]


#: The chapter's runs: configs ``{"bn": bool, "lr": float}`` (and ``steps``, ``every``).
TRAIN = Experiment("speedup.mlp", trained,
                   held_equal="the same initial weights, batches of 60 images in the same "
                              "order, learning rate and number of SGD steps per seed; "
                              "accuracy on the same 360 test images")
