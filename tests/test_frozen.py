"""BatchNorm and InstanceNorm with the running statistics (eval mode): normcore.frozen's
Function against torch's kernel, on every layout it takes, its gradients and its rounding."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from torch.testing import assert_close

import normcore.functional as F
import normcore.nn as nn
from normcore import axes, frozen
from normcore.errors import ArgumentError

FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def _inputs(shape, fmt=None, dtype=torch.float32, mean_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    C = shape[1]
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5
    rm = torch.randn(C, generator=g, dtype=torch.float64) * mean_scale
    rv = torch.rand(C, generator=g, dtype=torch.float64) + 0.25
    w = torch.rand(C, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(C, generator=g, dtype=torch.float64)
    if mean_scale > 1:                       # x around the running mean, as after training
        x = x + rm.view((1, C) + (1,) * (len(shape) - 2))
    x = x.to(dtype)
    if fmt is not None:
        x = x.contiguous(memory_format=fmt)
    return x, rm.to(dtype), rv.to(dtype), w.to(dtype), b.to(dtype)


def _both(fn_ours, fn_torch, x, params, dy=None):
    """Outputs and gradients (x and every param) of both, from the same upstream gradient."""
    out = []
    for fn in (fn_ours, fn_torch) if fn_torch is not None else (fn_ours,):
        xs = x.detach().clone().requires_grad_(True)
        ps = [p.detach().clone().requires_grad_(True) for p in params]
        y = fn(xs, *ps)
        d = torch.randn(y.shape, generator=torch.Generator().manual_seed(1),
                        dtype=y.dtype) if dy is None else dy
        y.backward(d)
        out.append((y, xs.grad, *[p.grad for p in ps]))
    return out


CASES = [((8, 16), None), ((8, 16, 7), None), ((4, 16, 5, 6), None),
         ((4, 16, 5, 6), torch.channels_last), ((2, 8, 3, 4, 5), None),
         ((2, 8, 3, 4, 5), torch.channels_last_3d)]


@pytest.mark.parametrize("shape, fmt", CASES)
@pytest.mark.parametrize("mean_scale", [1.0, 300.0])
def test_batch_norm_eval_matches_torch(shape, fmt, mean_scale, both_paths):
    """y, dL/dx, dL/dgamma, dL/dbeta as torch's, with near-zero means (torch's form) and
    means far from 0 (x - mu first); the output keeps torch's memory format."""
    x, rm, rv, w, b = _inputs(shape, fmt, mean_scale=mean_scale)
    assert frozen.applies(x)
    ours, theirs = _both(lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False),
                         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, False), x, [w, b])
    tol = dict(rtol=1e-5, atol=1e-5 * mean_scale)
    for a, t in zip(ours, theirs):
        assert_close(a, t, **tol)
    fmt = fmt or torch.contiguous_format
    assert ours[0].is_contiguous(memory_format=fmt) == theirs[0].is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
def test_without_weight_or_bias_and_partial_gradients(affine):
    x, rm, rv, w, b = _inputs((4, 16, 5, 6))
    params = [p for p, keep in zip((w, b), affine) if keep]

    def ours(x, *p):
        it = iter(p)
        return F.batch_norm(x, rm, rv, next(it) if affine[0] else None,
                            next(it) if affine[1] else None, False)

    def theirs(x, *p):
        it = iter(p)
        return TF.batch_norm(x, rm, rv, next(it) if affine[0] else None,
                             next(it) if affine[1] else None, False)
    for a, t in zip(*_both(ours, theirs, x, params)):
        assert_close(a, t, rtol=1e-5, atol=1e-5)
    # only the weight requires grad (a frozen trunk's BN with a trainable gamma): no dx
    xs, ws = x.clone(), w.clone().requires_grad_(True)
    F.batch_norm(xs, rm, rv, ws, b, False).sum().backward()
    assert ws.grad is not None and xs.grad is None


def test_mixed_channels_near_and_far_from_zero():
    """Channels on both sides of the 2-sigma split in one input: both terms of the output."""
    x, rm, rv, w, b = _inputs((4, 16, 5, 6))
    rm[::2] += 50.0
    x = x + rm.view(1, -1, 1, 1)
    for a, t in zip(*_both(lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False),
                           lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, False), x, [w, b])):
        assert_close(a, t, rtol=1e-5, atol=5e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes(dtype):
    x, rm, rv, w, b = _inputs((4, 16, 5, 6), dtype=dtype)
    rm, rv, w, b = (t.float() for t in (rm, rv, w, b)) if dtype != torch.float64 else \
        (rm, rv, w, b)
    ours = F.batch_norm(x, rm, rv, w, b, False)
    theirs = TF.batch_norm(x, rm, rv, w, b, False)
    assert ours.dtype == theirs.dtype == dtype
    assert_close(ours, theirs, rtol=1e-2 if dtype != torch.float64 else 1e-12, atol=1e-2)


def test_instance_norm_with_running_statistics():
    x, rm, rv, w, b = _inputs((4, 16, 5, 6))
    for a, t in zip(*_both(
            lambda x, w, b: F.instance_norm(x, rm, rv, w, b, use_input_stats=False),
            lambda x, w, b: TF.instance_norm(x, rm, rv, w, b, use_input_stats=False),
            x, [w, b])):
        assert_close(a, t, rtol=1e-5, atol=1e-5)


def test_gradcheck_and_second_derivative():
    x, rm, rv, w, b = _inputs((3, 4, 2, 3), dtype=torch.float64)
    for fmt in (torch.contiguous_format, torch.channels_last):
        xs = x.contiguous(memory_format=fmt).requires_grad_(True)
        ps = [w.clone().requires_grad_(True), b.clone().requires_grad_(True)]
        fn = lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False)
        assert torch.autograd.gradcheck(fn, (xs, *ps))
        assert torch.autograd.gradgradcheck(fn, (xs, *ps))


