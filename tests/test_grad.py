"""normcore.grad: the hand-derived backward passes.

Every gradient is checked against something the code under test did not compute: finite
differences (``torch.autograd.gradcheck``), and autograd through PyTorch's own ops
(``torch.nn.functional.batch_norm`` / ``layer_norm`` / ``instance_norm`` / ``group_norm``, and
an explicit torch formula per Weight Standardization convention).  The last tests break the
backward on purpose and check that these comparisons notice.
"""
import math

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import assume, example, given, settings, strategies as st
from torch.autograd import gradcheck

import normcore.functional as F
import normcore.grad as G
from normcore import axes
from strategies import TOL, assert_matches, condition, dtypes, make_affine, make_input, nchw_shapes

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
NORMS = ("batch", "layer", "instance", "group")


# ---------------------------------------------------------------------------------------
# one case = (our function, torch's function, the affine shape), for a norm and a shape
# ---------------------------------------------------------------------------------------
def fns(norm, shape, num_groups=None, normalized_ndim=None, eps=1e-5):
    """``(ours, theirs, affine_shape)``; both take ``(x, weight, bias)``."""
    if norm == "batch":
        return (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=eps),
                lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True, eps=eps),
                (shape[1],))
    if norm == "instance":
        return (lambda x, w, b: F.instance_norm(x, weight=w, bias=b, eps=eps),
                lambda x, w, b: TF.instance_norm(x, weight=w, bias=b, eps=eps),
                (shape[1],))
    if norm == "group":
        # torch 2.13's group_norm backward fails ("tensor does not have a device") when
        # bias needs a gradient but weight is None; gamma = 1, not trained, is the same math
        return (lambda x, w, b: F.group_norm(x, num_groups, w, b, eps=eps),
                lambda x, w, b: TF.group_norm(
                    x, num_groups, torch.ones_like(b) if w is None and b is not None else w, b,
                    eps=eps),
                (shape[1],))
    k = len(shape) - 1 if normalized_ndim is None else normalized_ndim
    ns = tuple(shape[len(shape) - k:])
    return (lambda x, w, b: F.layer_norm(x, ns, w, b, eps=eps),
            lambda x, w, b: TF.layer_norm(x, ns, w, b, eps=eps),
            ns)


def forward_backward(fn, x, w, b, dy):
    """``y`` and the gradients of ``(y * dy).sum()`` w.r.t. every tensor among x, w, b."""
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    y = fn(*leaves)
    grads = torch.autograd.grad(y, [t for t in leaves if t is not None], dy)
    it = iter(grads)
    return y.detach(), [None if t is None else next(it) for t in leaves]


def check_against_torch(norm, shape, dtype, affine, seed, num_groups=None, normalized_ndim=None):
    """Forward, dx, dgamma and dbeta of ours against autograd through torch's op, in
    ``dtype``; for float32 a float64 run of torch's op arbitrates ill-conditioned cases."""
    ours, theirs, pshape = fns(norm, shape, num_groups, normalized_ndim)
    x = make_input(shape, dtype, seed)
    w, b = make_affine(pshape, dtype, seed)
    w = w if affine in ("both", "weight") else None
    b = b if affine in ("both", "bias") else None
    dy = make_input(shape, dtype, seed + 7, loc_scale=False)
    y1, g1 = forward_backward(ours, x, w, b, dy)
    y2, g2 = forward_backward(theirs, x, w, b, dy)
    exact, kappa = [None] * 4, None
    if dtype != torch.float64:
        labels = axes.stat_groups(norm, shape, num_groups,
                                  None if norm != "layer" else len(pshape))
        kappa = condition(x, labels)
        d = [None if t is None else t.double() for t in (x, w, b)]
        y3, g3 = forward_backward(theirs, *d, dy.double())
        exact = [y3] + g3
    assert y1.dtype == dtype and y1.shape == y2.shape
    assert_matches(y1, y2, dtype, exact=exact[0], kappa=kappa)
    for name, a, t, e in zip(("dx", "dgamma", "dbeta"), g1, g2, exact[1:]):
        assert (a is None) == (t is None), name
        if t is not None:
            assert a.dtype == t.dtype and a.shape == t.shape, name
            assert_matches(a, t, dtype, grad=True, exact=e, kappa=kappa)


# ---------------------------------------------------------------------------------------
# gradcheck: finite differences in float64
# ---------------------------------------------------------------------------------------
def _gradcheck(fn, x, w, b, **kw):
    inputs = [t.detach().clone().requires_grad_(True) for t in (x, w, b) if t is not None]
    present = [t is not None for t in (x, w, b)]

    def f(*ts):
        it = iter(ts)
        return fn(*[next(it) if p else None for p in present])

    return gradcheck(f, inputs, **kw)


