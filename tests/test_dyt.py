"""Dynamic Tanh: normcore.functional.dyt (with gradients: the hand-derived backward of
normcore.grad_dyt.DyTFunction), normcore.nn.DyT against the paper's own code (copied below),
and normcore.nn.convert_ln_to_dyt."""
import pickle
import sys
import types

import pytest
import torch
import torch.nn as tnn
from hypothesis import given, settings, strategies as st

import normcore.functional as F
import normcore.grad_dyt as GD
import normcore.nn as nn
from strategies import GRAD_TOL, TOL, dtypes, make_input

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)


# ---------------------------------------------------------------------------------------
# the reference: dynamic_tanh.py of github.com/jiachenzhu/DyT (commit aab5dde), verbatim
# but for timm's LayerNorm2d, a stand-in class here (timm is not a dependency)
# ---------------------------------------------------------------------------------------
class LayerNorm2d(tnn.LayerNorm):
    """Stand-in for timm.layers.LayerNorm2d: LayerNorm over dim 1 of (N, C, H, W)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class DynamicTanh(tnn.Module):
    def __init__(self, normalized_shape, channels_last, alpha_init_value=0.5):
        super().__init__()
        self.normalized_shape = normalized_shape
        self.alpha_init_value = alpha_init_value
        self.channels_last = channels_last

        self.alpha = tnn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = tnn.Parameter(torch.ones(normalized_shape))
        self.bias = tnn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        x = torch.tanh(self.alpha * x)
        if self.channels_last:
            x = x * self.weight + self.bias
        else:
            x = x * self.weight[:, None, None] + self.bias[:, None, None]
        return x

    def extra_repr(self):
        return (f"normalized_shape={self.normalized_shape}, alpha_init_value={self.alpha_init_value}, "
                f"channels_last={self.channels_last}")


def convert_ln_to_dyt(module):
    module_output = module
    if isinstance(module, tnn.LayerNorm):
        module_output = DynamicTanh(module.normalized_shape, not isinstance(module, LayerNorm2d))
    for name, child in module.named_children():
        module_output.add_module(name, convert_ln_to_dyt(child))
    del module
    return module_output


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def formula(x, alpha, w=None, b=None, channels_last=True):
    """gamma * tanh(alpha x) + beta in plain torch ops (autograd's reference)."""
    y = torch.tanh(alpha * x)
    shape = w.shape if w is not None else (b.shape if b is not None else None)
    if shape is not None and not channels_last:
        shape = (shape[0],) + (1,) * (x.dim() - 2)      # per channel of dim 1
    if w is not None:
        y = y * w.reshape(shape)
    if b is not None:
        y = y + b.reshape(shape)
    return y


def params(shape, dtype, seed, alpha_shape=(1,)):
    g = torch.Generator().manual_seed(seed)
    alpha = (torch.rand(alpha_shape, generator=g, dtype=torch.float64) + 0.3).to(dtype)
    w = (torch.randn(shape, generator=g, dtype=torch.float64) * 0.5 + 1).to(dtype)
    b = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return alpha, w, b


@st.composite
def dyt_cases(draw):
    """(shape, channels_last, affine shape): 1..4 dims; the last k dims, or (C,) of dim 1."""
    channels_last = draw(st.booleans())
    nd = draw(st.integers(2 if not channels_last else 1, 4))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(nd))
    if channels_last:
        k = draw(st.integers(1, nd))
        return shape, True, shape[nd - k:]
    return shape, False, (shape[1],)


# ---------------------------------------------------------------------------------------
# the function: forward, gradients, precision
# ---------------------------------------------------------------------------------------
@SETTINGS
@given(case=dyt_cases(), affine=st.sampled_from(["both", "weight", "bias", "none"]),
       scalar=st.booleans(), seed=st.integers(0, 2**16))
