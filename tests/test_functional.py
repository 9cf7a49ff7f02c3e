"""normcore.functional against torch.nn.functional: forward, backward, running buffers."""
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings, strategies as st

import normcore.functional as F
from normcore import axes
from strategies import GRAD_TOL, TOL, assert_matches as _assert_same, dtypes, make_affine, make_input, nchw_shapes

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def _grads(fn, x, w, b, dy):
    x = x.detach().clone().requires_grad_(True)
    params = [p.detach().clone().requires_grad_(True) if p is not None else None for p in (w, b)]
    y = fn(x, *params)
    y.backward(dy)
    return y.detach(), x.grad, [p.grad if p is not None else None for p in params]


def _check_fwd_bwd(ours_fn, torch_fn, x, w, b, seed, exact_fn=None):
    """Forward and every gradient of ``ours_fn`` against ``torch_fn``.  ``exact_fn`` (torch in
    float64, with its own copies of any buffers) is the arbiter for float32."""
    dtype = x.dtype
    dy = make_input(x.shape, dtype, seed + 7, loc_scale=False)
    y1, dx1, (dw1, db1) = _grads(ours_fn, x, w, b, dy)
    y2, dx2, (dw2, db2) = _grads(torch_fn, x, w, b, dy)
    ex = [None] * 4
    if exact_fn is not None and dtype != torch.float64:
        dbl = [None if t is None else t.double() for t in (x, w, b)]
        y3, dx3, (dw3, db3) = _grads(exact_fn, *dbl, dy.double())
        ex = [y3, dx3, dw3, db3]
    _assert_same(y1, y2, dtype, exact=ex[0])
    _assert_same(dx1, dx2, dtype, grad=True, exact=ex[1])
    for g1, g2, g3 in ((dw1, dw2, ex[2]), (db1, db2, ex[3])):
        if g2 is not None:
            _assert_same(g1, g2, dtype, grad=True, exact=g3)


# ---------------------------------------------------------------------------------------
# BatchNorm
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(shape=nchw_shapes(), dtype=dtypes, affine=st.booleans(),
       momentum=st.sampled_from([0.0, 0.1, 0.5, 1.0]), seed=st.integers(0, 2**16))
def test_batch_norm_train_then_eval_matches_torch(shape, dtype, affine, momentum, seed):
    C = shape[1]
    w, b = make_affine((C,), dtype, seed) if affine else (None, None)
    ours_rm, ours_rv = torch.randn(C, dtype=dtype), torch.rand(C, dtype=dtype) + 0.5
    th_rm, th_rv = ours_rm.clone(), ours_rv.clone()
    for step in range(3):  # several steps: the buffers must match after each
        x = make_input(shape, dtype, seed + step)
        _check_fwd_bwd(
            lambda x, w, b: F.batch_norm(x, ours_rm, ours_rv, w, b, True, momentum, 1e-5),
            lambda x, w, b: TF.batch_norm(x, th_rm, th_rv, w, b, True, momentum, 1e-5),
            x, w, b, seed,
            lambda x, w, b: TF.batch_norm(x, None, None, w, b, True, momentum, 1e-5))
        # each call updated the buffers once more (the fwd/bwd check calls each fn once)
        torch.testing.assert_close(ours_rm, th_rm, **TOL[dtype])
        torch.testing.assert_close(ours_rv, th_rv, **TOL[dtype])
    x = make_input(shape, dtype, seed + 100)
    _check_fwd_bwd(
        lambda x, w, b: F.batch_norm(x, ours_rm, ours_rv, w, b, False, momentum, 1e-3),
        lambda x, w, b: TF.batch_norm(x, th_rm, th_rv, w, b, False, momentum, 1e-3),
        x, w, b, seed)


@SETTINGS
@given(shape=nchw_shapes(), dtype=dtypes, seed=st.integers(0, 2**16))
def test_batch_norm_without_buffers_uses_batch_stats(shape, dtype, seed):
    x = make_input(shape, dtype, seed)
    w, b = make_affine((shape[1],), dtype, seed)
    _check_fwd_bwd(lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
                   lambda x, w, b: TF.batch_norm(x, None, None, w, b, True), x, w, b, seed,
                   lambda x, w, b: TF.batch_norm(x, None, None, w, b, True))