SPATIAL = [(5,), (3, 4), (2, 3, 2)]
AFFINE = ["both", "weight", "bias", "none"]


@pytest.mark.parametrize("affine, spatial", [
    (affine, spatial) for spatial in SPATIAL for affine in ("both", "none")
] + [("weight", SPATIAL[1]), ("bias", SPATIAL[1])], ids=lambda v: f"{len(v)}d" if isinstance(v, tuple) else v)
@pytest.mark.parametrize("norm, num_groups", [
    ("batch", None), ("layer", None), ("instance", None),
    ("group", 1), ("group", 2), ("group", 3), ("group", 6),
])
def test_gradcheck(norm, num_groups, affine, spatial):
    shape = (3, 6) + spatial
    ours, _, pshape = fns(norm, shape, num_groups)
    x = make_input(shape, torch.float64, 1)
    w, b = make_affine(pshape, torch.float64, 1)
    assert _gradcheck(ours, x, w if affine in ("both", "weight") else None,
                      b if affine in ("both", "bias") else None)


@pytest.mark.parametrize("normalized_ndim", [1, 2, 3])
def test_gradcheck_layer_norm_over_fewer_dims(normalized_ndim):
    shape = (2, 3, 4, 2)
    ours, _, pshape = fns("layer", shape, normalized_ndim=normalized_ndim)
    w, b = make_affine(pshape, torch.float64, 2)
    assert _gradcheck(ours, make_input(shape, torch.float64, 2), w, b)


@pytest.mark.parametrize("convention", sorted(F.WS_CONVENTIONS))
@pytest.mark.parametrize("shape", [(4, 3, 3, 3), (5, 7), (3, 2, 3), (2, 2, 2, 2, 2)])
def test_gradcheck_weight_standardize(convention, shape):
    w = make_input(shape, torch.float64, 3)
    assert _gradcheck(lambda w, _b, _c: F.weight_standardize(w, convention=convention),
                      w, None, None)


@pytest.mark.parametrize("convention", sorted(F.WS_CONVENTIONS))
def test_gradcheck_weight_standardize_large_eps(convention):
    # a large eps makes rho = (sigma + eps) / sigma far from 1 (and eps inside the sqrt
    # matter): the eps terms of the derivation are visible to finite differences
    w = make_input((3, 2, 2), torch.float64, 4) * 0.3
    assert _gradcheck(lambda w, _b, _c: F.weight_standardize(w, 0.5, convention=convention),
                      w, None, None)


# ---------------------------------------------------------------------------------------
# against autograd through torch's own ops, over hypothesis-generated shapes
# ---------------------------------------------------------------------------------------
affines = st.sampled_from(AFFINE)
seeds = st.integers(0, 2**16)


@SETTINGS
@given(shape=nchw_shapes(), dtype=dtypes, affine=affines, seed=seeds)
def test_batch_norm_train_matches_torch(shape, dtype, affine, seed):
    check_against_torch("batch", shape, dtype, affine, seed)


@SETTINGS
@given(shape=nchw_shapes(min_spatial=1), dtype=dtypes, affine=affines, seed=seeds)
# sets of two values 0.0014 apart at -6.69 (condition 9520): with generic kernels torch's
# float32 error is 3.7e-6, ours 7.4e-5; both within 4 roundings times the condition
@example(shape=(2, 30, 2), dtype=torch.float32, affine="none", seed=4689)
def test_instance_norm_matches_torch(shape, dtype, affine, seed):
    assume(math.prod(shape[2:]) > 1)
    check_against_torch("instance", shape, dtype, affine, seed)


@SETTINGS
@given(shape=nchw_shapes(min_batch=1), dtype=dtypes, affine=affines, seed=seeds, data=st.data())
def test_layer_norm_matches_torch(shape, dtype, affine, seed, data):
    k = data.draw(st.integers(1, len(shape)), label="normalized_ndim")
    check_against_torch("layer", shape, dtype, affine, seed, normalized_ndim=k)


