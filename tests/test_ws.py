"""Weight Standardization modules: ScaledStdConv2d against timm's formula, its state_dict,
its gradients and its errors."""
import pytest
import torch
import torch.nn.functional as TF

import normcore.nn as nn
from normcore import functional


def timm_scaled_std_conv2d(x, weight, bias, gain, gamma, eps, stride, padding, dilation, groups):
    """timm.layers.std_conv.ScaledStdConv2d.forward, restated from timm's source: the weight
    is batch-normalized as one sample of C_out channels, with weight = gain * scale."""
    out_channels = weight.shape[0]
    scale = gamma * weight[0].numel() ** -0.5
    w = TF.batch_norm(weight.reshape(1, out_channels, -1), None, None,
                      weight=(gain * scale).view(-1), training=True, momentum=0.,
                      eps=eps).reshape_as(weight)
    return TF.conv2d(x, w, bias, stride, padding, dilation, groups)


def _timm_padding(k, s=1, d=1):
    return ((s - 1) + d * (k - 1)) // 2


@pytest.mark.parametrize("kw", [
    dict(),
    dict(stride=2),
    dict(gamma=1.7, eps=1e-3, gain_init=0.5),
    dict(groups=2, bias=False),
    dict(dilation=2, padding=0),
])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scaled_std_conv2d_matches_timm(kw, dtype):
    torch.manual_seed(0)
    conv = nn.ScaledStdConv2d(4, 6, 3, dtype=dtype, **kw)
    with torch.no_grad():
        conv.gain.copy_(torch.rand_like(conv.gain) + 0.5)
        conv.weight.mul_(3).add_(0.2)
    x = torch.randn(2, 4, 9, 9, dtype=dtype)
    stride, dilation = kw.get("stride", 1), kw.get("dilation", 1)
    padding = kw.get("padding", _timm_padding(3, stride, dilation))
    assert conv.padding == (padding, padding)
    ref = timm_scaled_std_conv2d(x, conv.weight, conv.bias, conv.gain, kw.get("gamma", 1.0),
                                 kw.get("eps", 1e-6), stride, padding, dilation,
                                 kw.get("groups", 1))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conv(x), ref, **tol)


def test_scaled_std_conv2d_defaults_and_formula():
    torch.manual_seed(1)
    conv = nn.ScaledStdConv2d(3, 5, (3, 1), dtype=torch.float64)
    assert conv.padding == (1, 0) and conv.bias is not None
    assert (conv.gamma, conv.eps, conv.gain_init) == (1.0, 1e-6, 1.0)
    assert torch.equal(conv.gain, torch.ones(5, 1, 1, 1, dtype=torch.float64))
    fan_in = 3 * 3 * 1
    assert conv.scale == pytest.approx(fan_in ** -0.5)
    w = conv.weight
    mean = w.mean(dim=(1, 2, 3), keepdim=True)
    var = w.var(dim=(1, 2, 3), unbiased=False, keepdim=True)
    expected = conv.gain * fan_in ** -0.5 * (w - mean) / torch.sqrt(var + 1e-6)
    torch.testing.assert_close(conv.standardized_weight(), expected, rtol=1e-13, atol=1e-13)
    # the NF-Net property: each filter has mean 0 and sum of squares gamma^2 * gain^2
    sw = conv.standardized_weight().detach()
    assert sw.mean(dim=(1, 2, 3)).abs().max() < 1e-15
    torch.testing.assert_close(sw.pow(2).sum(dim=(1, 2, 3)), torch.ones(5, dtype=torch.float64),
                               rtol=1e-4, atol=0)
    assert "gamma=1.0, eps=1e-06, gain_init=1.0" in repr(conv)
    assert type(conv).__module__ == "normcore.nn"


def test_scaled_std_conv2d_state_dict_names():
    conv = nn.ScaledStdConv2d(3, 4, 3)
    assert list(conv.state_dict()) == ["weight", "bias", "gain"]
    assert conv.gain.shape == (4, 1, 1, 1)
    other = nn.ScaledStdConv2d(3, 4, 3, bias=False)
    assert list(other.state_dict()) == ["weight", "gain"]
    twin = nn.ScaledStdConv2d(3, 4, 3)
    twin.load_state_dict(conv.state_dict())
    x = torch.randn(1, 3, 5, 5)
    torch.testing.assert_close(twin(x), conv(x), rtol=0, atol=0)
    conv.reset_parameters()
    assert torch.equal(conv.gain, torch.ones_like(conv.gain))