def test_no_gradient_reaches_the_running_statistics_as_in_torch():
    """torch refuses running statistics that require grad; so does normcore, saying how."""
    x, rm, rv, w, b = _inputs((4, 16, 5, 6))
    rm.requires_grad_(True)
    with pytest.raises(RuntimeError):
        TF.batch_norm(x, rm, rv, w, b, False)
    with pytest.raises(ArgumentError, match=r"running_mean\.detach\(\)"):
        F.batch_norm(x, rm, rv, w, b, False)
    with torch.no_grad():                      # no graph: both compute
        assert_close(F.batch_norm(x, rm, rv, w, b, False), TF.batch_norm(x, rm, rv, w, b, False))


def _errors(x, rm, rv, w, b, dy):
    """Per output (y, dx, dgamma, dbeta), ``max|t32 - t64| / max|t64|`` of normcore's and of
    torch's eval BatchNorm, each against its own op run in float64 on the same values."""
    x64, rm64, rv64, w64, b64 = (t.double() for t in (x, rm, rv, w, b))
    errs = {}
    for lib, fn in (("nc", F.batch_norm), ("th", TF.batch_norm)):
        r32 = _both(lambda x, w, b: fn(x, rm, rv, w, b, False), None, x, [w, b], dy)[0]
        r64 = _both(lambda x, w, b: fn(x, rm64, rv64, w, b, False), None, x64, [w64, b64],
                    dy.double())[0]
        errs[lib] = [((a.double() - t).abs().max() / t.abs().max()).item()
                     for a, t in zip(r32, r64)]
    return errs


@pytest.mark.parametrize("fmt", [None, torch.channels_last])
@pytest.mark.parametrize("mean_scale", [1.0, 300.0])
@pytest.mark.parametrize("seed", range(4))
def test_rounding_against_torch(fmt, mean_scale, seed, both_paths):
    """float32 against float64, beside torch's own error, over seeds; the upstream gradient
    in x's memory format (as a channels_last network passes it, and torch's fast kernels
    take it).

    Every result is computed in float64 and rounded once (the reference's rule), or by the
    kernel (channels_last backward) with float64 sums and each gradient rounded once:

    * dx = g (gamma r): at most torch's error on every seed;
    * y: within one rounding of max|y|, and when the means are far from 0 at most torch's
      error (torch's x alpha + beta loses the mean's digits there);
    * dgamma = r sum g (x - mu) and dbeta = sum g: at most torch's error.
    """
    shape = (16, 32, 16, 16)
    x, rm, rv, w, b = _inputs(shape, fmt, mean_scale=mean_scale, seed=seed)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 5))
    dy = dy.contiguous(memory_format=fmt) if fmt else dy
    errs = _errors(x, rm, rv, w, b, dy)
    (y, dx, dgamma, dbeta), (ty, tdx, tdgamma, tdbeta) = errs["nc"], errs["th"]
    assert dx <= tdx, errs
    assert y <= 2.0 ** -24, f"y: {y / 2.0 ** -24:.2f} roundings of max|y|"
    if mean_scale > 1:
        assert y <= ty, errs
    assert dgamma <= tdgamma and dbeta <= tdbeta, errs


def test_modules_in_eval_mode_take_it():
    """nn.BatchNorm2d in eval() goes through FixedStatistics (its backward runs)."""
    calls = []
    orig = frozen.FixedStatistics.backward

    def spy(ctx, *g):
        calls.append(1)
        return orig(ctx, *g)
    m = nn.BatchNorm2d(16).eval()
    x = torch.randn(4, 16, 5, 5, requires_grad=True)
    try:
        frozen.FixedStatistics.backward = staticmethod(spy)
        m(x).sum().backward()
    finally:
        frozen.FixedStatistics.backward = staticmethod(orig)
    assert calls and x.grad is not None


def test_the_autograd_path_is_the_reference():
    """backward='autograd' keeps the formula's ops (the readable path), and agrees."""
    x, rm, rv, w, b = _inputs((4, 16, 5, 6))
    for a, t in zip(*_both(lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False),
                           lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False,
                                                        backward="autograd"), x, [w, b])):
        assert_close(a, t, rtol=1e-5, atol=1e-5)