@SETTINGS
@given(shape=nchw_shapes(min_batch=1), dtype=dtypes, affine=affines, seed=seeds, data=st.data())
def test_group_norm_matches_torch(shape, dtype, affine, seed, data):
    g = data.draw(st.sampled_from(axes.divisors(shape[1])), label="num_groups")
    assume(shape[1] // g * math.prod(shape[2:]) > 1)   # torch refuses a group of one element
    check_against_torch("group", shape, dtype, affine, seed, num_groups=g)


def ws_reference(w, eps, convention):
    """Weight Standardization written out in torch ops, one convention each (autograd
    differentiates it)."""
    dims = tuple(range(1, w.dim()))
    if convention == "original":   # Qiao et al.'s code: unbiased std, eps added to the std
        mu = w.mean(dims, keepdim=True)
        return (w - mu) / (w.std(dims, keepdim=True) + eps)
    if convention == "bit":        # BiT: biased variance, eps inside the sqrt
        var, mu = torch.var_mean(w, dims, correction=0, keepdim=True)
        return (w - mu) / torch.sqrt(var + eps)
    if convention == "timm":       # timm StdConv2d: F.batch_norm over the weight
        return TF.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                             momentum=0.0, eps=eps).reshape_as(w)
    raise AssertionError(convention)


@st.composite
def weight_shapes(draw):
    k = draw(st.integers(0, 2))
    return (draw(st.integers(1, 16)), draw(st.integers(1, 16))) + tuple(
        draw(st.integers(1, 3)) for _ in range(k))


@settings(max_examples=50, deadline=None, derandomize=True)
@given(shape=weight_shapes(), dtype=dtypes, convention=st.sampled_from(sorted(F.WS_CONVENTIONS)),
       big_eps=st.booleans(), seed=seeds)
def test_weight_standardize_matches_torch(shape, dtype, convention, big_eps, seed):
    assume(math.prod(shape[1:]) >= 2)
    eps = 0.1 if big_eps else F.WS_CONVENTIONS[convention]["eps"]
    w = make_input(shape, dtype, seed)
    dy = make_input(shape, dtype, seed + 7, loc_scale=False)
    ours = lambda w, _b, _c: F.weight_standardize(w, eps, convention=convention)
    theirs = lambda w, _b, _c: ws_reference(w, eps, convention)
    y1, (g1, _, _) = forward_backward(ours, w, None, None, dy)
    y2, (g2, _, _) = forward_backward(theirs, w, None, None, dy)
    exact = [None, None]
    if dtype != torch.float64:
        y3, (g3, _, _) = forward_backward(theirs, w.double(), None, None, dy.double())
        exact = [y3, g3]
    assert y1.dtype == dtype and g1.dtype == dtype
    assert_matches(y1, y2, dtype, exact=exact[0])
    assert_matches(g1, g2, dtype, grad=True, exact=exact[1])
    # the same forward as normcore.functional
    assert_matches(y1, F.weight_standardize(w, eps, convention=convention), dtype)


@pytest.mark.parametrize("convention", sorted(F.WS_CONVENTIONS))
def test_weight_standardize_constant_filter(convention):
    # sigma = 0: the sqrt is not differentiable there; torch.std's backward drops that term,
    # and so do we (nothing may be nan)
    w = make_input((3, 2, 2, 2), torch.float64, 5)
    w[1] = 0.7
    dy = make_input(w.shape, torch.float64, 6, loc_scale=False)
    eps = F.WS_CONVENTIONS[convention]["eps"]
    _, (g1, _, _) = forward_backward(lambda w, *_: F.weight_standardize(w, convention=convention),
                                     w, None, None, dy)
    _, (g2, _, _) = forward_backward(lambda w, *_: ws_reference(w, eps, convention), w, None, None, dy)
    assert torch.isfinite(g1).all()
    torch.testing.assert_close(g1, g2, **TOL[torch.float64])