def test_forward_equals_the_formula_in_float64(case, affine, scalar, seed):
    shape, cl, ashape = case
    x = make_input(shape, torch.float64, seed, loc_scale=False) * 3
    alpha, w, b = params(ashape, torch.float64, seed, () if scalar else (1,))
    w = w if affine in ("both", "weight") else None
    b = b if affine in ("both", "bias") else None
    expect = formula(x, alpha, w, b, cl)
    y = F.dyt(x, alpha, w, b, channels_last=cl)                 # no gradient: the formula path
    assert y.grad_fn is None and y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y, expect, **TOL[torch.float64])
    for t in (x, alpha, w, b):
        if t is not None:
            t.requires_grad_(True)
    y = F.dyt(x, alpha, w, b, channels_last=cl)                 # the Function
    assert type(y.grad_fn).__name__ == "DyTFunctionBackward"
    torch.testing.assert_close(y, expect.detach(), **TOL[torch.float64])


def check_gradients(shape, cl, ashape, dtype, wanted, seed):
    """The hand-derived gradients of the inputs in ``wanted`` (of "xawb") against autograd
    through :func:`formula`; the others are not computed."""
    x = make_input(shape, dtype, seed, loc_scale=False) * 2
    alpha, w, b = params(ashape, dtype, seed)
    dy = make_input(shape, dtype, seed + 1, loc_scale=False)
    runs = []
    for fn in (lambda *t: F.dyt(*t, channels_last=cl), lambda *t: formula(*t, channels_last=cl)):
        leaves = [t.detach().clone().requires_grad_(n in wanted)
                  for n, t in zip("xawb", (x, alpha, w, b))]
        y = fn(*leaves)
        runs.append((y, torch.autograd.grad(y, [t for t in leaves if t.requires_grad], dy)))
    (y, ours), (_, theirs) = runs
    assert type(y.grad_fn).__name__ == "DyTFunctionBackward"     # the hand-derived one
    for a, t in zip(ours, theirs):
        assert a.shape == t.shape and a.dtype == t.dtype
        torch.testing.assert_close(a, t, **GRAD_TOL[dtype])


@SETTINGS
@given(case=dyt_cases(), dtype=dtypes, wanted=st.sets(st.sampled_from("xawb"), min_size=1),
       seed=st.integers(0, 2**16))
def test_hand_derived_gradients_equal_autograd_through_the_formula(case, dtype, wanted, seed):
    check_gradients(*case, dtype, wanted, seed)


@pytest.mark.parametrize("shape, cl, ashape", [
    ((3, 5), True, (5,)), ((2, 3, 4), True, (3, 4)), ((2, 3, 2, 2), False, (3,)),
    ((2, 3, 4), False, (3,)), ((4,), True, (4,)),
])
def test_gradcheck_and_gradgradcheck(shape, cl, ashape):
    x = make_input(shape, torch.float64, 3, loc_scale=False).requires_grad_(True)
    alpha, w, b = (t.requires_grad_(True) for t in params(ashape, torch.float64, 3))
    fn = lambda x, a, w, b: F.dyt(x, a, w, b, channels_last=cl)
    assert torch.autograd.gradcheck(fn, (x, alpha, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, alpha, w, b))
    # without gamma and beta, and straight through the Function
    assert torch.autograd.gradcheck(lambda x, a: F.dyt(x, a, channels_last=cl), (x, alpha))
    assert torch.autograd.gradgradcheck(lambda x, a: F.dyt(x, a, channels_last=cl), (x, alpha))
    lay = F.checks.dyt_layout(x, alpha, w, b, cl)
    assert torch.autograd.gradgradcheck(
        lambda x, a, w, b: GD.DyTFunction.apply(x, a, w, b, lay)[0], (x, alpha, w, b))


def test_second_derivative_equals_autograds():
    """Double backward goes through the hand-derived gradient; it must equal autograd's
    second derivative of the formula (a Hessian-vector product in every input)."""
    x = make_input((3, 4, 5), torch.float64, 4, loc_scale=False).requires_grad_(True)
    alpha, w, b = (t.requires_grad_(True) for t in params((5,), torch.float64, 4))
    dy = make_input((3, 4, 5), torch.float64, 5, loc_scale=False)
    hvp = []
    for fn in (F.dyt, formula):
        grads = torch.autograd.grad(fn(x, alpha, w, b), (x, alpha, w), dy, create_graph=True)
        scalar = sum((g * g).sum() for g in grads)
        hvp.append(torch.autograd.grad(scalar, (x, alpha, w, b), allow_unused=True))
    for a, t in zip(*hvp):
        if t is None:
            assert a is None or torch.count_nonzero(a) == 0
        else:
            torch.testing.assert_close(a, t, **TOL[torch.float64])


