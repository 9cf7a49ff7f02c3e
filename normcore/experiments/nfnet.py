r"""A small normalizer-free ResNet against the same ResNet with BatchNorm (chapter 9).

The claim behind it (Brock et al. 2021a, 2021b): a residual network trains without any
normalization of its activations if every block keeps the signal's variance known and small,
and every convolution uses Scaled Weight Standardization.  An NF-ResNet's residual stream is

.. math:: h_{i+1} = h_i + \alpha_{\mathrm{NF}}\, f_i(h_i / \beta_i),

where :math:`\beta_i = \sqrt{\operatorname{Var}(h_i)}` is the variance the stream is *expected*
to have at block :math:`i` (computed, not measured), so that the branch :math:`f_i` sees
inputs of variance 1, and :math:`\alpha_{\mathrm{NF}}` (0.2) sets how much each branch adds:
:math:`\operatorname{Var}(h_{i+1}) = \operatorname{Var}(h_i) + \alpha_{\mathrm{NF}}^2`.  At a
transition (a block that changes the width or the resolution) the shortcut is a convolution
of :math:`h_i/\beta_i`, so the variance starts again from :math:`1 + \alpha_{\mathrm{NF}}^2`.
Every convolution is a :class:`normcore.nn.ScaledStdConv2d`; those after a ReLU take the gain
:math:`\gamma = \sqrt{2/(1 - 1/\pi)}` that brings a ReLU's output back to variance 1.

In miniature, on the 8 x 8 handwritten digits (:func:`normcore.datasets.digits`):

* the model (:func:`resnet`): a ``3 x 3`` stem convolution to ``width`` (8) channels, a
  stage of ``blocks`` (2) pre-activation residual blocks at 8 x 8, a transition block to
  ``2 width`` channels at 4 x 4 (stride 2, a ``1 x 1`` convolution on the shortcut) and
  ``blocks - 1`` more blocks; each branch is ReLU, ``conv 3x3``, ReLU, ``conv 3x3``; then a
  final ReLU, global average pooling and ``linear(2 width -> 10)``.  ``"bn"`` puts a
  :class:`normcore.nn.BatchNorm2d` before each ReLU (He et al.'s pre-activation ResNet) and
  uses plain convolutions; ``"nf"`` has no norm layer, the scalings above and Scaled WS;
  ``"nf-plain"`` is ``"nf"`` with plain convolutions (no WS), to show what WS is for;
* the signal propagation (:func:`signal_propagation`): at initialization, on a batch of
  digits, the average over channels of each channel's squared mean and variance of the
  residual stream after every block, the measurements of Brock et al.'s signal propagation
  plots, beside the variance the NF-ResNet expects (:func:`expected_variances`);
* training (:func:`trained`): SGD with Nesterov momentum 0.9 and a cosine learning rate from
  ``lr`` (0.05) to 0 over ``steps`` (100) steps of ``batch`` (64) images drawn with
  replacement from the 1,437 training digits (standardized with the training set's mean and
  standard deviation); the accuracy on the 360 test digits, in eval mode.

At a given seed both kinds draw their convolution weights in the same order from the same
seed and see the same batches: what differs is the normalization only.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as TF

from .. import axes
from .. import nn as ncnn
from .runner import Experiment
from .training import evaluate, train_cosine

__all__ = ["KINDS", "GAMMA_RELU", "NFBlock", "resnet", "expected_variances", "digits",
           "signal_propagation", "trained", "TRAIN"]

#: The networks: with BatchNorm, normalizer-free, normalizer-free without weight standardization.
KINDS = ("bn", "nf", "nf-plain")
#: The gain that brings ReLU(z), z ~ N(0, 1), back to variance 1 (Brock et al. 2021a).
GAMMA_RELU = math.sqrt(2 / (1 - 1 / math.pi))
NUM_CLASSES = 10


def _check(where: str, kind: str, blocks: int, width: int, alpha: float) -> None:
    if kind not in KINDS:
        raise ValueError(f"{where}: unknown kind {kind!r}; choose one of "
                         + ", ".join(repr(k) for k in KINDS))
    if blocks < 1 or width < 1:
        raise ValueError(f"{where}: needs blocks >= 1 per stage and width >= 1, got "
                         f"blocks={blocks}, width={width}")
    if not alpha > 0:
        raise ValueError(f"{where}: alpha must be positive (the branch's weight), got {alpha}")


def _conv(kind: str, c_in: int, c_out: int, k: int, stride: int = 1,
          gamma: float = 1.0) -> torch.nn.Module:
    if kind == "nf":
        return ncnn.ScaledStdConv2d(c_in, c_out, k, stride=stride, padding=k // 2,
                                    gamma=gamma)
    conv = torch.nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2)
    if kind == "nf-plain":          # He's initialization: variance 1 in, variance 1 out
        with torch.no_grad():
            conv.weight.normal_(0.0, conv.weight[0].numel() ** -0.5)
            conv.bias.zero_()
    return conv


class NFBlock(torch.nn.Module):
    """One pre-activation residual block, ``h + alpha f(h / beta)`` (``"nf"``, ``"nf-plain"``)
    or ``h + f(h)`` with BatchNorm before each ReLU (``"bn"``).  With ``stride`` 2 or a new
    width, the shortcut is a ``1 x 1`` convolution of the pre-activated input."""

    def __init__(self, kind: str, c_in: int, c_out: int, stride: int = 1,
                 alpha: float = 0.2, beta: float = 1.0):
        super().__init__()
        self.kind, self.alpha, self.beta = kind, alpha, beta
        bn = kind == "bn"
        # a conv after a ReLU: Scaled WS with the ReLU's gain (NF); plain otherwise
        gain = GAMMA_RELU if kind == "nf" else 1.0
        self.conv1 = _conv(kind, c_in, c_out, 3, stride, gain)
        self.conv2 = _conv(kind, c_out, c_out, 3, 1, gain)
        self.shortcut = (_conv(kind, c_in, c_out, 1, stride, gain)
                         if stride != 1 or c_in != c_out else None)
        self.norm1 = ncnn.BatchNorm2d(c_in) if bn else torch.nn.Identity()
        self.norm2 = ncnn.BatchNorm2d(c_out) if bn else torch.nn.Identity()

    def act(self, x: torch.Tensor) -> torch.Tensor:
        # NF: the ReLU's output times the gain that restores variance 1 for the plain convs;
        # Scaled WS has that gain inside its weights instead
        return TF.relu(x) * GAMMA_RELU if self.kind == "nf-plain" else TF.relu(x)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.kind == "bn":
            out = self.act(self.norm1(h))                     # relu(BN(h))
            shortcut = h if self.shortcut is None else self.shortcut(out)
            out = self.conv2(self.act(self.norm2(self.conv1(out))))
            return shortcut + out                             # h + f(h)
        out = self.act(h / self.beta)                         # the branch sees variance 1
        shortcut = h if self.shortcut is None else self.shortcut(out)
        out = self.conv2(self.act(self.conv1(out)))
        return shortcut + self.alpha * out                    # h + alpha f(h / beta)


def expected_variances(blocks: int = 2, alpha: float = 0.2) -> list[float]:
    """The variance an NF-ResNet expects of its residual stream before each block, and after
    the last: 1 after the stem, ``+ alpha^2`` per block, ``1 + alpha^2`` after a transition."""
    var, out = 1.0, []
    layout = [False] * blocks + [True] + [False] * (blocks - 1)     # True: the transition
    for transition in layout:
        out.append(var)
        var = (1.0 if transition else var) + alpha ** 2
    return out + [var]


class ResNet(torch.nn.Module):
    """Stem, ``blocks`` blocks at ``width``, a transition to ``2 width`` at half the
    resolution, ``blocks - 1`` more blocks, a final ReLU (after BN for ``"bn"``), global
    average pooling, a linear head."""

    def __init__(self, kind: str, blocks: int = 2, width: int = 8, alpha: float = 0.2):
        super().__init__()
        _check("resnet", kind, blocks, width, alpha)
        self.kind = kind
        self.stem = _conv(kind, 1, width, 3)
        betas = [math.sqrt(v) for v in expected_variances(blocks, alpha)]
        chans = [(width, width, 1)] * blocks + [(width, 2 * width, 2)] \
            + [(2 * width, 2 * width, 1)] * (blocks - 1)
        self.blocks = torch.nn.ModuleList(
            NFBlock(kind, c_in, c_out, stride, alpha, beta)
            for (c_in, c_out, stride), beta in zip(chans, betas))
        self.final_norm = ncnn.BatchNorm2d(2 * width) if kind == "bn" else torch.nn.Identity()
        self.head = torch.nn.Linear(2 * width, NUM_CLASSES)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream after the stem and after every block."""
        h = self.stem(x)
        out = [h]
        for block in self.blocks:
            h = block(h)
            out.append(h)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)[-1]
        h = self.blocks[-1].act(self.final_norm(h))
        return self.head(h.mean((2, 3)))


