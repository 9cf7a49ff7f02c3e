"""The numeric core and the reference backward: grad.Normalize agrees with the boxed formula
written once (grad.boxed_backward) for every set, the core's formula covers RMSNorm (an
uncentered row of the table), and core.set_sum is accurate and sums each set on its own."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
from normcore import axes, core, grad

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
# the sums: accurate, and each set on its own
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, dims", [((8, 16, 32, 32), (0, 2, 3)), ((8, 16, 32, 32), (1, 2, 3)),
                                         ((4, 6, 5), (0, 2)), ((4, 6, 5), ()), ((3, 7919), (1,)),
                                         ((2, 3, 0), (2,)), ((4096, 8), (0,))])
def test_set_sum_is_the_sum_in_float64(shape, dims):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    got = core.set_sum(t, dims)
    assert got.dtype == torch.float64
    exact = t.double().sum(dims, keepdim=True) if dims else t.double()
    assert got.shape == exact.shape
    assert (got - exact).abs().max() <= 1e-5 * max(exact.abs().max().item(), 1.0)


@pytest.mark.parametrize("n", [65536, 3 * 1024 * 64, 7919 * 8])
def test_set_sum_of_one_set_is_that_of_the_same_set_in_a_batch(n):
    """torch splits a reduction with a single output among its threads: one set alone (a batch
    of one) would sum in another order than the same set beside others.  set_sum sums rows of
    at most core.ROW values first, so every reduction has an output per row."""
    t = torch.randn(4, n, generator=torch.Generator().manual_seed(n))
    assert torch.equal(core.set_sum(t[:1], (1,)), core.set_sum(t, (1,))[:1])
    assert core._row(n) <= core.ROW and n % core._row(n) == 0


def test_a_plain_sum_of_one_set_can_differ_from_the_batched_one():
    """Why set_sum exists: torch's own sum of one long row (split among the threads) against
    the same row summed beside others: not the same bits on this machine's kernels (the
    check of the test above would fail with a plain sum); with two threads, as pytest's
    workers may run on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        t = torch.randn(32, 64 * 32 * 32, generator=torch.Generator().manual_seed(0))
        split = [torch.equal(t[k:k + 1].sum(1), t.sum(1)[k:k + 1]) for k in range(32)]
        mine = [torch.equal(core.set_sum(t[k:k + 1], (1,)), core.set_sum(t, (1,))[k:k + 1])
                for k in range(32)]
    finally:
        torch.set_num_threads(before)
    assert not all(split) and all(mine)