def test_the_backward_saturates_where_tanh_does():
    """dL/dx = alpha gamma g (1 - t^2): almost nothing passes where |alpha x| is large, and
    the gradient of x_i depends on element i alone (no sums over other elements)."""
    x = torch.tensor([[0.0, 1.0, 30.0, -30.0]], dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    (dx,) = torch.autograd.grad(F.dyt(x, alpha), x, torch.ones_like(x))
    t = torch.tanh(0.5 * x.detach())
    torch.testing.assert_close(dx, 0.5 * (1 - t * t), rtol=1e-12, atol=0)
    assert dx[0, 0] == 0.5 and dx[0, 2] < 1e-10 and dx[0, 3] < 1e-10


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cl", [True, False])
def test_low_precision_is_computed_in_float32_and_rounded_once(dtype, cl):
    shape, ashape = (4, 6, 3, 3), ((3,) if cl else (6,))
    x = make_input(shape, torch.float32, 6, loc_scale=False).mul(2).to(dtype)
    alpha, w, b = params(ashape, dtype, 6)
    exact = formula(x.float(), alpha.float(), w.float(), b.float(), cl)
    for grad in (False, True):
        xs = x.clone().requires_grad_(grad)
        y = F.dyt(xs, alpha, w, b, channels_last=cl)
        assert y.dtype == dtype
        assert torch.equal(y, exact.to(dtype))               # one rounding, at the end
    # the paper's code rounds after each of its four ops: within a few roundings of ours
    ref = formula(x, alpha, w, b, cl)
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(ref.float(), y.float(), rtol=tol, atol=tol)
    # gradients come back in each tensor's own dtype, close to float32's
    leaves = [t.clone().requires_grad_(True) for t in (x, alpha, w, b)]
    grads = torch.autograd.grad(F.dyt(*leaves, channels_last=cl).float().square().sum(), leaves)
    leaves32 = [t.float().requires_grad_(True) for t in (x, alpha, w, b)]
    y32 = F.dyt(*leaves32, channels_last=cl).to(dtype).float()
    grads32 = torch.autograd.grad(y32.square().sum(), leaves32)
    for g, g32, t in zip(grads, grads32, leaves):
        assert g.dtype == t.dtype
        torch.testing.assert_close(g.float(), g32, rtol=4 * tol,
                                   atol=4 * tol * g32.abs().max().item())


@pytest.mark.parametrize("cl", [True, False])
def test_inputs_with_any_strides(cl):
    """A transposed input, a channels_last memory format, an expanded gradient."""
    base = make_input((5, 4, 3, 2), torch.float64, 13, loc_scale=False)
    alpha, w, b = params((2,) if cl else (4,), torch.float64, 13)
    for x in (base.transpose(1, 3).contiguous().transpose(1, 3),
              base.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3),
              base.contiguous(memory_format=torch.channels_last)):
        assert x.shape == base.shape and not x.is_contiguous()
        leaves = [t.clone().requires_grad_(True) for t in (alpha, w, b)]
        for grad in (False, True):
            xs = x.detach().requires_grad_(grad)
            y = F.dyt(xs, *leaves, channels_last=cl)
            torch.testing.assert_close(y, formula(x, alpha, w, b, cl), **TOL[torch.float64])
        ours = torch.autograd.grad(y.sum(), [xs, *leaves])        # an expanded dL/dy
        ref = [t.detach().clone().requires_grad_(True) for t in (x, alpha, w, b)]
        theirs = torch.autograd.grad(formula(*ref, channels_last=cl).sum(), ref)
        for a, t in zip(ours, theirs):
            torch.testing.assert_close(a, t, **TOL[torch.float64])