def test_scaled_std_conv2d_gradients():
    torch.manual_seed(2)
    conv = nn.ScaledStdConv2d(2, 3, 3, dtype=torch.float64, gamma=1.3)
    with torch.no_grad():
        conv.gain.copy_(torch.rand_like(conv.gain) + 0.5)
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64, requires_grad=True)

    def f(x, w, b, g):
        return timm_scaled_std_conv2d(x, w, b, g, 1.3, 1e-6, 1, 1, 1, 1)

    y = conv(x)
    dy = torch.randn_like(y)
    ours = torch.autograd.grad(y, (x, conv.weight, conv.bias, conv.gain), dy)
    w, b, g = (p.detach().clone().requires_grad_() for p in (conv.weight, conv.bias, conv.gain))
    x2 = x.detach().clone().requires_grad_()
    ref = torch.autograd.grad(f(x2, w, b, g), (x2, w, b, g), dy)
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)
    params = (conv.weight, conv.bias, conv.gain)

    def through_module(x, *ps):
        m = nn.ScaledStdConv2d(2, 3, 3, dtype=torch.float64, gamma=1.3)
        return torch.func.functional_call(m, dict(zip(("weight", "bias", "gain"), ps)), (x,))

    assert torch.autograd.gradcheck(through_module, (x, *params))


@pytest.mark.parametrize("kw, err, text", [
    (dict(eps=0), ValueError, "eps must be positive"),
    (dict(eps=-1e-6), ValueError, "eps must be positive"),
    (dict(eps="1e-6"), TypeError, "eps must be a positive number"),
    (dict(gamma=None), TypeError, "gamma must be a number"),
    (dict(gain_init="1"), TypeError, "gain_init must be a number"),
])
def test_scaled_std_conv2d_bad_arguments(kw, err, text):
    with pytest.raises(err, match=text):
        nn.ScaledStdConv2d(3, 4, 3, **kw)


def test_scaled_std_conv2d_bad_input():
    conv = nn.ScaledStdConv2d(3, 4, 3)
    with pytest.raises(RuntimeError, match="channels"):
        conv(torch.randn(1, 5, 6, 6))
    with pytest.raises(RuntimeError, match=r"3D \(unbatched\) or 4D"):
        conv(torch.randn(3, 6))
    # the weight goes through normcore's checks: a non-float weight is named as such
    with pytest.raises(TypeError, match="floating-point"):
        functional.weight_standardize(conv.weight.detach().long(), convention="timm")


def test_scaled_std_conv2d_uses_the_timm_convention():
    torch.manual_seed(3)
    conv = nn.ScaledStdConv2d(3, 4, 1, dtype=torch.float64, eps=1e-2)
    what = functional.weight_standardize(conv.weight, 1e-2, convention="timm")
    torch.testing.assert_close(conv.standardized_weight(), what * conv.gain * conv.scale)


def test_ws_widget_frames_do_not_move_with_scale_and_shift():
    from normcore.viz import ws as vw
    svg = vw.standardize_svg(3.0, 0.5, "original")
    assert svg.startswith("<svg") and "<title>" in svg and svg.count("<circle") == 2 * 4 * 9
    # the bottom panel (standardized) is the same for every scale and shift
    bottom = [vw.standardize_svg(a, c, "bit").split("standardized, 'bit'")[1]
              for a in (0.5, 1.0, 3.0) for c in (-0.5, 0.0, 0.5)]
    assert len(set(bottom)) == 1
    assert "std 0.943" in vw.standardize_svg(1.0, 0.0, "original")
    # notation: the shift is delta (c is the channel index), in the frame's label
    assert "aW + \u03b4" in svg and "\u03b4 = 0.5" in svg and "aW + c" not in svg


def test_ws_experiment_inputs_and_errors():
    from normcore.experiments import ws as xws
    x1, y1 = xws.stripe_images(16, seed=3)
    x2, y2 = xws.stripe_images(16, seed=3)
    assert x1.shape == (16, 1, 8, 8) and torch.equal(x1, x2) and torch.equal(y1, y2)
    assert set(y1.tolist()) <= set(range(xws.NUM_CLASSES))
    assert isinstance(xws.tiny_cnn("ws+gn", 0)[0], nn.WSConv2d)
    with pytest.raises(ValueError, match="unknown kind"):
        xws.tiny_cnn("ln", 0)


def test_ws_experiments_as_the_runner_calls_them():
    from normcore.experiments import ws as xws
    one = xws.trained(seed=0, norm="gn", batch_size=32, epochs=1)
    assert one["steps"] == 256 // 32 and 0 <= one["test_accuracy"] <= 1
    assert one == xws.trained(seed=0, norm="gn", batch_size=32, epochs=1)   # seeded
    smooth = xws.smoothing(seed=1)
    # float64 throughout: the same numbers again, and the ratios are the quotients
    assert smooth == xws.smoothing(seed=1)
    assert smooth["grad_ratio"] == smooth["grad_ws+gn"] / smooth["grad_gn"]
    assert 0 < smooth["grad_ratio"] < 1 and smooth["change_gn"] > 0
    assert xws.TRAIN.target == "normcore.experiments.ws:trained"