# ---------------------------------------------------------------------------------------
# float16 / bfloat16: computed in float32, given back in the input's dtype
# ---------------------------------------------------------------------------------------
LOW = {torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("norm, num_groups", [("batch", None), ("layer", None),
                                              ("instance", None), ("group", 2)])
@pytest.mark.parametrize("param_dtype", ["same", "float32"])
def test_low_precision(norm, num_groups, dtype, param_dtype):
    shape = (4, 6, 5, 3)
    ours, theirs, pshape = fns(norm, shape, num_groups)
    x = make_input(shape, dtype, 8)
    w, b = make_affine(pshape, dtype if param_dtype == "same" else torch.float32, 8)
    dy = make_input(shape, dtype, 9, loc_scale=False)
    y, (dx, dw, db) = forward_backward(ours, x, w, b, dy)
    assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == (dtype, dtype, w.dtype, b.dtype)
    # torch's op in float32 on the same (rounded) values, rounded once at the end
    f = [t.float() for t in (x, w, b)]
    y32, g32 = forward_backward(theirs, *f, dy.float())
    torch.testing.assert_close(y.float(), y32.to(dtype).float(), **LOW[dtype])
    for a, t in zip((dx, dw, db), g32):
        torch.testing.assert_close(a.float(), t.to(a.dtype).float(), **LOW[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("convention", sorted(F.WS_CONVENTIONS))
def test_weight_standardize_low_precision(dtype, convention):
    w = make_input((4, 3, 3, 3), dtype, 10)
    dy = make_input(w.shape, dtype, 11, loc_scale=False)
    eps = F.WS_CONVENTIONS[convention]["eps"]
    y, (g, _, _) = forward_backward(lambda w, *_: F.weight_standardize(w, convention=convention),
                                    w, None, None, dy)
    y32, (g32, _, _) = forward_backward(lambda w, *_: ws_reference(w, eps, convention),
                                        w.float(), None, None, dy.float())
    assert y.dtype == dtype and g.dtype == dtype
    torch.testing.assert_close(y.float(), y32.to(dtype).float(), **LOW[dtype])
    torch.testing.assert_close(g.float(), g32.to(dtype).float(), **LOW[dtype])


# ---------------------------------------------------------------------------------------
# bookkeeping: needs_input_grad, the generic normalize, no double backward
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm, num_groups", [("batch", None), ("layer", None), ("group", 3)])
@pytest.mark.parametrize("wanted", ["x", "weight", "bias", "weight+bias"])
def test_only_the_wanted_gradients(norm, num_groups, wanted):
    shape = (3, 6, 4)
    ours, theirs, pshape = fns(norm, shape, num_groups)
    x = make_input(shape, torch.float64, 12)
    w, b = make_affine(pshape, torch.float64, 12)
    dy = make_input(shape, torch.float64, 13, loc_scale=False)
    names = ("x", "weight", "bias")

    def run(fn):
        ts = [t.detach().clone().requires_grad_(n in wanted.split("+")) for n, t in zip(names, (x, w, b))]
        fn(*ts).backward(dy)
        return [t.grad for t in ts]

    for n, a, t in zip(names, run(ours), run(theirs)):
        if n in wanted.split("+"):
            torch.testing.assert_close(a, t, **TOL[torch.float64])
        else:
            assert a is None


def test_generic_normalize_returns_statistics():
    x = make_input((4, 6, 3, 2), torch.float64, 14).requires_grad_(True)
    lay = axes.layout("group", x.shape, 3)
    w, b = make_affine((6,), torch.float64, 14)
    out = F.normalize(x, lay, 1e-5, w, b)
    var, mean = torch.var_mean(x.detach().reshape(4, 3, 2, 3, 2), dim=(2, 3, 4), correction=0,
                               keepdim=True)
    torch.testing.assert_close(out.mean, mean, **TOL[torch.float64])
    torch.testing.assert_close(out.var, var, **TOL[torch.float64])
    assert not out.mean.requires_grad and not out.var.requires_grad
    torch.testing.assert_close(out.output, TF.group_norm(x, 3, w, b), **TOL[torch.float64])
    assert out.output.requires_grad


@pytest.mark.parametrize("norm, num_groups", [("batch", None), ("layer", None),
                                              ("instance", None), ("group", 2)])
@pytest.mark.parametrize("affine", ["both", "none"])
def test_output_can_be_modified_in_place(norm, num_groups, affine):
    # the output is a fresh tensor (not x_hat, not a view of it): relu_ on it is allowed,
    # and the gradient is the one through torch's op
    shape = (3, 4, 5)
    ours, theirs, pshape = fns(norm, shape, num_groups)
    x = make_input(shape, torch.float64, 19)
    w, b = make_affine(pshape, torch.float64, 19) if affine == "both" else (None, None)
    dy = make_input(shape, torch.float64, 20, loc_scale=False)
    _, g1 = forward_backward(lambda *t: ours(*t).relu_(), x, w, b, dy)
    _, g2 = forward_backward(lambda *t: theirs(*t).relu_(), x, w, b, dy)
    for a, t in zip(g1, g2):
        if t is not None:
            torch.testing.assert_close(a, t, **TOL[torch.float64])
    w4 = make_input((3, 2, 2, 2), torch.float64, 21)
    _, (g1, _, _) = forward_backward(lambda w, *_: F.weight_standardize(w).mul_(2), w4, None, None, w4)
    _, (g2, _, _) = forward_backward(lambda w, *_: ws_reference(w, 1e-5, "original").mul_(2),
                                     w4, None, None, w4)
    torch.testing.assert_close(g1, g2, **TOL[torch.float64])


@pytest.mark.parametrize("call", [
    lambda x, w, b: F.group_norm(x, 2, w, b),
    lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
    lambda x, w, b: F.layer_norm(x, x.shape[1:]),
])
def test_double_backward_goes_through_the_formula(call):
    x = make_input((3, 4, 5), torch.float64, 15).requires_grad_(True)
    w, b = (p.requires_grad_(True) for p in make_affine((4,), torch.float64, 15))
    assert torch.autograd.gradgradcheck(call, (x, w, b))


@pytest.mark.parametrize("convention", ["timm", "bit", "original"])
def test_weight_standardize_has_a_double_backward(convention):
    """A MAML-style step differentiates the gradient: create_graph=True goes through the
    backward (recomputed from the weight), and the second derivative is autograd's through
    the formula (it once raised; autograd.grad(allow_unused=True) gave zeros)."""
    eps = F.WS_CONVENTIONS[convention]["eps"]
    seconds = []
    for fn in (lambda w: F.weight_standardize(w, convention=convention),
               lambda w: ws_reference(w, eps, convention)):
        w = make_input((3, 4, 5), torch.float64, 15).requires_grad_(True)
        (gw,) = torch.autograd.grad((fn(w) ** 3).sum(), w, create_graph=True)
        (hw,) = torch.autograd.grad((gw ** 2).sum(), w)
        seconds.append(hw)
    assert seconds[0].abs().max() > 0
    torch.testing.assert_close(seconds[0], seconds[1])


# ---------------------------------------------------------------------------------------
# one op per name: backward="derived" (the Functions) or "autograd" (through the formula)
# ---------------------------------------------------------------------------------------
x4 = torch.randn(2, 6, 3, 3)
i4 = torch.ones(2, 6, 3, 3, dtype=torch.long)

_OPS = {   # op(x, w, b, backward=...) on an (N, C, L) input, and its affine shape
    "batch_norm": (lambda x, w, b, **k: F.batch_norm(x, None, None, w, b, training=True, **k),
                   (6,)),
    "instance_norm": (lambda x, w, b, **k: F.instance_norm(x, weight=w, bias=b, **k), (6,)),
    "layer_norm": (lambda x, w, b, **k: F.layer_norm(x, (6, 4), w, b, **k), (6, 4)),
    "group_norm": (lambda x, w, b, **k: F.group_norm(x, 3, w, b, **k), (6,)),
    "rms_norm": (lambda x, w, b, **k: F.rms_norm(x, (4,), w, **k), (4,)),
    "weight_standardize": (lambda x, w, b, **k: F.weight_standardize(x, **k), None),
    "dyt": (lambda x, w, b, **k: F.dyt(x, torch.tensor([0.7], dtype=x.dtype), w, b,
                                       channels_last=False, **k), (6,)),
}


@pytest.mark.parametrize("op", list(_OPS))
def test_derived_and_autograd_backward_agree(op):
    fn, pshape = _OPS[op]
    x = make_input((3, 6, 4), torch.float64, 30)
    w, b = make_affine(pshape, torch.float64, 30) if pshape else (None, None)
    if op == "rms_norm":
        b = None
    dy = make_input((3, 6, 4), torch.float64, 31, loc_scale=False)
    y1, g1 = forward_backward(lambda *t: fn(*t, backward="derived"), x, w, b, dy)
    y2, g2 = forward_backward(lambda *t: fn(*t, backward="autograd"), x, w, b, dy)
    torch.testing.assert_close(y1, y2, **TOL[torch.float64])
    for a, t in zip(g1, g2):
        if t is not None:
            torch.testing.assert_close(a, t, **TOL[torch.float64])
    # and they are two paths: the derived one ends in a Function, the other in torch's ops
    leaf = x.clone().requires_grad_(True)
    derived = type(fn(leaf, w, b, backward="derived").grad_fn).__name__
    plain = type(fn(leaf, w, b, backward="autograd").grad_fn).__name__
    assert derived.endswith(("NormalizeBackward", "WeightStandardizeBackward",
                             "DyTFunctionBackward")), derived
    assert "Normalize" not in plain and "Standardize" not in plain and "DyT" not in plain, plain


def test_one_op_per_name():
    # normcore.grad holds the Functions, not a second batch_norm / layer_norm / ...
    assert not set(G.__all__) & set(F.__all__)
    for name in ("batch_norm_train", "layer_norm", "instance_norm", "group_norm",
                 "weight_standardize", "normalize"):
        assert not hasattr(G, name), name


@pytest.mark.parametrize("call", [
    lambda: F.layer_norm(x4, 3, backward="hand"),
    lambda: F.batch_norm(x4, None, None, training=True, backward=None),
    lambda: F.weight_standardize(x4, backward="Autograd"),
    lambda: F.dyt(x4, torch.ones(1), backward="derive"),
    lambda: F.normalize(x4, axes.layout("batch", x4.shape), 1e-5, backward=1),
])
def test_bad_backward_names_the_choices(call):
    with pytest.raises(ValueError, match=r"'derived' .*'autograd'"):
        call()


def test_bad_input_generic_normalize():
    lay = axes.layout("batch", (2, 6, 3, 3))
    with pytest.raises(ValueError, match="layout was made for shape"):
        F.normalize(torch.randn(2, 6, 3), lay, 1e-5)
    with pytest.raises(TypeError, match="Layout"):
        F.normalize(x4, "batch", 1e-5)
    with pytest.raises(ValueError, match="eps must be positive"):
        F.normalize(x4, lay, -1e-5)   # the primitive takes eps = 0, not below
    with pytest.raises(TypeError, match="floating-point"):
        F.normalize(i4, lay, 1e-5)
    with pytest.raises(ValueError, match=r"weight has shape \(5,\)"):
        F.normalize(x4, lay, 1e-5, torch.ones(5))


# ---------------------------------------------------------------------------------------
# the checks can fail: break the backward on purpose and watch them notice
# ---------------------------------------------------------------------------------------
_BOXED = G.boxed_backward


def _drop_xhat_term(grad_y, xhat, inv_std, weight, lay, needs=(True, True, True)):
    # r (d - mean d), forgetting "- x_hat mean(d x_hat)": the path through the variance
    dx, dw, db = _BOXED(grad_y, xhat, inv_std, weight, lay, needs)
    g = grad_y.reshape(lay.view_shape).to(xhat.dtype)
    d = g if weight is None else g * weight.to(xhat.dtype).reshape(lay.affine_view_shape)
    dx = inv_std * (d - d.mean(lay.reduce_dims, keepdim=True))
    return dx.reshape(lay.shape), dw, db


def test_a_backward_without_the_variance_path_is_caught(monkeypatch):
    """The reference's backward with a term dropped fails gradcheck and the comparison with
    torch (the kernels are switched off: the reference is what is broken here; the kernels
    are held to it in tests/test_kernels.py)."""
    import normcore
    monkeypatch.setattr(normcore.dispatch, "_STATE", dict(normcore.dispatch._STATE, kernels=False))
    monkeypatch.setattr(G, "boxed_backward", _drop_xhat_term)
    shape = (3, 6, 4)
    for norm, num_groups in (("batch", None), ("layer", None), ("instance", None), ("group", 2)):
        ours, _, pshape = fns(norm, shape, num_groups)
        x = make_input(shape, torch.float64, 16)
        w, b = make_affine(pshape, torch.float64, 16)
        assert not _gradcheck(ours, x, w, b, raise_exception=False)
        with pytest.raises(AssertionError):
            check_against_torch(norm, shape, torch.float64, "both", 16, num_groups)
        with pytest.raises(AssertionError):
            check_against_torch(norm, shape, torch.float32, "both", 16, num_groups)


def test_n_instead_of_n_minus_one_is_caught(monkeypatch):
    # the unbiased std of the original WS divides the last term by (n - 1) / rho;
    # using n instead (the "biased" slip) must be noticed
    right = G.ws_grad_input

    def slip(d, w_hat, r, m, lay):
        n = lay.set_size
        return right(d, w_hat, r, m * n / (n - 1), lay)

    monkeypatch.setattr(G, "ws_grad_input", slip)
    w = make_input((4, 3, 2, 2), torch.float64, 17)
    ours = lambda w, *_: F.weight_standardize(w, convention="original")
    assert not _gradcheck(ours, w, None, None, raise_exception=False)
    dy = make_input(w.shape, torch.float64, 18, loc_scale=False)
    _, (g1, _, _) = forward_backward(ours, w, None, None, dy)
    _, (g2, _, _) = forward_backward(lambda w, *_: ws_reference(w, 1e-5, "original"),
                                     w, None, None, dy)
    assert not torch.allclose(g1, g2, **TOL[torch.float32])