def test_output_can_be_modified_in_place():
    x = make_input((3, 4), torch.float64, 7, loc_scale=False).requires_grad_(True)
    alpha, w, b = (t.requires_grad_(True) for t in params((4,), torch.float64, 7))
    for args in ((x, alpha), (x, alpha, w, b)):
        (g1,) = torch.autograd.grad(F.dyt(*args).mul_(3).sum(), x)
        (g2,) = torch.autograd.grad(formula(*args).mul(3).sum(), x)
        torch.testing.assert_close(g1, g2, **TOL[torch.float64])


# ---------------------------------------------------------------------------------------
# the module against the paper's code
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("ns, kw", [
    (8, {}), (torch.Size([3, 4]), {}), (6, {"channels_last": False}),
    (5, {"alpha_init_value": 1.5}),
], ids=["last", "last-2d", "channels-first", "alpha-1.5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_module_equals_the_papers_code_and_state_dict_moves(ns, kw, dtype):
    k = {"channels_last": True, **kw}
    ours = nn.DyT(ns, **kw).to(dtype)
    theirs = DynamicTanh(ns, **k).to(dtype)
    # the same parameters, names, shapes and initial values
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["alpha", "weight", "bias"]
    for key, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], v), key
    assert ours.alpha.shape == (1,)
    assert ours.alpha_init_value == theirs.alpha_init_value
    assert ours.channels_last == theirs.channels_last
    assert ours.normalized_shape == (tuple(ns) if isinstance(ns, torch.Size) else (ns,))
    # paper -> normcore -> paper, with non-default values everywhere
    with torch.no_grad():
        for i, p in enumerate(theirs.parameters()):
            p.copy_(torch.rand_like(p) + 0.25 * i)
    ours.load_state_dict(theirs.state_dict())
    fresh = DynamicTanh(ns, k["channels_last"]).to(dtype)
    fresh.load_state_dict(ours.state_dict())
    for key, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], v) and torch.equal(fresh.state_dict()[key], v)
    # the same outputs and gradients
    shape = (2, 6, 3, 5) if not ours.channels_last else (2, 3) + ours.normalized_shape
    x = make_input(shape, dtype, 8, loc_scale=False).mul(2).requires_grad_(True)
    ya, yb = ours(x), theirs(x)
    torch.testing.assert_close(ya, yb, **TOL[dtype])
    dy = make_input(shape, dtype, 9, loc_scale=False)
    ga = torch.autograd.grad(ya, [x, *ours.parameters()], dy)
    gb = torch.autograd.grad(yb, [x, *theirs.parameters()], dy)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, **GRAD_TOL[dtype])


def test_module_conventions():
    m = nn.DyT([2, 3], alpha_init_value=0.8, elementwise_affine=True, bias=False,
               dtype=torch.float64)
    assert type(m).__module__ == "normcore.nn" and "DyT" in nn.__all__
    assert repr(m) == ("DyT((2, 3), alpha_init_value=0.8, channels_last=True, "
                       "elementwise_affine=True, bias=False)")
    assert [n for n, _ in m.named_parameters()] == ["alpha", "weight"] and m.bias is None
    assert m.alpha.dtype == torch.float64
    with torch.no_grad():
        m.alpha.fill_(3.0), m.weight.fill_(2.0)
    m.reset_parameters()
    assert m.alpha.item() == 0.8 and torch.equal(m.weight, torch.ones(2, 3, dtype=torch.float64))
    bare = nn.DyT(4, elementwise_affine=False)
    assert [n for n, _ in bare.named_parameters()] == ["alpha"]
    x = make_input((3, 4), torch.float32, 10, loc_scale=False)
    torch.testing.assert_close(bare(x), torch.tanh(0.5 * x))
    # train and eval compute the same thing; the module pickles
    m.eval()
    x = make_input((5, 2, 3), torch.float64, 11, loc_scale=False)
    torch.testing.assert_close(m(x), m.train()(x), rtol=0, atol=0)
    torch.testing.assert_close(pickle.loads(pickle.dumps(m))(x), m(x), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------
# convert_ln_to_dyt
# ---------------------------------------------------------------------------------------
def _count(model, cls):
    return sum(isinstance(m, cls) for m in model.modules())


def test_convert_a_transformer_block_replaces_every_layernorm():
    torch.manual_seed(0)
    block = tnn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    twin = convert_ln_to_dyt(tnn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True))
    assert _count(block, tnn.LayerNorm) == 2
    assert nn.convert_ln_to_dyt(block, alpha_init_value=0.7) is block
    assert _count(block, tnn.LayerNorm) == 0 and _count(block, nn.DyT) == 2
    assert block.norm1.alpha.item() == pytest.approx(0.7)
    # the same parameter names as the paper's conversion
    assert list(block.state_dict()) == list(twin.state_dict())
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = block(x)                                      # train mode: forward and backward
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in block.parameters())
    assert block.norm1.alpha.grad.abs() > 0
    # eval, no gradient, batch first: torch's fused kernel would compute LayerNorm (from
    # norm1.eps, which DyT has not); the converted block takes the ordinary path, which
    # calls its DyTs: the post-norm block, written out
    block.eval()
    with torch.no_grad():
        y = block(x)
        h = block.norm1(x + block._sa_block(x, None, None))
        expect = block.norm2(h + block._ff_block(h))
    torch.testing.assert_close(y, expect, **TOL[torch.float32])