def resnet(kind: str, blocks: int = 2, width: int = 8, alpha: float = 0.2) -> ResNet:
    """The network of ``kind`` (one of :data:`KINDS`)."""
    return ResNet(kind, blocks, width, alpha)


def digits() -> tuple[torch.Tensor, ...]:
    """scikit-learn's digits (:func:`normcore.datasets.digits`), standardized with the mean
    and standard deviation of the training images: ``x, y, x_test, y_test``."""
    from ..datasets import digits as load

    d = load()
    mean, std = d.x.mean(), d.x.std()
    return (d.x - mean) / std, d.y, (d.x_test - mean) / std, d.y_test


def signal_propagation(seed: int, kind: str, blocks: int = 4, width: int = 16,
                       alpha: float = 0.2, n: int = 256) -> dict[str, list[float]]:
    """At initialization (``seed``), on the first ``n`` training digits, in float64: the
    average channel squared mean and the average channel variance of the residual stream
    after the stem and after every block (``"mean_sq"``, ``"var"``), the statistics of
    Brock et al.'s signal propagation plots (a BN network in training mode, as at the first
    step)."""
    x = digits()[0][:n].double()
    torch.manual_seed(seed)
    net = resnet(kind, blocks, width, alpha).double()
    with torch.no_grad():
        feats = net.features(x)
    per_channel = axes.reduce_dims("batch", feats[0].shape)      # BatchNorm's set: N, H, W
    return {"mean_sq": [float((h.mean(per_channel) ** 2).mean()) for h in feats],
            "var": [float(h.var(per_channel, correction=0).mean()) for h in feats]}


def trained(seed: int, kind: str, steps: int = 100, batch: int = 64, lr: float = 0.05,
            blocks: int = 2, width: int = 8, alpha: float = 0.2) -> dict[str, float]:
    """Train :func:`resnet` (``kind``) and return ``test_accuracy``, ``test_loss`` and
    ``train_accuracy`` (eval mode)."""
    _check("trained", kind, blocks, width, alpha)
    x, y, x_test, y_test = digits()
    torch.manual_seed(seed)
    net = resnet(kind, blocks, width, alpha)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, nesterov=True)
    train_cosine(net, opt, x, y, steps, batch, seed)           # cosine from lr to 0
    test_accuracy, test_loss = evaluate(net, x_test, y_test)
    return {"test_accuracy": test_accuracy, "test_loss": test_loss,
            "train_accuracy": evaluate(net, x, y)[0]}


#: The chapter's runs: configs ``{"kind"}`` (and ``steps``, ``lr``, ``blocks``, ``width``).
TRAIN = Experiment("nfnet.train", trained,
                   held_equal="the steps (SGD with Nesterov momentum 0.9, a cosine learning "
                              "rate) of batch 64, the same batches and the same draw of "
                              "the convolution weights per seed, the same 360 test digits")