@pytest.mark.parametrize("make", [
    lambda: nn.WSConv2d(4, 6, 3, padding=1, dtype=torch.float64),
    lambda: nn.WSConv2d(4, 6, 3, stride=2, groups=2, bias=False, convention="bit",
                        padding_mode="reflect", padding=1, dtype=torch.float64),
    lambda: nn.ScaledStdConv2d(4, 6, 3, gamma=1.5, dtype=torch.float64),
])
def test_fold_ws_equals_the_ws_layer(make):
    from normcore.fold import fold_bn, fold_ws
    torch.manual_seed(4)
    layer = make()
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    plain = fold_ws(layer)
    assert type(plain) is torch.nn.Conv2d
    with torch.no_grad():
        assert torch.equal(plain(x), layer(x))
    bn = nn.BatchNorm2d(6, dtype=torch.float64)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    bn.eval()
    with torch.no_grad():
        torch.testing.assert_close(fold_bn(plain, bn)(x), bn(layer(x)), rtol=1e-12, atol=1e-12)


def test_fold_ws_refuses_a_plain_conv():
    from normcore.fold import fold_ws
    with pytest.raises(TypeError, match="weight-standardized Conv2d"):
        fold_ws(torch.nn.Conv2d(2, 2, 3))


@pytest.mark.parametrize("ws_cls, conv_cls, shape", [
    (nn.WSConv1d, torch.nn.Conv1d, (2, 3, 9)),
    (nn.WSConv3d, torch.nn.Conv3d, (2, 3, 5, 5, 5)),
])
@pytest.mark.parametrize("convention", ["original", "bit", "timm"])
def test_ws_conv_1d_3d_match_the_formula(ws_cls, conv_cls, shape, convention):
    torch.manual_seed(5)
    layer = ws_cls(3, 4, 3, padding=1, dtype=torch.float64, convention=convention)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = layer.weight
    dims = tuple(range(1, w.dim()))
    mean = w.mean(dim=dims, keepdim=True)
    eps = functional.WS_CONVENTIONS[convention]["eps"]
    if convention == "original":
        what = (w - mean) / (w.std(dim=dims, keepdim=True) + eps)
    else:
        what = (w - mean) / torch.sqrt(w.var(dim=dims, correction=0, keepdim=True) + eps)
    plain = conv_cls(3, 4, 3, padding=1, dtype=torch.float64)
    ref = plain._conv_forward(x, what, layer.bias)
    y = layer(x)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, layer.weight), dy)
    want = torch.autograd.grad(ref, (x, layer.weight), dy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert f"convention={convention!r}" in repr(layer) and type(layer).__module__ == "normcore.nn"


def test_convert_to_ws_swaps_every_plain_conv_in_place():
    torch.manual_seed(6)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, groups=2, bias=False),
                            nn.ScaledStdConv2d(4, 4, 3)),
        torch.nn.ConvTranspose2d(4, 2, 2))
    model.eval()
    weights = [model[0].weight, model[2][0].weight, model[2][1].weight]
    out = nn.convert_to_ws(model, "bit")
    assert out is model
    assert type(model[0]) is nn.WSConv2d and type(model[2][0]) is nn.WSConv2d
    assert type(model[2][1]) is nn.ScaledStdConv2d and type(model[3]) is torch.nn.ConvTranspose2d
    assert model[0].weight is weights[0] and model[2][0].weight is weights[1]   # same tensors
    assert model[2][0].groups == 2 and model[2][0].bias is None and model[0].padding == (1, 1)
    assert model[0].convention == "bit" and not model[0].training
    x = torch.randn(1, 3, 8, 8)
    manual = TF.conv2d(x, functional.weight_standardize(weights[0], convention="bit"),
                       model[0].bias, padding=1)
    torch.testing.assert_close(model[0](x), manual)
    single = nn.convert_to_ws(torch.nn.Conv1d(2, 3, 3))
    assert type(single) is nn.WSConv1d
    with pytest.raises(ValueError, match="fan-in of 1"):
        nn.convert_to_ws(torch.nn.Conv2d(4, 4, 1, groups=4))
    with pytest.raises(ValueError, match="unknown convention"):
        nn.convert_to_ws(torch.nn.Conv2d(4, 4, 3), "bn")
    with pytest.raises(ValueError, match="eps must be positive"):
        nn.convert_to_ws(torch.nn.Conv2d(4, 4, 3), ws_eps=0.0)
