"""RMSNorm: normcore.functional.rms_norm (with gradients: the hand-derived backward of
normcore.grad.Normalize on the uncentered layout) and normcore.nn.RMSNorm against
torch.nn.functional.rms_norm / torch.nn.RMSNorm of the pinned torch."""
import warnings

import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings, strategies as st

import normcore.functional as F
import normcore.nn as nn
from normcore import axes
from strategies import GRAD_TOL, TOL, dtypes, make_input


def grad_rms(x, ns, w=None, eps=None):
    """RMSNorm through normcore.functional.normalize on RMSNorm's layout (the Function of
    normcore.grad when a gradient is needed)."""
    k = 1 if isinstance(ns, int) else len(ns)
    lay = axes.layout("rms", x.shape, normalized_ndim=k)
    return F.normalize(x, lay, F.rms_eps(eps, x.dtype), w).output

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
LOW = (torch.float16, torch.bfloat16)
#: half inputs: one rounding of the output (ulp 2^-11 / 2^-8 relative), a few for gradients
HALF_TOL = {torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


@st.composite
def rms_cases(draw):
    """(shape, k): an input of 1..4 dims and the number k of trailing dims normalized."""
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    k = draw(st.integers(1, nd))
    return shape, k


def _grads(fn, x, w, dy):
    x = x.detach().clone().requires_grad_(True)
    w = None if w is None else w.detach().clone().requires_grad_(True)
    y = fn(x, w)
    leaves = [x] + ([w] if w is not None else [])
    return (y.detach(), *torch.autograd.grad(y, leaves, dy))


def _weight(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 0.5 + 1).to(dtype)


@SETTINGS
@given(case=rms_cases(), dtype=dtypes, affine=st.booleans(), as_int=st.booleans(),
       eps=st.sampled_from([None, 1e-6, 1e-3]), seed=st.integers(0, 2**16))
def test_rms_norm_forward_and_gradients_match_torch(case, dtype, affine, as_int, eps, seed):
    shape, k = case
    ns = shape[len(shape) - k:]
    arg = ns[0] if (as_int and k == 1) else list(ns)      # int, list (or torch.Size below)
    x = make_input(shape, dtype, seed, loc_scale=False) * 2 + 0.5
    w = _weight(ns, dtype, seed) if affine else None
    dy = make_input(shape, dtype, seed + 7, loc_scale=False)
    for ours in (F.rms_norm, grad_rms):
        a = _grads(lambda x, w: ours(x, arg, w, eps), x, w, dy)
        b = _grads(lambda x, w: TF.rms_norm(x, list(ns), w, eps), x, w, dy)  # torch: a list
        torch.testing.assert_close(a[0], b[0], **TOL[dtype])
        for ga, gb in zip(a[1:], b[1:]):
            assert ga.dtype == gb.dtype
            torch.testing.assert_close(ga, gb, **GRAD_TOL[dtype])
    # without autograd: the formula path
    with torch.no_grad():
        torch.testing.assert_close(F.rms_norm(x, torch.Size(ns), w, eps),
                                   TF.rms_norm(x, torch.Size(ns), w, eps), **TOL[dtype])


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("wdtype", ["same", torch.float32, None], ids=str)
def test_rms_norm_half_inputs(dtype, wdtype):
    """Computed in float32 and rounded once to the input's dtype, as torch does."""
    x = (make_input((6, 5, 48), torch.float64, 3, loc_scale=False) * 3 + 1).to(dtype)
    w = None if wdtype is None else _weight((48,), dtype if wdtype == "same" else wdtype, 3)
    dy = make_input((6, 5, 48), torch.float64, 4, loc_scale=False).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # torch: "Mismatch dtype between input and weight"
        a = _grads(lambda x, w: F.rms_norm(x, (48,), w), x, w, dy)
        b = _grads(lambda x, w: TF.rms_norm(x, (48,), w), x, w, dy)
    for ta, tb in zip(a, b):
        assert ta.dtype == tb.dtype
        torch.testing.assert_close(ta.float(), tb.float(), **HALF_TOL[dtype])


@pytest.mark.parametrize("dtype, expected", [
    (torch.float32, torch.finfo(torch.float32).eps),
    (torch.float64, torch.finfo(torch.float64).eps),
    (torch.float16, torch.finfo(torch.float32).eps),     # not finfo(float16).eps
    (torch.bfloat16, torch.finfo(torch.float32).eps),
], ids=str)
def test_eps_none_is_the_compute_dtypes_machine_epsilon(dtype, expected):
    assert F.rms_eps(None, dtype) == expected
    # a constant input a with a^2 = expected: y = a / sqrt(a^2 + eps) = 1/sqrt(2) iff eps = expected
    a = expected ** 0.5
    x = torch.full((2, 8), a, dtype=dtype)
    exact = x.double() / (x.double() ** 2 + expected).sqrt()
    for y in (F.rms_norm(x, (8,)), TF.rms_norm(x, (8,)), nn.RMSNorm(8, dtype=dtype)(x)):
        torch.testing.assert_close(y.double(), exact, rtol=1e-2, atol=0)


def test_gradcheck_and_gradgradcheck():
    g = torch.Generator().manual_seed(0)
    for shape, ns in (((3, 4), (4,)), ((2, 3, 4), (3, 4)), ((5,), (5,))):
        x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
        w = torch.randn(ns, generator=g, dtype=torch.float64, requires_grad=True)
        y = F.rms_norm(x, ns, w, 1e-5)
        assert type(y.grad_fn).__name__ == "NormalizeBackward"    # the hand-derived one
        assert torch.autograd.gradcheck(lambda x, w: F.rms_norm(x, ns, w, 1e-5), (x, w))
        assert torch.autograd.gradgradcheck(lambda x, w: F.rms_norm(x, ns, w, 1e-5), (x, w))
        assert torch.autograd.gradcheck(lambda x, w: grad_rms(x, ns, w, 1e-5), (x, w))
        assert torch.autograd.gradcheck(lambda x: F.rms_norm(x, ns), (x,))


def test_gradient_has_no_mean_term():
    """LayerNorm's dx sums to 0 over each set; RMSNorm's does not (nothing was centered),
    but it is orthogonal to x itself: scaling a set does not change the output (up to eps)."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 16, generator=g, dtype=torch.float64) + 2).requires_grad_(True)
    dy = torch.randn(4, 16, generator=g, dtype=torch.float64)
    dx, = torch.autograd.grad(F.rms_norm(x, (16,), eps=1e-12), x, dy)
    assert (dx.sum(-1).abs() > 1e-3).all()
    assert ((dx * x.detach()).sum(-1).abs() < 1e-9).all()


@pytest.mark.parametrize("make", [
    lambda cls: cls(6), lambda cls: cls([2, 3], eps=1e-6),
    lambda cls: cls(torch.Size([4]), elementwise_affine=False),
    lambda cls: cls(5, dtype=torch.float64),
])
def test_module_matches_torch_state_dict_both_ways_and_repr(make):
    ours, theirs = make(nn.RMSNorm), make(torch.nn.RMSNorm)
    assert repr(ours) == repr(theirs)
    assert ours.normalized_shape == theirs.normalized_shape and ours.eps == theirs.eps
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.rand_like(p) + 0.5)
    ours.load_state_dict(theirs.state_dict())          # torch -> normcore
    fresh = make(torch.nn.RMSNorm)
    fresh.load_state_dict(ours.state_dict())           # normcore -> torch
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v) and torch.equal(fresh.state_dict()[k], v)
    dtype = next(iter(theirs.state_dict().values()), torch.empty(0)).dtype
    x = make_input((3,) + ours.normalized_shape, dtype, 5, loc_scale=False).requires_grad_(True)
    ya, yb = ours(x), theirs(x)
    torch.testing.assert_close(ya, yb, **TOL[dtype])
    ga = torch.autograd.grad(ya.square().sum(), [x] + list(ours.parameters()))
    gb = torch.autograd.grad(yb.square().sum(), [x] + list(theirs.parameters()))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, **GRAD_TOL[dtype])


x34 = torch.randn(3, 4)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: F.rms_norm(x34, (5,)), ValueError, "expected input with shape [*, 5]"),
    (lambda: F.rms_norm(x34, (3, 4, 1)), ValueError,
     "normalized_shape must equal the input's last dims"),
    (lambda: F.rms_norm(x34, []), ValueError, "Given normalized_shape=[]"),
    (lambda: F.rms_norm(torch.ones(3, 4, dtype=torch.int64), (4,)), TypeError, "int64"),
    (lambda: F.rms_norm(x34, (4,), eps=0.0), ValueError, "eps must be positive, got eps=0.0"),
    (lambda: F.rms_norm(x34, (4,), eps=-1e-6), ValueError, "eps must be positive"),
    (lambda: F.rms_norm(x34, (4,), eps="1e-6"), TypeError, "eps must be a positive number"),
    (lambda: F.rms_norm(x34, (4,), torch.ones(3)), ValueError, "weight has shape (3,), expected (4,)"),
    (lambda: F.rms_norm(x34, (4,), torch.ones(4, dtype=torch.int32)), TypeError, "weight has dtype torch.int32"),
    (lambda: F.rms_norm([[1.0, 2.0]], (2,)), TypeError, "must be a torch.Tensor"),
    (lambda: nn.RMSNorm(4)(x34[:, :3]), ValueError, "expected input with shape [*, 4]"),
    (lambda: nn.RMSNorm([]), ValueError, "non-empty and positive"),
    (lambda: nn.RMSNorm(0), ValueError, "non-empty and positive"),
    (lambda: nn.RMSNorm(4, eps=0), ValueError, "eps must be positive"),
])
def test_bad_input_gives_a_clear_error(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("shape, k", [((2, 3, 4, 5), 1), ((2, 3, 4, 5), 2), ((2, 3, 2, 4, 5), 1)])
def test_rms_norm_over_trailing_dims_of_channels_last_memory(shape, k):
    """RMSNorm over the last dim(s) of a 4-d or 5-d channels_last tensor (its view once failed
    with 'view size is not compatible'): torch's output, gradients and memory format."""
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).contiguous(memory_format=fmt)
    w = torch.rand(shape[len(shape) - k:], generator=gen, dtype=torch.float64) + 0.5
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    out = []
    for fn in (F.rms_norm, TF.rms_norm):
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = fn(xs, shape[len(shape) - k:], ws, 1e-6)
        out.append((y, *torch.autograd.grad(y, (xs, ws), g)))
    for a, t in zip(*out):
        torch.testing.assert_close(a, t)
    assert out[0][0].is_contiguous(memory_format=fmt) == out[1][0].is_contiguous(memory_format=fmt)
