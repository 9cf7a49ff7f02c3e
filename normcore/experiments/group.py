r"""A small CNN trained with GroupNorm at each number of groups ``G`` (the GroupNorm chapter).

The claim behind it (Wu & He 2018, Table 3): GN's error hardly depends on ``G`` in its middle
range, and is worse at the two ends, ``G = 1`` (LayerNorm) and one channel per group
(InstanceNorm).  This is the same sweep in miniature, on seeded synthetic images that train
in well under a second on a CPU:

* the data (:func:`stripes`): ``8 x 8`` single-channel images of one of four stripe
  orientations (horizontal, vertical, two diagonals), each with a random phase and contrast,
  under Gaussian noise of standard deviation 0.8; a run draws a fresh image for each of its
  ``steps * batch`` training examples from its seed, and every run is tested on the same 512
  images (seed 999);
* the model (:func:`gn_cnn`): three ``conv3x3`` layers of ``width`` (16) channels, each
  followed by ``GroupNorm(G, width)`` and ReLU, a ``2 x 2`` max-pool after the second, then
  global average pooling and ``linear(width -> 4)``; ``G`` must divide ``width``;
* training (:func:`trained`): Adam (learning rate ``3e-3``) for ``steps`` (150) steps of
  ``batch`` (32) images, each image seen once, the initial weights drawn from the seed; the
  metrics are the cross-entropy and the accuracy on the 512 test images.

So the configs of a sweep differ in ``G`` only: the same steps, the same training images and
initial draw per seed, the same test set.  Every random source is a seeded
``torch.Generator`` or ``torch.manual_seed``; with one thread the numbers are the same on
every run of the same machine, and float32 training makes their last digits depend on the
CPU's kernels.  The chapter runs :data:`SWEEP` through
:func:`normcore.experiments.runner.run` (seeds, intervals, the cache).
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from .. import axes
from .. import nn as ncnn
from .runner import Experiment

__all__ = ["stripes", "gn_cnn", "trained", "SWEEP", "NUM_CLASSES", "TEST_SEED"]

NUM_CLASSES = 4
#: The seed of the test images, shared by every run.
TEST_SEED = 999


def stripes(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images ``(n, 1, 8, 8)`` of four stripe orientations in noise, and their labels,
    drawn from ``gen``."""
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    h, w = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    coord = torch.stack([h, w, h + w, h - w])[labels]          # (n, 8, 8), one per class
    phase = torch.rand(n, 1, 1, generator=gen) * 6.3
    contrast = 0.3 + torch.rand(n, 1, 1, generator=gen)
    noise = 0.8 * torch.randn(n, 8, 8, generator=gen)
    images = contrast * torch.sin(coord * 1.3 + phase) + noise
    return images[:, None], labels


def gn_cnn(G: int, width: int = 16) -> torch.nn.Sequential:
    """Three ``conv3x3(width)`` - ``GroupNorm(G, width)`` - ReLU blocks, a max-pool after the
    second, global average pooling and a linear classifier; ``G`` must divide ``width``."""
    axes.check_num_groups(G, width, where=f"gn_cnn(G={G!r}, width={width})")
    nn = torch.nn

    def conv(c_in: int) -> torch.nn.Conv2d:
        return nn.Conv2d(c_in, width, 3, padding=1, bias=False)

    return nn.Sequential(
        conv(1), ncnn.GroupNorm(G, width), nn.ReLU(),
        conv(width), ncnn.GroupNorm(G, width), nn.ReLU(), nn.MaxPool2d(2),
        conv(width), ncnn.GroupNorm(G, width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, NUM_CLASSES))


def trained(seed: int, G: int, steps: int = 150, batch: int = 32, width: int = 16,
            lr: float = 3e-3, n_test: int = 512) -> dict[str, float]:
    """Train :func:`gn_cnn` (``G`` groups) with Adam for ``steps`` steps of ``batch`` fresh
    images; return the loss and the accuracy on ``n_test`` held-out images."""
    gen = torch.Generator().manual_seed(100 + seed)
    x_train, y_train = stripes(steps * batch, gen)
    x_test, y_test = stripes(n_test, torch.Generator().manual_seed(TEST_SEED))
    torch.manual_seed(seed)               # the initial weights: the same for every G
    net = gn_cnn(G, width)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for t in range(steps):
        sl = slice(t * batch, (t + 1) * batch)
        loss = TF.cross_entropy(net(x_train[sl]), y_train[sl])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        out = net(x_test)
    return {"test_loss": float(TF.cross_entropy(out, y_test)),
            "test_accuracy": float((out.argmax(1) == y_test).float().mean())}


#: The chapter's sweep: configs ``{"G": ...}`` (and optionally ``steps``, ``batch``, ``width``).
SWEEP = Experiment("group.sweep", trained,
                   held_equal="150 Adam steps of batch 32, the same training images and "
                              "initial weights per seed, the same 512 test images")
