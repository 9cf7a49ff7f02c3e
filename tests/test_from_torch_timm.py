"""``from_torch`` on timm's layers that are not torch norms: its convolutions with
standardized weights (swapped for normcore's where the math is the same) and its blocks whose
names say Norm without being norm layers (left alone, without a warning).

The first tests use minimal faithful copies of timm's classes (timm/layers/std_conv.py,
timm/models/nfnet.py, timm/layers/classifier.py of timm 1.0.31), so that they run where timm
is not installed; ``from_torch`` knows timm's WS convolutions by module and class name, so
the copies answer to timm's module.  The last test builds real timm models, where timm can be
imported: it is not in requirements.txt, since timm requires torchvision, whose wheels on
PyPI are built against torch's CUDA libraries and do not load with the CPU torch 2.13.0 that
the project pins (``import torchvision`` fails: "operator torchvision::nms does not exist").
"""
from __future__ import annotations

import copy
import math
import pickle
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


# from_torch knows timm's WS convolutions by their module and class name
for _cls in (StdConv2d, StdConv2dSame, ScaledStdConv2d):
    _cls.__module__ = "timm.layers.std_conv"


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


def test_timms_ws_convolutions_become_normcores_with_the_same_outputs_and_gradients():
    model = NormFreeNet().double()
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    before = _run(model, x)
    params = list(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, swap = nn.from_torch(model, report=True)
    assert [path for path, _, _ in swap.swapped] == [
        "stem", "stages.0.conv1", "stages.0.conv2", "stages.1.conv1", "stages.1.conv2", "same",
        "head.norm"]
    assert isinstance(model.stem, nn.WSConv2d) and isinstance(model.stem, StdConv2d)
    assert isinstance(model.same, nn.WSConv2d) and isinstance(model.same, StdConv2dSame)
    assert model.stem.convention == "timm" and model.stem.ws_eps == model.stem.eps == 1e-6
    conv1 = model.stages[0].conv1
    assert isinstance(conv1, nn.ScaledStdConv2d) and isinstance(conv1, ScaledStdConv2d)
    assert conv1.gamma == pytest.approx(1.7)
    assert list(model.parameters()) == params     # the same tensors
    _same(_run(model, x), before, tol=1e-12)      # float64: the same math
    # normcore's forward runs: its standardized weight is what the conv uses
    w = TF.batch_norm(model.stem.weight.reshape(1, 8, -1), None, None, training=True,
                      eps=1e-6).reshape_as(model.stem.weight)
    torch.testing.assert_close(model.stem.standardized_weight(), w, rtol=0, atol=1e-12)
    # and back: timm's classes, the same objects
    nn.to_torch(model)
    assert type(model.stem) is StdConv2d and type(model.stages[0].conv1) is ScaledStdConv2d
    _same(_run(model, x), before, tol=1e-12)


def test_ws_twins_deepcopy():
    # (and pickle: below, with timm's own classes, which pickle can import by name)
    model = tnn.Sequential(StdConv2d(3, 4, 3), ScaledStdConv2d(4, 4, 3))
    nn.from_torch(model)
    x = torch.randn(2, 3, 6, 6)
    clone = copy.deepcopy(model)
    assert [type(m) for m in clone] == [type(m) for m in model]
    torch.testing.assert_close(clone(x), model(x))


def test_a_same_conv_that_pads_in_its_forward_is_left_as_timms_and_named():
    model = tnn.Sequential(StdConv2dSame(3, 4, 3, stride=2), StdConv2d(4, 4, 3))
    x = torch.randn(2, 3, 9, 9)
    before = model(x)
    with pytest.warns(UserWarning, match=r"0 \(StdConv2dSame\): its forward pads the input"):
        _, swap = nn.from_torch(model, report=True)
    assert type(model[0]) is StdConv2dSame and isinstance(model[1], nn.WSConv2d)
    assert swap.skipped == [("0", StdConv2dSame)]
    torch.testing.assert_close(model(x), before)


def test_a_conv_named_like_timms_elsewhere_is_not_taken_for_timms():
    class StdConv2d(tnn.Conv2d):   # BiT's own: eps=1e-10, and not timm's class
        def forward(self, x):
            v, m = torch.var_mean(self.weight, dim=(1, 2, 3), keepdim=True, unbiased=False)
            return TF.conv2d(x, (self.weight - m) / torch.sqrt(v + 1e-10), self.bias)

    model = tnn.Sequential(StdConv2d(3, 4, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, swap = nn.from_torch(model, report=True)
    assert swap == ([], []) and type(model[0]) is StdConv2d


@pytest.mark.parametrize("name", ["resnetv2_50x1_bit", "nf_resnet26"])
def test_a_real_timm_model_with_ws_convolutions(name):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10).eval()
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"StdConv2d", "GroupNormAct"} <= kinds if name.startswith("resnetv2") else \
        {"ScaledStdConv2d", "NormFreeBlock", "NormFreeNet"} <= kinds
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        before = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # nothing skipped, nothing to say
        _, swap = nn.from_torch(model, report=True)
        with torch.no_grad():
            after = model(x)
    assert swap.skipped == []
    ws = [m for m in model.modules() if isinstance(m, (nn.WSConv2d, nn.ScaledStdConv2d))]
    assert len(ws) == sum(1 for _, old, _ in swap.swapped if "StdConv" in old.__name__) > 10
    _same([after], [before], tol=1e-4)       # float32 through some 50 layers
    with torch.no_grad():
        _same([pickle.loads(pickle.dumps(model))(x)], [after], tol=0)