def test_running_var_is_unbiased_and_normalization_biased():
    x = make_input((4, 3, 2), torch.float64, 0)
    rm, rv = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    y = F.batch_norm(x, rm, rv, training=True, momentum=1.0)
    n = 4 * 2
    flat = x.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(rv, flat.var(1, unbiased=True))  # stored: M2 / (n - 1)
    biased = flat.var(1, unbiased=False)                          # used: M2 / n
    expect = (x - flat.mean(1).reshape(1, 3, 1)) / torch.sqrt(biased.reshape(1, 3, 1) + 1e-5)
    torch.testing.assert_close(y, expect)
    assert not torch.allclose(rv, biased)
    torch.testing.assert_close(rv, biased * n / (n - 1))


# ---------------------------------------------------------------------------------------
# InstanceNorm
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(shape=nchw_shapes(min_spatial=1), dtype=dtypes, affine=st.booleans(),
       track=st.booleans(), seed=st.integers(0, 2**16))
def test_instance_norm_matches_torch(shape, dtype, affine, track, seed):
    if all(s == 1 for s in shape[2:]):
        shape = shape[:2] + (2,) + shape[3:]
    C = shape[1]
    w, b = make_affine((C,), dtype, seed) if affine else (None, None)
    rm1 = rv1 = rm2 = rv2 = None
    if track:
        rm1, rv1 = torch.randn(C, dtype=dtype), torch.rand(C, dtype=dtype) + 0.5
        rm2, rv2 = rm1.clone(), rv1.clone()
    x = make_input(shape, dtype, seed)
    _check_fwd_bwd(lambda x, w, b: F.instance_norm(x, rm1, rv1, w, b, True, 0.3, 1e-5),
                   lambda x, w, b: TF.instance_norm(x, rm2, rv2, w, b, True, 0.3, 1e-5),
                   x, w, b, seed, lambda x, w, b: TF.instance_norm(x, None, None, w, b))
    if track:
        torch.testing.assert_close(rm1, rm2, **TOL[dtype])
        torch.testing.assert_close(rv1, rv2, **TOL[dtype])
        _check_fwd_bwd(lambda x, w, b: F.instance_norm(x, rm1, rv1, w, b, False),
                       lambda x, w, b: TF.instance_norm(x, rm2, rv2, w, b, False),
                       x, w, b, seed)


# ---------------------------------------------------------------------------------------
# LayerNorm, GroupNorm
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(shape=nchw_shapes(min_batch=1), dtype=dtypes, data=st.data(), seed=st.integers(0, 2**16))
def test_layer_norm_matches_torch(shape, dtype, data, seed):
    k = data.draw(st.integers(1, len(shape) - 1), label="normalized dims")
    ns = shape[len(shape) - k:]
    flags = data.draw(st.sampled_from(["none", "weight", "both"]), label="affine")
    w, b = make_affine(ns, dtype, seed)
    w = None if flags == "none" else w
    b = b if flags == "both" else None
    x = make_input(shape, dtype, seed)
    _check_fwd_bwd(lambda x, w, b: F.layer_norm(x, ns, w, b, 1e-5),
                   lambda x, w, b: TF.layer_norm(x, ns, w, b, 1e-5), x, w, b, seed,
                   lambda x, w, b: TF.layer_norm(x, ns, w, b, 1e-5))


@SETTINGS
@given(shape=nchw_shapes(min_batch=1), dtype=dtypes, data=st.data(), affine=st.booleans(),
       seed=st.integers(0, 2**16))
def test_group_norm_matches_torch(shape, dtype, data, affine, seed):
    G = data.draw(st.sampled_from(axes.divisors(shape[1])), label="num_groups")
    if all(s == 1 for s in shape[2:]) and shape[1] == G:
        shape = shape[:2] + (2,) + shape[3:]  # a group of one element has no spread
    w, b = make_affine((shape[1],), dtype, seed) if affine else (None, None)
    x = make_input(shape, dtype, seed)
    _check_fwd_bwd(lambda x, w, b: F.group_norm(x, G, w, b, 1e-5),
                   lambda x, w, b: TF.group_norm(x, G, w, b, 1e-5), x, w, b, seed,
                   lambda x, w, b: TF.group_norm(x, G, w, b, 1e-5))


def test_group_norm_extremes_equal_layer_and_instance_norm():
    x = make_input((3, 6, 4, 5), torch.float64, 1)
    torch.testing.assert_close(F.group_norm(x, 1), F.layer_norm(x, x.shape[1:]))
    torch.testing.assert_close(F.group_norm(x, 6), F.instance_norm(x))