def test_channel_sums_layouts():
    lay_shapes = [(8, 16), (8, 16, 7), (4, 16, 5, 6), (0, 16, 5, 6)]
    for shape in lay_shapes:
        t = torch.randn(shape)
        want = t.double().sum([d for d in range(t.dim()) if d != 1])
        assert_close(frozen._channel_sum(t), want, rtol=1e-5, atol=1e-5)   # float32 rows first
        if t.dim() == 4:
            assert_close(frozen._channel_sum(t.contiguous(memory_format=torch.channels_last)),
                         want, rtol=1e-5, atol=1e-5)
    assert axes.layout("batch", (4, 16, 5, 6)).affine_view_shape == (1, 16, 1, 1)


# ---------------------------------------------------------------------------------------
# PositionalApply: Function.apply without torch's per-call signature binding
# ---------------------------------------------------------------------------------------
def test_positional_apply_skips_the_signature_binding(monkeypatch):
    """Every normcore Function, called as the ops call it (all arguments positional), runs
    without inspect.signature; with a keyword argument torch's apply binds as before."""
    import inspect

    from normcore import core, grad, grad_dyt
    for fn in (grad.Normalize, grad.WeightStandardize, grad_dyt.DyTFunction,
               frozen.FixedStatistics):
        assert issubclass(fn, core.PositionalApply)

    def refuse(*a, **k):
        raise AssertionError("inspect.signature was called")
    x = torch.randn(4, 8, 3, 3, requires_grad=True)
    w = torch.rand(8, requires_grad=True)
    rm, rv = torch.zeros(8), torch.ones(8)
    monkeypatch.setattr(inspect, "signature", refuse)
    ys = [F.batch_norm(x, rm, rv, w, None, True), F.batch_norm(x, rm, rv, w, None, False),
          F.layer_norm(x, (3,)), F.weight_standardize(torch.randn(8, 4, 3, 3,
                                                                  requires_grad=True)),
          nn.DyT(3)(x)]
    sum(y.sum() for y in ys).backward()
    with pytest.raises(AssertionError, match=r"inspect\.signature"):
        lay = axes.layout("batch", x.shape)
        grad.Normalize.apply(x, w, None, lay, eps=1e-5)
    monkeypatch.undo()
    lay = axes.layout("batch", x.shape)
    got = grad.Normalize.apply(x, w, None, lay, eps=1e-5)[0]     # keyword: torch's apply
    assert_close(got, grad.Normalize.apply(x, w, None, lay, 1e-5)[0])


def test_positional_apply_binds_defaults_when_arguments_are_left_out():
    """A forward with a default, called without it: torch's apply binds the default (the
    fast path would hand setup_context one input too few)."""
    from normcore.core import PositionalApply

    class Scale(PositionalApply, torch.autograd.Function):
        @staticmethod
        def forward(x, factor=2.0):
            return x * factor

        @staticmethod
        def setup_context(ctx, inputs, output):
            _, ctx.factor = inputs

        @staticmethod
        def backward(ctx, g):
            return g * ctx.factor, None

    x = torch.ones(3, requires_grad=True)
    Scale.apply(x).sum().backward()
    assert_close(x.grad, torch.full((3,), 2.0))
    assert_close(Scale.apply(x, 3.0), torch.full((3,), 3.0))


def test_dgamma_is_the_exact_sum_rounded_once():
    """float32: sum g (x - mu) from float64 products, times r, rounded once: the float64
    reference's float32 rounding, where float32 products and partial sums were off by up to
    two roundings."""
    x, rm, rv, w, b = _inputs((16, 24, 16, 16), seed=3)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    ws = w.clone().requires_grad_(True)
    F.batch_norm(x, rm, rv, ws, b, False).backward(g)
    r = torch.rsqrt(rv.double() + 1e-5)
    exact = ((x.double() - rm.double().view(1, -1, 1, 1)) * g.double()).sum((0, 2, 3)) * r
    ulp = torch.finfo(torch.float32).eps * exact.abs()
    assert ((ws.grad.double() - exact).abs() <= 0.5 * ulp).all()


@pytest.mark.parametrize("fmt", [None, torch.channels_last])
def test_an_empty_batch_in_eval_mode_has_a_backward(fmt, both_paths):
    """An empty batch: an empty output, an empty input gradient, zero gradients for gamma
    and beta, as torch's (the backward once crashed in its channel sums).  (torch's
    instance_norm refuses an empty batch: its IndexError is not a behaviour to copy.)"""
    x, rm, rv, w, b = _inputs((0, 6, 4, 5), fmt)
    ours, theirs = _both(lambda x, w, b: F.batch_norm(x, rm, rv, w, b, False),
                         lambda x, w, b: TF.batch_norm(x, rm, rv, w, b, False), x, [w, b],
                         dy=torch.empty(x.shape))
    for a, t in zip(ours, theirs):
        assert a.shape == t.shape
        assert_close(a, t)