def test_convert_an_encoder_stack_with_padding_in_eval():
    torch.manual_seed(1)
    layer = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    enc = tnn.TransformerEncoder(layer, 2, norm=tnn.LayerNorm(8), enable_nested_tensor=True)
    nn.convert_ln_to_dyt(enc).eval()
    assert _count(enc, tnn.LayerNorm) == 0 and _count(enc, nn.DyT) == 5
    x = torch.randn(2, 4, 8)
    pad = torch.tensor([[False] * 4, [False, False, True, True]])
    with torch.no_grad():
        y = enc(x, src_key_padding_mask=pad)
    assert torch.isfinite(y).all() and y.shape == x.shape


def test_convert_carries_shape_affine_dtype_mode_and_takes_normcore_layernorms():
    model = tnn.Sequential(tnn.LayerNorm((3, 4), elementwise_affine=False),
                           nn.LayerNorm(4, bias=False, dtype=torch.float64),
                           tnn.Sequential(tnn.Linear(4, 4), tnn.LayerNorm(4)))
    model[2].eval()
    nn.convert_ln_to_dyt(model)
    a, b, c = model[0], model[1], model[2][1]
    assert all(isinstance(m, nn.DyT) for m in (a, b, c))
    assert a.normalized_shape == (3, 4) and a.weight is None and a.bias is None
    assert b.weight.dtype == torch.float64 and b.bias is None
    assert not c.training and c.weight.shape == (4,)
    # a LayerNorm given alone comes back as a DyT (as the paper's function does)
    assert isinstance(nn.convert_ln_to_dyt(tnn.LayerNorm(5)), nn.DyT)
    assert isinstance(convert_ln_to_dyt(tnn.LayerNorm(5)), DynamicTanh)


def test_convert_makes_timms_layernorm2d_channels_first(monkeypatch):
    # timm is looked up in sys.modules only; here a stand-in package provides LayerNorm2d
    layers = types.ModuleType("timm.layers")
    layers.LayerNorm2d = LayerNorm2d
    monkeypatch.setitem(sys.modules, "timm.layers", layers)
    model = tnn.Sequential(tnn.Conv2d(3, 6, 1), LayerNorm2d(6))
    reference = convert_ln_to_dyt(tnn.Sequential(tnn.Conv2d(3, 6, 1), LayerNorm2d(6)))
    nn.convert_ln_to_dyt(model)
    assert model[1].channels_last is False and reference[1].channels_last is False
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(model(x), reference(x))


# ---------------------------------------------------------------------------------------
# bad input (more in tests/test_bad_input.py): each message names the problem
# ---------------------------------------------------------------------------------------
x234 = torch.randn(2, 3, 4)
a1 = torch.tensor([0.5])