# ---------------------------------------------------------------------------------------
# Weight standardization: the three conventions, each against its reference formula
# ---------------------------------------------------------------------------------------
def _ws_original(w, eps=1e-5):  # Qiao et al. reference code
    flat = w.reshape(w.shape[0], -1)
    mean = flat.mean(1, keepdim=True)
    std = (flat - mean).std(1, keepdim=True) + eps
    return ((flat - mean) / std).reshape(w.shape)


def _ws_bit(w, eps=1e-10):  # BiT StdConv2d
    v, m = torch.var_mean(w, dim=list(range(1, w.dim())), keepdim=True, unbiased=False)
    return (w - m) / torch.sqrt(v + eps)


def _ws_timm(w, eps=1e-6):  # timm StdConv2d: batch_norm over the flattened weight
    return TF.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                         momentum=0.0, eps=eps).reshape_as(w)


@pytest.mark.parametrize("convention, ref", [("original", _ws_original), ("bit", _ws_bit),
                                             ("timm", _ws_timm)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(8, 3, 3, 3), (4, 16, 1, 1), (5, 2, 7), (6, 10)])
def test_weight_standardize_conventions(convention, ref, dtype, shape):
    w = make_input(shape, dtype, 3).requires_grad_(True)
    dy = make_input(shape, dtype, 4, loc_scale=False)
    ours = F.weight_standardize(w, convention=convention)
    (gw1,) = torch.autograd.grad(ours, w, dy)
    theirs = ref(w)
    (gw2,) = torch.autograd.grad(theirs, w, dy)
    torch.testing.assert_close(ours, theirs, **TOL[dtype])
    torch.testing.assert_close(gw1, gw2, **GRAD_TOL[dtype])


def test_weight_standardize_conventions_really_differ():
    w = make_input((4, 2, 2, 2), torch.float64, 0)  # 8 weights per channel: n/(n-1) matters
    outs = {c: F.weight_standardize(w, convention=c) for c in F.WS_CONVENTIONS}
    assert not torch.allclose(outs["original"], outs["bit"], rtol=1e-3, atol=0)
    # biased std is 1 for bit/timm; unbiased std of the original's output is ~1
    flat = outs["bit"].reshape(4, -1)
    torch.testing.assert_close(flat.var(1, unbiased=False), torch.ones(4, dtype=torch.float64))


# ---------------------------------------------------------------------------------------
# low precision, degenerate input
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["batch", "layer", "instance", "group"])
def test_low_precision_accumulates_in_float32(dtype, name):
    x64 = make_input((4, 6, 5, 5), torch.float64, 2) * 10 + 300  # a large mean
    x = x64.to(dtype)
    w, b = make_affine((6,), torch.float32, 2)
    calls = {
        "batch": (lambda m, x, w, b: m.batch_norm(x, None, None, w, b, True)),
        "layer": (lambda m, x, w, b: m.layer_norm(x, x.shape[1:])),
        "instance": (lambda m, x, w, b: m.instance_norm(x, weight=w, bias=b)),
        "group": (lambda m, x, w, b: m.group_norm(x, 3, w, b)),
    }
    ours = calls[name](F, x, w, b)
    assert ours.dtype == dtype
    # exact reference: the same low-precision input normalized in float64
    ref = calls[name](TF, x.double(), w.double(), b.double())
    err = (ours.double() - ref).abs().max().item()
    ulp = 2 ** -8 if dtype == torch.float16 else 2 ** -5  # relative rounding of the output
    assert err <= 4 * ulp * max(1.0, ref.abs().max().item()), err
    assert torch.isfinite(ours).all()


@pytest.mark.parametrize("value", [0.0, 1.0, -3.5, 1e4])
def test_constant_input_gives_beta(value):
    x = torch.full((4, 3, 5), value)
    w, b = make_affine((3,), torch.float32, 0)
    for y in (F.batch_norm(x, None, None, w, b, True), F.instance_norm(x, weight=w, bias=b),
              F.group_norm(x, 3, w, b)):
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, b.reshape(1, 3, 1).expand_as(y), rtol=0, atol=1e-3)
    wl, bl = make_affine((3, 5), torch.float32, 0)
    y = F.layer_norm(x, (3, 5), wl, bl)
    torch.testing.assert_close(y, bl.expand_as(y), rtol=0, atol=1e-3)


def test_double_backward_works():
    x = make_input((4, 3, 2), torch.float64, 0).requires_grad_(True)
    w, b = (p.requires_grad_(True) for p in make_affine((3,), torch.float64, 0))
    assert torch.autograd.gradgradcheck(lambda x, w, b: F.group_norm(x, 3, w, b), (x, w, b))
