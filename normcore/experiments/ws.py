r"""A tiny CNN trained with BatchNorm, GroupNorm, and Weight Standardization + GroupNorm.

The claim behind it (Qiao et al. 2019): at a batch of 1-2 images per device BN's batch
statistics are too noisy, GN does not depend on the batch, and WS on the convolutions in
front of GN closes (or more than closes) the gap to BN trained at a large batch.  This is
the same comparison in miniature, on seeded synthetic images that take seconds on a CPU:

* the data (:func:`stripe_images`): ``8 x 8`` single-channel images of one of four stripe
  orientations (horizontal, vertical, two diagonals), each with its own random contrast,
  brightness and noise, so that the label is in the pattern and not in the scale;
* the model (:func:`tiny_cnn`): ``conv3x3(1->8) - norm - ReLU - conv3x3(8->16, stride 2) -
  norm - ReLU - global average - linear(16->4)``, with ``norm`` one of ``"bn"``, ``"gn"``,
  ``"ws+gn"`` (the convolutions become :class:`normcore.nn.WSConv2d`) or ``"none"``;
* training (:func:`train`): plain SGD with momentum over a fixed number of epochs, the
  learning rate scaled linearly with the batch size (Goyal et al.'s rule), evaluated on
  held-out images in eval mode.

Every random source is a seeded ``torch.Generator`` or ``torch.manual_seed``; with one
thread the numbers are the same on every run of the same machine.  The chapter runs
:data:`TRAIN` through :func:`normcore.experiments.runner.run` (seeds, intervals, the cache).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from .. import nn as ncnn
from .runner import Experiment

__all__ = ["stripe_images", "tiny_cnn", "train", "TrainResult", "trained", "TRAIN", "smoothing",
           "SMOOTHING"]

NUM_CLASSES = 4


def stripe_images(n: int, seed: int, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images ``(n, 1, size, size)`` of four stripe orientations, and their labels."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    r = torch.arange(size, dtype=torch.float32)
    rows, cols = r.view(-1, 1).expand(size, size), r.view(1, -1).expand(size, size)
    coords = torch.stack([rows, cols, rows + cols, rows - cols])       # one per class
    phase = 2 * math.pi * torch.rand(n, 1, 1, generator=gen)
    freq = 2 * math.pi / (2.5 + 1.5 * torch.rand(n, 1, 1, generator=gen))
    pattern = torch.sin(freq * coords[labels] + phase)
    contrast = 0.3 + 2.7 * torch.rand(n, 1, 1, generator=gen)
    brightness = 2.0 * torch.randn(n, 1, 1, generator=gen)
    noise = 0.8 * torch.randn(n, size, size, generator=gen)
    images = contrast * (pattern + noise) + brightness
    return images.unsqueeze(1), labels


def _norm(kind: str, channels: int) -> torch.nn.Module:
    if kind == "bn":
        return ncnn.BatchNorm2d(channels)
    if kind in ("gn", "ws+gn"):
        return ncnn.GroupNorm(4 if channels >= 8 else 1, channels)
    return torch.nn.Identity()


def tiny_cnn(kind: str, seed: int) -> torch.nn.Sequential:
    """The two-conv network with normalization ``kind`` (``bn``, ``gn``, ``ws+gn``, ``none``)."""
    if kind not in ("bn", "gn", "ws+gn", "none"):
        raise ValueError(f"tiny_cnn: unknown kind {kind!r}; choose bn, gn, ws+gn or none")
    torch.manual_seed(seed)
    conv = ncnn.WSConv2d if kind == "ws+gn" else torch.nn.Conv2d
    return torch.nn.Sequential(
        conv(1, 8, 3, padding=1, bias=False), _norm(kind, 8), torch.nn.ReLU(),
        conv(8, 16, 3, stride=2, padding=1, bias=False), _norm(kind, 16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, NUM_CLASSES))


@dataclass
class TrainResult:
    kind: str
    batch_size: int
    seed: int
    test_accuracy: float
    final_train_loss: float   # mean loss over the last epoch
    steps: int


def train(kind: str, batch_size: int, seed: int = 0, *, epochs: int = 3, n_train: int = 256,
          n_test: int = 512, base_lr: float = 0.01, momentum: float = 0.9) -> TrainResult:
    """Train :func:`tiny_cnn` (``kind``) at ``batch_size``; the learning rate is
    ``base_lr * batch_size / 2`` (so batch 2 takes ``base_lr``).  Returns the accuracy on
    ``n_test`` held-out images, in eval mode."""
    x, y = stripe_images(n_train, seed=1000 + seed)
    xt, yt = stripe_images(n_test, seed=2000 + seed)
    model = tiny_cnn(kind, seed)
    opt = torch.optim.SGD(model.parameters(), lr=base_lr * batch_size / 2, momentum=momentum)
    gen = torch.Generator().manual_seed(3000 + seed)
    steps, last = 0, []
    model.train()
    for _epoch in range(epochs):
        order = torch.randperm(n_train, generator=gen)
        losses = []
        for i in range(0, n_train - batch_size + 1, batch_size):
            idx = order[i:i + batch_size]
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            steps += 1
        last = losses
    model.eval()
    with torch.no_grad():
        acc = float((model(xt).argmax(1) == yt).float().mean())
    return TrainResult(kind, batch_size, seed, acc, sum(last) / len(last), steps)


def trained(seed: int, norm: str, batch_size: int, epochs: int) -> dict[str, float]:
    """:func:`train` as an experiment: its accuracy, last-epoch loss and step count."""
    r = train(norm, batch_size, seed, epochs=epochs)
    return {"test_accuracy": r.test_accuracy, "final_train_loss": r.final_train_loss,
            "steps": r.steps}


#: The chapter's runs: configs ``{"norm", "batch_size", "epochs"}``.
TRAIN = Experiment("ws.train", trained,
                   held_equal="the same 256 training images and 512 test images per seed")


def _conv_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def _conv_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    return torch.autograd.grad(loss, _conv_weights(model))


def smoothing(seed: int, eta: float = 0.1, batch: int = 64) -> dict[str, float]:
    """The two local proxies of the smoothing claim, for GN and its WS twin, in float64.

    :func:`tiny_cnn` with GN (``seed``), each convolution's weight replaced by its own
    standardization (BiT's convention), and a twin with WS on every convolution
    (:func:`normcore.nn.convert_to_ws`): the same function of the same weights.  For each, on
    ``batch`` images: the norm of the gradient ``g`` with respect to the convolution weights,
    and how fast it changes along the step ``-eta g``, ``|g' - g| / (eta |g|)``.  Float64, so
    the numbers are the same on every machine to the digits printed.
    """
    from ..functional import weight_standardize

    x, y = stripe_images(batch, seed=50)
    plain = tiny_cnn("gn", seed).double()
    with torch.no_grad():
        for w in _conv_weights(plain):
            w.copy_(weight_standardize(w, convention="bit"))
    twin = ncnn.convert_to_ws(copy.deepcopy(plain), "bit")
    x = x.double()
    with torch.no_grad():
        gap = float((plain(x) - twin(x)).abs().max())
    if gap > 1e-6:            # eps keeps the standardization of a standardized w off by ~1e-9
        raise AssertionError(f"the WS twin computes another function (gap {gap:.1e})")
    out = {}
    for name, model in (("gn", plain), ("ws+gn", twin)):
        gs = _conv_grads(model, x, y)
        g = torch.cat([t.flatten() for t in gs])
        with torch.no_grad():
            for w, gw in zip(_conv_weights(model), gs):
                w -= eta * gw
        g2 = torch.cat([t.flatten() for t in _conv_grads(model, x, y)])
        out[f"grad_{name}"] = float(g.norm())
        out[f"change_{name}"] = float((g2 - g).norm() / (eta * g.norm()))
    out["grad_ratio"] = out["grad_ws+gn"] / out["grad_gn"]
    out["change_ratio"] = out["change_ws+gn"] / out["change_gn"]
    return out


#: The smoothing proxies: configs ``{}`` (or ``{"eta": ..., "batch": ...}``).
SMOOTHING = Experiment("ws.smoothing", smoothing,
                       held_equal="the same 64 images, the same function at the start")
