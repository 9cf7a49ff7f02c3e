"""InstanceNorm's chapter in the package: adaptive_instance_norm (its statistics, alpha,
AdaIN(x, x) == x, gradients, bad input), InstanceNorm's identities with BatchNorm, GroupNorm and
LayerNorm across 1-D, 2-D and 3-D shapes, torch's module quirks, and the AdaIN checker (every
misconception diagnosed as itself; the student functions are shared with test_exercises.py)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
from normcore import exercises as ex
from normcore import nn as ncnn

f64 = torch.float64
SHAPES = [(2, 3, 7), (3, 2, 4, 5), (2, 3, 2, 3, 4), (1, 1, 2), (4, 5, 1, 3)]


def _x(shape, seed=0, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    scale = 0.5 + torch.rand(shape[:2] + (1,) * (len(shape) - 2), generator=g, dtype=f64)
    shift = torch.randn(shape[:2] + (1,) * (len(shape) - 2), generator=g, dtype=f64)
    return (shift + scale * torch.randn(shape, generator=g, dtype=f64)).to(dtype)


# =======================================================================================
# the identities
# =======================================================================================
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_in_is_bn_on_a_batch_of_one(shape):
    x = _x(shape)
    ref = F.instance_norm(x)
    per_sample = torch.cat([F.batch_norm(x[n:n + 1], None, None, training=True)
                            for n in range(shape[0])])
    flat = F.batch_norm(x.reshape(1, -1, *shape[2:]), None, None, training=True)
    assert torch.allclose(per_sample, ref, rtol=0, atol=1e-12)
    assert torch.allclose(flat.reshape(shape), ref, rtol=0, atol=1e-12)
    assert torch.allclose(TF.instance_norm(x), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_in_is_gn_with_one_channel_per_group(shape):
    x = _x(shape, 1)
    w, b = torch.rand(shape[1], dtype=f64) + 0.5, torch.randn(shape[1], dtype=f64)
    ref = F.instance_norm(x, weight=w, bias=b)
    assert torch.allclose(F.group_norm(x, shape[1], w, b), ref, rtol=0, atol=1e-12)
    # and through the hand-derived Function (taken when a gradient is needed)
    derived = F.group_norm(x.requires_grad_(True), shape[1], w, b).detach()
    assert torch.allclose(derived, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_in_is_ln_over_the_positions(shape):
    x = _x(shape, 2)
    ref = F.instance_norm(x)
    assert torch.allclose(F.layer_norm(x, shape[2:]), ref, rtol=0, atol=1e-12)
    assert torch.allclose(TF.layer_norm(x, shape[2:]), ref, rtol=0, atol=1e-12)


# =======================================================================================
# invariance
# =======================================================================================
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_per_channel_affine_invariance_up_to_eps(shape):
    x = _x(shape, 3)
    cs = shape[:2] + (1,) * (len(shape) - 2)
    a = 0.2 + 3 * torch.rand(cs, dtype=f64)
    b = torch.randn(cs, dtype=f64)
    assert torch.allclose(F.instance_norm(a * x + b, eps=1e-12), F.instance_norm(x, eps=1e-12),
                          rtol=0, atol=1e-8)
    var = x.var(tuple(range(2, len(shape))), unbiased=False, keepdim=True)
    factor = torch.sqrt((var + 1e-5) / (var + 1e-5 / a ** 2))
    assert torch.allclose(F.instance_norm(a * x + b), F.instance_norm(x) * factor,
                          rtol=0, atol=1e-12)


# =======================================================================================
# AdaIN
# =======================================================================================
@pytest.mark.parametrize("shape, style_spatial", [((2, 3, 7), (5,)), ((2, 3, 4, 5), (6, 2)),
                                                  ((1, 2, 2, 3, 4), (3, 3, 3))], ids=str)
def test_adain_output_has_the_style_statistics(shape, style_spatial):
    x = _x(shape, 4)
    y = 3 + 2 * _x(shape[:2] + style_spatial, 5)
    out = F.adaptive_instance_norm(x, y)
    assert out.shape == x.shape and out.dtype == x.dtype
    mu_o, s_o = F.instance_stats(out)
    mu_y, s_y = F.instance_stats(y)
    _, s_x = F.instance_stats(x)
    assert torch.allclose(mu_o, mu_y, rtol=0, atol=1e-12)
    exact = torch.sqrt(s_y ** 2 + 1e-5) * torch.sqrt(s_x ** 2 / (s_x ** 2 + 1e-5))
    assert torch.allclose(s_o, exact, rtol=1e-10)
    assert torch.allclose(s_o, s_y, rtol=1e-3)


def test_adain_of_itself_is_the_identity_and_alpha_interpolates():
    x, y = _x((2, 3, 4, 5), 6), 1 + _x((2, 3, 3, 3), 7)
    assert torch.allclose(F.adaptive_instance_norm(x, x), x, rtol=0, atol=1e-12)
    assert torch.equal(F.adaptive_instance_norm(x, y, 0.0), x)
    full = F.adaptive_instance_norm(x, y)
    mu_x, s_x = F.instance_stats(x, 1e-5)
    mu_y, s_y = F.instance_stats(y, 1e-5)
    xhat = F.instance_norm(x)
    for a in (0.25, 0.5, 0.9):
        mixed = F.adaptive_instance_norm(x, y, a)
        assert torch.allclose(mixed, a * full + (1 - a) * x, rtol=0, atol=1e-12)
        stats = (a * s_y + (1 - a) * s_x) * xhat + a * mu_y + (1 - a) * mu_x
        assert torch.allclose(mixed, stats, rtol=0, atol=1e-12)


def test_adain_gradients():
    x = _x((2, 3, 3, 4), 8).requires_grad_()
    y = (1 + _x((2, 3, 4, 2), 9)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: F.adaptive_instance_norm(a, b, 0.7), (x, y))
    # the style receives a gradient through its statistics
    g, = torch.autograd.grad(F.adaptive_instance_norm(x, y).sum(), y)
    assert g.abs().sum() > 0


def test_adain_low_precision_and_mixed_dtypes():
    x, y = _x((1, 2, 4, 4), 10), _x((1, 2, 3, 3), 11)
    ref = F.adaptive_instance_norm(x, y)
    out16 = F.adaptive_instance_norm(x.to(torch.bfloat16), y.to(torch.bfloat16))
    assert out16.dtype == torch.bfloat16
    assert torch.allclose(out16.double(), ref, atol=0.05)
    mixed = F.adaptive_instance_norm(x.float(), y)
    assert mixed.dtype == torch.float32 and torch.allclose(mixed.double(), ref, atol=1e-5)


@pytest.mark.parametrize("content, style, alpha, err, words", [
    (torch.randn(2, 3), torch.randn(2, 3, 4), 1.0, ValueError, "spatial dim"),
    (torch.randn(2, 3, 4), torch.randn(2, 3), 1.0, ValueError, "spatial dim"),
    (torch.randn(2, 3, 4, 4), torch.randn(2, 4, 4, 4), 1.0, ValueError, "N and C must agree"),
    (torch.randn(2, 3, 4, 4), torch.randn(1, 3, 4, 4), 1.0, ValueError, "N and C must agree"),
    (torch.zeros(1, 3, 4, dtype=torch.long), torch.randn(1, 3, 4), 1.0, TypeError,
     "floating-point"),
    (torch.randn(1, 3, 4), torch.zeros(1, 3, 4, dtype=torch.uint8), 1.0, TypeError,
     "floating-point"),
    (torch.randn(1, 3, 1, 1), torch.randn(1, 3, 4, 4), 1.0, ValueError, "spatial element"),
    (torch.randn(1, 3, 4, 4), torch.randn(1, 3, 1), 1.0, ValueError, "spatial element"),
    (torch.randn(1, 3, 4), torch.randn(1, 3, 4), 1.5, ValueError, "alpha"),
    (torch.randn(1, 3, 4), torch.randn(1, 3, 4), True, ValueError, "alpha"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_adain_bad_input(content, style, alpha, err, words):
    with pytest.raises(err, match=words):
        F.adaptive_instance_norm(content, style, alpha)


def test_instance_norm_bad_input():
    with pytest.raises(ValueError, match="spatial dim"):
        F.instance_norm(torch.randn(4, 3))
    with pytest.raises(ValueError, match="spatial element"):
        F.instance_norm(torch.randn(4, 3, 1, 1))
    with pytest.raises(TypeError, match="floating-point"):
        F.instance_norm(torch.zeros(1, 3, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="spatial element"):
        ncnn.InstanceNorm1d(3)(torch.randn(2, 3, 1))
    # eval mode with running statistics needs no spatial extent
    m = ncnn.InstanceNorm2d(3, track_running_stats=True).eval()
    assert m(torch.randn(2, 3, 1, 1)).shape == (2, 3, 1, 1)


# =======================================================================================
# the module flags, against torch
# =======================================================================================
def test_defaults_and_momentum_none_match_torch():
    for cls in (ncnn.InstanceNorm1d, ncnn.InstanceNorm2d, ncnn.InstanceNorm3d):
        m = cls(3)
        assert m.affine is False and m.track_running_stats is False
        assert list(m.parameters()) == [] and list(m.state_dict()) == []
    x = torch.randn(4, 3, 5, 5)
    ours = ncnn.InstanceNorm2d(3, track_running_stats=True, momentum=None)
    theirs = torch.nn.InstanceNorm2d(3, track_running_stats=True, momentum=None)
    for _ in range(3):
        assert torch.allclose(ours(x), theirs(x), atol=1e-6)
    for m in (ours, theirs):
        assert torch.equal(m.running_mean, torch.zeros(3))
        assert torch.equal(m.running_var, torch.ones(3))
        assert int(m.num_batches_tracked) == 0
    ours.eval(), theirs.eval()
    assert torch.allclose(ours(x), theirs(x), atol=1e-6)
    assert torch.allclose(ours(x), x / math.sqrt(1 + 1e-5), atol=1e-6)


# =======================================================================================
# the AdaIN checker: student functions (used by test_exercises.py as well)
# =======================================================================================
def _stats(t, eps, *, dims=None, correction=0, eps_mode="inside", with_eps=True):
    dims = tuple(range(2, t.dim())) if dims is None else dims(t)
    n = math.prod(t.shape[d] for d in dims)
    mean = t.mean(dims, keepdim=True)
    var = ((t - mean) ** 2).sum(dims, keepdim=True) / (n - correction)
    if not with_eps:
        return mean, var.sqrt()
    return mean, ((var + eps).sqrt() if eps_mode == "inside" else var.sqrt() + eps)


def adain_correct(content, style, eps):
    mx, sx = _stats(content, eps)
    my, sy = _stats(style, eps)
    return sy * (content - mx) / sx + my


def adain_via_instance_norm(content, style, eps):
    my, sy = _stats(style, eps)
    return sy * TF.instance_norm(content, eps=eps) + my


def adain_identity(content, style, eps):          # the style's statistics never used
    return content.clone()


def adain_stats_swapped(content, style, eps):
    mx, sx = _stats(content, eps)
    my, sy = _stats(style, eps)
    return sx * (content - my) / sy + mx


def adain_args_swapped(content, style, eps):
    return adain_correct(style, content, eps)


def adain_over_batch(content, style, eps):
    def dims(t):
        return (0,) + tuple(range(2, t.dim()))
    mx, sx = _stats(content, eps, dims=dims)
    my, sy = _stats(style, eps, dims=dims)
    return sy * (content - mx) / sx + my


def adain_over_channels(content, style, eps):
    def dims(t):
        return tuple(range(1, t.dim()))
    mx, sx = _stats(content, eps, dims=dims)
    my, sy = _stats(style, eps, dims=dims)
    return sy * (content - mx) / sx + my


def adain_unbiased(content, style, eps):          # the widely copied calc_mean_std
    n, c = content.shape[:2]
    def calc(t):
        var = t.reshape(n, c, -1).var(dim=2) + eps
        shape = (n, c) + (1,) * (t.dim() - 2)
        return t.reshape(n, c, -1).mean(dim=2).view(shape), var.sqrt().view(shape)
    mx, sx = calc(content)
    my, sy = calc(style)
    return sy * (content - mx) / sx + my


def adain_eps_outside(content, style, eps):
    mx, sx = _stats(content, eps, eps_mode="outside")
    my, sy = _stats(style, eps, eps_mode="outside")
    return sy * (content - mx) / sx + my


def adain_no_eps(content, style, eps):
    return adain_correct(content, style, 0.0)


def adain_style_without_eps(content, style, eps):
    mx, sx = _stats(content, eps)
    my, sy = _stats(style, eps, with_eps=False)
    return sy * (content - mx) / sx + my


ADAIN = "adaptive_instance_norm"
ADAIN_DIAGNOSES = [
    (ADAIN, adain_identity, {}, ("adain_style_from_content",), ["the content, unchanged"]),
    (ADAIN, adain_stats_swapped, {}, ("adain_stats_swapped",), ["std(content) * (content"]),
    (ADAIN, adain_over_batch, {}, ("adain_batch_set",), ["(N, H, W)", "BatchNorm"]),
    (ADAIN, adain_over_channels, {}, ("adain_layer_set",), ["(C, H, W)", "LayerNorm"]),
    (ADAIN, adain_over_channels, {"ndims": (3,)}, ("adain_layer_set",), ["(C, L)"]),
    (ADAIN, adain_unbiased, {}, ("unbiased_var",), ["widely copied AdaIN code"]),
    (ADAIN, adain_eps_outside, {}, ("eps_outside_sqrt",), ["AdaIN divides"]),
    (ADAIN, adain_no_eps, {}, ("no_eps",), ["left eps out"]),
    (ADAIN, adain_style_without_eps, {}, ("adain_style_no_eps",), ["sqrt(var(style))"]),
]
ADAIN_CORRECT = [
    (ADAIN, adain_correct, {}),
    (ADAIN, adain_via_instance_norm, {"ndims": (3, 4)}),
]


@pytest.mark.parametrize("fn, options, keys", [(d[1], d[2], d[3]) for d in ADAIN_DIAGNOSES],
                         ids=[d[1].__name__ for d in ADAIN_DIAGNOSES])
def test_adain_mistake_is_named(fn, options, keys):
    report = ex.check(ADAIN, fn, **options)
    assert report.kind == "misconception" and report.misconceptions == keys, str(report)


def test_adain_args_swapped_is_a_shape_error_that_says_so():
    report = ex.check(ADAIN, adain_args_swapped)
    assert report.kind == "shape", str(report)
    assert "content and style were swapped" in " ".join(str(report).split())


@pytest.mark.parametrize("fn, options", [(c[1], c[2]) for c in ADAIN_CORRECT],
                         ids=[c[1].__name__ for c in ADAIN_CORRECT])
def test_adain_correct_passes(fn, options):
    report = ex.check(ADAIN, fn, **options)
    assert report.passed, str(report)


def test_adain_reference_and_catalogue():
    assert ex.signature(ADAIN) == "f(content, style, eps)"
    assert ex.check(ADAIN, ex.reference(ADAIN)).passed
    keys = {m.key for m in ex.catalogue(ADAIN)}
    assert {"adain_style_from_content", "adain_stats_swapped", "adain_batch_set",
            "adain_layer_set", "unbiased_var", "no_eps", "adain_style_no_eps"} <= keys
    assert "AdaIN = adaptive_instance_norm" in " ".join(ex.catalogue_table().split())
    # the instance_norm checker names BN's and LN's sets and the unbiased variance
    def in_over(dims_of, correction=0):
        def fn(x, gamma, beta, eps):
            dims = dims_of(x)
            m = x.mean(dims, keepdim=True)
            n = math.prod(x.shape[d] for d in dims)
            v = ((x - m) ** 2).sum(dims, keepdim=True) / (n - correction)
            shape = [1, -1] + [1] * (x.dim() - 2)
            return gamma.view(shape) * (x - m) / torch.sqrt(v + eps) + beta.view(shape)
        return fn
    for dims_of, words in ((lambda x: (0,) + tuple(range(2, x.dim())), "BatchNorm"),
                           (lambda x: tuple(range(1, x.dim())), "LayerNorm")):
        report = ex.check("instance_norm", in_over(dims_of))
        assert report.misconception == "wrong_axes" and words in str(report), str(report)
    report = ex.check("instance_norm", in_over(lambda x: tuple(range(2, x.dim())), 1))
    assert report.misconception == "unbiased_var", str(report)
