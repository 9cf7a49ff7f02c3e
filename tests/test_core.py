"""The numeric core and the reference backward: the fast paths of grad.Normalize agree with
the boxed formula written once (grad.boxed_backward) for every set, and the core's formula
covers RMSNorm (an uncentered row of the table)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
from normcore import axes, core, grad, passes

CASES = [  # (norm, shape, num_groups, normalized_ndim)
    ("batch", (5, 3), None, None), ("batch", (4, 3, 6), None, None),
    ("batch", (2, 3, 4, 5), None, None), ("instance", (2, 3, 7), None, None),
    ("instance", (2, 3, 4, 5), None, None), ("group", (2, 6, 5), 3, None),
    ("group", (2, 6, 3, 4), 2, None), ("group", (3, 4), 2, None),
    ("layer", (3, 4, 5), None, None), ("layer", (3, 4, 5), None, 1),
    ("layer", (2, 3, 4, 5), None, 2), ("layer", (6, 7), None, None),
    ("rms", (3, 8), None, None), ("rms", (2, 3, 4), None, 1), ("rms", (2, 3, 4, 5), None, 3),
]


@pytest.mark.parametrize("norm, shape, G, k", CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_fast_backward_equals_the_boxed_formula(norm, shape, G, k, affine):
    gen = torch.Generator().manual_seed(len(shape) * 7 + (G or 0))
    lay = axes.layout(norm, shape, G, k)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 1).requires_grad_(True)
    w = b = None
    if affine:
        w = (torch.rand(lay.affine_shape, generator=gen, dtype=torch.float64) + 0.5).requires_grad_(True)
        b = torch.randn(lay.affine_shape, generator=gen, dtype=torch.float64).requires_grad_(True)
    gy = torch.randn(shape, generator=gen, dtype=torch.float64)
    y = grad.Normalize.apply(x, w, b, lay, 1e-5)[0]
    leaves = [t for t in (x, w, b) if t is not None]
    fast = torch.autograd.grad(y, leaves, gy)
    st = core.standardize(x.detach(), lay, 1e-5)
    ref = grad.boxed_backward(gy, st.xhat, st.inv_std, None if w is None else w.detach(), lay)
    torch.testing.assert_close(fast[0], ref[0])
    if affine:
        torch.testing.assert_close(fast[1], ref[1])
        torch.testing.assert_close(fast[2], ref[2])
    # and both are autograd's derivative of the formula itself
    auto = torch.autograd.grad(core.normalize_formula(x, lay, 1e-5, w, b).output, leaves, gy)
    for a, f in zip(auto, fast):
        torch.testing.assert_close(f, a)


@pytest.mark.parametrize("norm, shape, G, k", CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_forward_without_gradients_is_the_same(norm, shape, G, k, affine):
    """With or without an input needing a gradient, Normalize keeps x - mu (BN, IN, GN) or
    x_hat (LN, RMSNorm) and returns it (torch.func's form: setup_context sees only inputs and
    outputs).  Both give the formula's output and statistics, and an output the caller may
    modify in place."""
    gen = torch.Generator().manual_seed(len(shape) * 5 + (G or 0))
    lay = axes.layout(norm, shape, G, k)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 2 + 3
    w = b = None
    if affine:
        w = torch.rand(lay.affine_shape, generator=gen, dtype=torch.float64) + 0.5
        b = torch.randn(lay.affine_shape, generator=gen, dtype=torch.float64)
    ref = core.normalize_formula(x, lay, 1e-5, w, b)
    plain = grad.Normalize.apply(x, w, b, lay, 1e-5)
    tracked = grad.Normalize.apply(x.clone().requires_grad_(True), w, b, lay, 1e-5)
    for got in (plain, tracked):
        torch.testing.assert_close(got[0], ref.output)
        torch.testing.assert_close(got[1], ref.mean)
        torch.testing.assert_close(got[2], ref.var)
    plain[0].add_(1.0)                      # a fresh tensor, not a view of a temporary
    torch.testing.assert_close(plain[0], ref.output + 1.0)


def test_the_reference_backward_can_fail():
    """Drop the mean term of the boxed formula and the centered norms disagree with it."""
    lay = axes.layout("batch", (4, 3))
    x = torch.randn(4, 3, dtype=torch.float64)
    gy = torch.randn(4, 3, dtype=torch.float64)
    st = core.standardize(x, lay, 1e-5)
    good = grad.boxed_backward(gy, st.xhat, st.inv_std, None, lay)[0]
    bad = grad.boxed_backward(gy, st.xhat, st.inv_std, None,
                              axes.roles_layout((4, 3), ("N",), centered=False))[0]
    assert not torch.allclose(good, bad)


@pytest.mark.parametrize("shape, k", [((3, 8), 1), ((2, 3, 4), 2), ((2, 5, 4, 3), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_matches_torch(shape, k, dtype):
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(shape, generator=gen, dtype=dtype) + 0.5).requires_grad_(True)
    w = (torch.rand(shape[-k:], generator=gen, dtype=dtype) + 0.5).requires_grad_(True)
    gy = torch.randn(shape, generator=gen, dtype=dtype)
    outs = []
    for fn in (F.rms_norm, TF.rms_norm):
        for eps in (None, 1e-3):
            y = fn(x, shape[-k:], w, eps)
            outs.append((y, *torch.autograd.grad(y, (x, w), gy)))
    for ours, theirs in zip(outs[:2], outs[2:]):
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b)


def test_rms_norm_has_no_centering():
    x = torch.full((2, 4), 3.0, dtype=torch.float64)
    torch.testing.assert_close(F.rms_norm(x, (4,), eps=0.0 + 1e-12), torch.ones(2, 4, dtype=torch.float64))
    assert not axes.layout("rms", (2, 4)).centered


# ---------------------------------------------------------------------------------------
# float32 rounding: the sums of squares and the output's two forms (core.affine_terms)
# ---------------------------------------------------------------------------------------
U32 = 2.0 ** -24      # one float32 rounding, relative


@pytest.mark.parametrize("n", [512, 1024, 8192])
def test_sum_of_squares_precise_and_exact_are_float64(n):
    rows = torch.randn(64, n, generator=torch.Generator().manual_seed(n)) * 3 + 1
    ref = rows.double().square().sum(-1)
    plain = passes.sum_of_squares(rows)
    precise = passes.sum_of_squares(rows, precise=True)
    exact = passes.sum_of_squares(rows, exact=True)
    assert plain.dtype == torch.float32 and precise.dtype == exact.dtype == torch.float64
    assert ((exact - ref).abs() / ref).max() < 1e-14
    # chunks of 64 in float64: a fraction of the rounding the float32 result carries
    assert ((precise - ref).abs() / ref).max() < 2 * U32
    assert ((plain.double() - ref).abs() / ref).max() < 4 * U32
    # float64 rows: the flags change nothing but the accumulation's own precision
    assert passes.sum_of_squares(rows.double(), precise=True).dtype == torch.float64


def _split_case(mu):
    """An (N, C, P) view with per-set means ``mu`` (sigma 1) and its float64 statistics."""
    x = torch.randn(4, len(mu), 256, generator=torch.Generator().manual_seed(0)) \
        + torch.tensor(mu).view(1, -1, 1)
    mean = x.double().mean((0, 2), keepdim=True)
    return x, mean, ((x.double() - mean) ** 2).mean((0, 2), keepdim=True)


def test_affine_terms_split_at_two_sigma():
    # a set whose mean is within 2 sigma of 0 takes x s + (beta - mu s), the others
    # (x - mu) s + beta; s is gamma r rounded once from float64
    _, mean, var = _split_case([0.0, 1.5, 2.5, 300.0])
    w, b = torch.tensor([0.5, 1.0, 1.5, 2.0]), torch.tensor([0.1, -0.2, 0.3, 0.0])
    m32 = mean.float()
    s_x, s_c, t = core.affine_terms(m32, (mean - m32.double()).float(), var.float(), 1e-5,
                                    (1, 4, 1), w, b)
    near = torch.tensor([True, True, False, False]).view(1, 4, 1)
    s = (torch.rsqrt(var.float().double() + 1e-5) * w.double().view(1, 4, 1)).float()
    assert torch.equal(s_x, torch.where(near, s, torch.zeros_like(s)))
    assert torch.equal(s_c, torch.where(near, torch.zeros_like(s), s))
    mu = m32.double() + (mean - m32.double()).float().double()
    expect = b.double().view(1, 4, 1) - torch.where(near, mu, torch.zeros_like(mu)) * s.double()
    assert torch.equal(t, expect.float())


@pytest.mark.parametrize("into_centered", [False, True])
def test_apply_affine_terms_is_the_formula(into_centered):
    x, mean, var = _split_case([0.3, -1.0, 4.0, 300.0])     # both forms in one tensor
    w, b = torch.rand(4, generator=torch.Generator().manual_seed(1)) + 0.5, torch.randn(4)
    m32 = mean.float()
    delta = (mean - m32.double()).float()
    terms = core.affine_terms(m32, delta, var.float(), 1e-5, (1, 4, 1), w, b)
    centered = x - m32 - delta
    out = centered if into_centered else torch.empty_like(x)
    y = core.apply_affine_terms(x, centered, terms, out=out)
    assert y is out
    ref = (x.double() - mean) * torch.rsqrt(var + 1e-5) * w.double().view(1, 4, 1) \
        + b.double().view(1, 4, 1)
    err = (y.double() - ref).abs().max() / ref.abs().max()
    assert err < 4 * U32, err



@pytest.mark.parametrize("n", [1024, 192, 100])
def test_row_sums_are_float64_sums_to_a_fraction_of_a_rounding(n):
    """passes.row_sums: by chunks of 256 (1024), of 64 (192), or the whole row in float64 (100)."""
    x = torch.randn(64, n, generator=torch.Generator().manual_seed(n)) + 0.5
    got = passes.row_sums(x)
    assert got.dtype == torch.float64 and got.shape == (64, 1)
    ref = x.double().sum(1, keepdim=True)
    scale = x.double().abs().sum(1, keepdim=True)
    assert ((got - ref).abs() / scale).max() <= torch.finfo(torch.float32).eps / 2
    assert torch.equal(passes.row_sums(x, exact=True), ref)


def test_column_sums_by_32_rows_then_in_float64():
    x = torch.randn(1024, 512, generator=torch.Generator().manual_seed(3))
    out = torch.empty(512, dtype=torch.float64)
    passes.column_sums(x, out)
    ref = x.double().sum(0)
    assert ((out - ref).abs() / x.double().abs().sum(0)).max() <= torch.finfo(torch.float32).eps / 8


def test_sum_of_squares_double_keeps_the_chunks_of_256_in_float64():
    x = torch.randn(8, 2048, generator=torch.Generator().manual_seed(5))
    got = passes.sum_of_squares(x, double=True)
    assert got.dtype == torch.float64 and passes.sum_of_squares(x).dtype == torch.float32
    ref = x.double().square().sum(1)
    assert ((got - ref).abs() / ref).max() <= torch.finfo(torch.float32).eps
    assert torch.equal(passes.sum_of_squares(x).double(), got.float().double())


def test_sum_of_squares_takes_the_chunk_size_asked_for():
    # GroupNorm and InstanceNorm ask for chunks of 128 (groups._precise_groups)
    x = torch.randn(8, 2048, generator=torch.Generator().manual_seed(6)) * 3 + 1
    for size in (64, 128, 256):
        norms = torch.linalg.vector_norm(x.view(8, -1, size), dim=-1)
        want = norms.double().square().sum(-1)
        assert torch.equal(passes.sum_of_squares(x, precise=True, chunk=size), want)
    assert torch.equal(passes.sum_of_squares(x, precise=True),
                       passes.sum_of_squares(x, precise=True, chunk=64))
    assert not torch.equal(passes.sum_of_squares(x, precise=True, chunk=128),
                           passes.sum_of_squares(x, precise=True, chunk=64))


@pytest.mark.parametrize("shape, dims", [((8, 16, 32, 32), (0, 2, 3)), ((8, 16, 32, 32), (2, 3)),
                                         ((4, 6, 5), (0, 2)), ((4, 6, 5), ())])
def test_sum_keep_double_gives_the_float64_sums_that_round_to_the_float32_ones(shape, dims):
    # BN and IN's float32 backward keep the sums in float64 (normcore.grad._float32_backward)
    t = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    single, double = passes.sum_keep(t, dims), passes.sum_keep(t, dims, double=True)
    assert single.dtype == torch.float32 and double.dtype == torch.float64
    assert double.shape == single.shape
    assert torch.equal(double.float(), single)
    exact = t.double().sum(dims, keepdim=True) if dims else t.double()
    assert (double - exact).abs().max() <= 1e-5 * exact.abs().max()
    out = torch.empty_like(t)
    prods = passes.sum_of_products(t, t, dims, out=out, double=True)
    assert prods.dtype == torch.float64 and torch.equal(prods.float(), passes.sum_keep(t * t, dims))


@pytest.mark.parametrize("shape, s_shape", [((64, 1024), (64, 1)), ((4, 8, 2, 192), (4, 8, 2, 1)),
                                            ((4, 8, 2, 192), (1, 8, 2, 1)),
                                            ((4, 8, 100), (4, 8, 1)), ((0, 8, 128), (1, 8, 1))])
@pytest.mark.parametrize("in_place", [False, True])
def test_row_affine_is_one_fused_multiply_add_bit_for_bit(shape, s_shape, in_place):
    """passes.row_affine: x s + t with one s, t per row, in one addcmul (blocks of 64 columns),
    or, for a last dim not cut so (100), copy and addcmul_: the same bits either way."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=g) * 3 + 1
    s, t = torch.rand(s_shape, generator=g) + 0.5, torch.randn(s_shape, generator=g)
    ref = torch.empty(shape).copy_(t.expand(shape)).addcmul_(x, s)       # one rounding (FMA)
    out = x.clone() if in_place else torch.empty(shape)
    got = passes.row_affine(out if in_place else x, s, t, out=out)
    assert got is out and torch.equal(got, ref)
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT" and x.numel():
        assert not torch.equal(got, x * s + t), "not one rounding: the product rounded apart"
