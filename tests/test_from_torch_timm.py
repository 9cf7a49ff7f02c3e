"""``from_torch`` on timm's blocks whose names say Norm without being norm layers (left
alone, without a warning).

The tests use minimal faithful copies of timm's classes (timm/layers/std_conv.py,
timm/models/nfnet.py, timm/layers/classifier.py of timm 1.0.31), so that they run where timm
is not installed.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as TF
from torch import nn as tnn

import normcore.nn as nn

torch.set_num_threads(1)


# --- minimal faithful copies of timm's classes ---------------------------------------------
def _padding(kernel_size, stride=1, dilation=1):   # timm's get_padding
    return ((stride - 1) + dilation * (kernel_size - 1)) // 2


def _standardized(conv, gain=None):
    """timm's WS: F.batch_norm over each filter (biased variance, eps under the root)."""
    return TF.batch_norm(conv.weight.reshape(1, conv.out_channels, -1), None, None,
                         weight=gain, training=True, momentum=0.0,
                         eps=conv.eps).reshape_as(conv.weight)


class StdConv2d(tnn.Conv2d):
    def __init__(self, in_channel, out_channels, kernel_size, stride=1, padding=None,
                 dilation=1, groups=1, bias=False, eps=1e-6):
        if padding is None:
            padding = _padding(kernel_size, stride, dilation)
        super().__init__(in_channel, out_channels, kernel_size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups, bias=bias)
        self.eps = eps

    def forward(self, x):
        return TF.conv2d(x, _standardized(self), self.bias, self.stride, self.padding,
                         self.dilation, self.groups)


class StdConv2dSame(tnn.Conv2d):
    """'SAME' padding: static where stride 1 allows it, else the forward pads (same_pad)."""

    def __init__(self, in_channel, out_channels, kernel_size, stride=1, dilation=1,
                 groups=1, bias=False, eps=1e-6):
        dynamic = not (stride == 1 and (dilation * (kernel_size - 1)) % 2 == 0)
        padding = 0 if dynamic else _padding(kernel_size, stride, dilation)
        super().__init__(in_channel, out_channels, kernel_size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups, bias=bias)
        self.same_pad = dynamic
        self.eps = eps

    def forward(self, x):
        if self.same_pad:
            (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.stride, self.dilation
            ih, iw = x.shape[-2:]
            ph = max((math.ceil(ih / sh) - 1) * sh + (kh - 1) * dh + 1 - ih, 0)
            pw = max((math.ceil(iw / sw) - 1) * sw + (kw - 1) * dw + 1 - iw, 0)
            x = TF.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return TF.conv2d(x, _standardized(self), self.bias, self.stride, self.padding,
                         self.dilation, self.groups)


class ScaledStdConv2d(tnn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=None,
                 dilation=1, groups=1, bias=True, gamma=1.0, eps=1e-6, gain_init=1.0):
        if padding is None:
            padding = _padding(kernel_size, stride, dilation)
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups, bias=bias)
        self.scale = gamma * self.weight[0].numel() ** -0.5
        self.eps = eps
        self.gain_init = gain_init
        self.gain = tnn.Parameter(torch.full((self.out_channels, 1, 1, 1), gain_init))

    def forward(self, x):
        weight = _standardized(self, (self.gain * self.scale).view(-1))
        return TF.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation,
                         self.groups)


class LayerNorm2d(tnn.LayerNorm):
    """timm's: LayerNorm over the channels of NCHW."""

    def forward(self, x):
        x = TF.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                          self.eps)
        return x.permute(0, 3, 1, 2)


class NormFreeBlock(tnn.Module):
    """timm's name, and its make-up: scaled WS convolutions, an activation, a skip; no norm."""

    def __init__(self, chs, alpha=0.2):
        super().__init__()
        self.alpha = alpha
        self.conv1 = ScaledStdConv2d(chs, chs, 3, gamma=1.7)
        self.act = tnn.ReLU()
        self.conv2 = ScaledStdConv2d(chs, chs, 3, gamma=1.7)

    def forward(self, x):
        return x + self.alpha * self.conv2(self.act(self.conv1(self.act(x))))


class NormMlpClassifierHead(tnn.Module):
    """timm's: pooling, a norm (LayerNorm2d), a linear layer."""

    def __init__(self, in_features, num_classes):
        super().__init__()
        self.norm = LayerNorm2d(in_features)
        self.fc = tnn.Linear(in_features, num_classes)

    def forward(self, x):
        return self.fc(self.norm(x.mean((2, 3), keepdim=True)).flatten(1))


class NormFreeNet(tnn.Module):
    def __init__(self, chs=8, num_classes=5):
        super().__init__()
        torch.manual_seed(0)
        self.stem = StdConv2d(3, chs, 3, stride=2)
        self.stages = tnn.Sequential(NormFreeBlock(chs), NormFreeBlock(chs))
        self.same = StdConv2dSame(chs, chs, 3)                   # static padding
        self.head = NormMlpClassifierHead(chs, num_classes)

    def forward(self, x):
        return self.head(self.same(self.stages(self.stem(x))))


def _run(model, x):
    """The output and every parameter's gradient (a fixed random weighting of the output)."""
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    out = model(x)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in model.parameters()]


def _same(got, ref, tol=1e-5):
    for a, b in zip(got, ref, strict=True):
        err = (a - b).norm() / b.norm().clamp_min(1e-30)
        assert err <= tol, f"relative error {err:.2e}"


# --- the tests -------------------------------------------------------------------------
def test_blocks_whose_names_say_norm_are_left_alone_without_a_warning():
    model = NormFreeNet()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, swap = nn.from_torch(model, report=True)
    assert swap.skipped == []
    for block in (model, *model.stages, model.head):
        assert type(block) in (NormFreeNet, NormFreeBlock, NormMlpClassifierHead)
    # the norm inside the head is swapped by the same walk
    assert isinstance(model.head.norm, nn.LayerNorm) and isinstance(model.head.norm, LayerNorm2d)


def test_a_norm_without_a_twin_is_still_named():
    class FrozenBatchNorm2d(tnn.Module):   # torchvision's: buffers only, no torch base
        def __init__(self, n):
            super().__init__()
            for name in ("weight", "bias", "running_mean", "running_var"):
                self.register_buffer(name, torch.ones(n))

    model = tnn.Sequential(tnn.Conv2d(3, 4, 1), FrozenBatchNorm2d(4))
    with pytest.warns(UserWarning, match=r"1 \(FrozenBatchNorm2d\)"):
        _, swap = nn.from_torch(model, report=True)
    assert swap.skipped == [("1", FrozenBatchNorm2d)]