@pytest.mark.parametrize("call, exc, words", [
    (lambda: F.dyt(x234, 0.5), TypeError, "pass torch.tensor([0.5])"),
    (lambda: F.dyt(x234, torch.ones(4)), ValueError, "alpha has shape (4,), expected one scalar"),
    (lambda: F.dyt(x234, torch.ones(1, 1)), ValueError, "alpha has shape (1, 1)"),
    (lambda: F.dyt(x234, torch.ones(1, dtype=torch.long)), TypeError, "alpha has dtype torch.int64"),
    (lambda: F.dyt(x234.long(), a1), TypeError, "input has dtype torch.int64"),
    (lambda: F.dyt(x234, a1, torch.ones(4, dtype=torch.int32)), TypeError, "weight has dtype torch.int32"),
    (lambda: F.dyt(x234, a1, None, torch.ones(4, dtype=torch.bool)), TypeError, "bias has dtype torch.bool"),
    (lambda: F.dyt([[1.0]], a1), TypeError, "input must be a torch.Tensor"),
    (lambda: F.dyt(x234, a1, torch.ones(5)), ValueError, "weight has shape (5,), expected input with shape [*, 5]"),
    (lambda: F.dyt(x234, a1, torch.ones(3)), ValueError, "needs channels_last=False"),
    (lambda: F.dyt(x234, a1, torch.ones(4), torch.ones(3)), ValueError, "bias has shape (3,), expected (4,)"),
    (lambda: F.dyt(x234, a1, None, torch.ones(2, 3, 4, 1)), ValueError, "bias has shape (2, 3, 4, 1)"),
    (lambda: F.dyt(x234, a1, torch.ones(4), channels_last=False), ValueError,
     "weight has shape (4,), but with channels_last=False gamma and beta have one value per channel"),
    (lambda: F.dyt(x234, a1, torch.ones(3, 4), channels_last=False), ValueError, "expected (3,)"),
    (lambda: F.dyt(torch.randn(5), a1, channels_last=False), ValueError, "(N, C, *)"),
    (lambda: F.dyt(x234, a1, channels_last=1), TypeError, "channels_last must be True or False"),
    (lambda: F.dyt(x234, a1, normalized_shape=(3,)), ValueError, "normalized_shape has shape (3,)"),
    (lambda: nn.DyT(5)(x234), ValueError, "expected input with shape [*, 5], but got input of size [2, 3, 4]"),
    (lambda: nn.DyT(5, elementwise_affine=False)(x234), ValueError, "expected input with shape [*, 5]"),
    (lambda: nn.DyT(4, channels_last=False)(x234), ValueError, "expected (3,)"),
    (lambda: nn.DyT(4, True), TypeError, "positional argument"),
    (lambda: nn.DyT([2, 3], channels_last=False), ValueError, "normalized_shape must be (C,)"),
    (lambda: nn.DyT(0), ValueError, "non-empty and positive"),
    (lambda: nn.DyT(4, alpha_init_value=float("nan")), ValueError, "alpha_init_value must be a finite number"),
    (lambda: nn.DyT(4, alpha_init_value="0.5"), ValueError, "alpha_init_value must be a finite number"),
    (lambda: nn.DyT(4, channels_last="yes"), TypeError, "channels_last must be True or False"),
    (lambda: nn.convert_ln_to_dyt(tnn.LayerNorm(4), alpha_init_value=None), ValueError,
     "alpha_init_value"),
    (lambda: GD.DyTFunction.apply(x234, a1, torch.ones(4), None, None), ValueError,
     "need the layout"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_input_gives_a_clear_error(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------
# the checks can fail: break the backward on purpose and watch them notice
# ---------------------------------------------------------------------------------------
def test_a_backward_without_one_minus_t_squared_is_caught(monkeypatch):
    # forgetting tanh' = 1 - t^2 (differentiating as if tanh were the identity)
    monkeypatch.setattr(GD, "tanh_derivative", torch.ones_like)
    x = make_input((3, 4), torch.float64, 12, loc_scale=False).requires_grad_(True)
    alpha, w, b = (t.requires_grad_(True) for t in params((4,), torch.float64, 12))
    assert not torch.autograd.gradcheck(F.dyt, (x, alpha, w, b), raise_exception=False)
    for wanted in ("x", "a"):
        with pytest.raises(AssertionError):
            check_gradients((3, 4), True, (4,), torch.float32, wanted, 0)
    check_gradients((3, 4), True, (4,), torch.float32, "wb", 0)    # gamma, beta: no tanh'
