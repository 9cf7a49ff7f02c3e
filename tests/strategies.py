"""Shared hypothesis strategies and tolerances for the package tests."""
import torch
from hypothesis import strategies as st

from normcore import data

#: float32 at torch's usual tolerances (torch.testing defaults), float64 tight.
TOL = {
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.float64: dict(rtol=1e-10, atol=1e-10),
}
#: gradients accumulate more rounding in float32
GRAD_TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.float64: dict(rtol=1e-9, atol=1e-9),
}

dtypes = st.sampled_from([torch.float32, torch.float64])


@st.composite
def nchw_shapes(draw, min_spatial=0, max_spatial=3, max_channels=32, min_batch=2, max_batch=16):
    """(N, C, *spatial) with 0..3 spatial dims, N in 2..16, C in 1..32, small spatial sizes."""
    n = draw(st.integers(min_batch, max_batch))
    c = draw(st.integers(1, max_channels))
    k = draw(st.integers(min_spatial, max_spatial))
    spatial = tuple(draw(st.integers(1, 5 if k < 3 else 3)) for _ in range(k))
    return (n, c) + spatial


def make_input(shape, dtype, seed, loc_scale=True):
    """A seeded input whose channels have different means and scales (normcore.data)."""
    g = data.generator(seed)
    if not loc_scale:
        return data.normal(g, shape, dtype)
    return data.structured(g, shape, dtype, scale=(0.25, 4.25), shift=3.0, sample_shift=0.0)


def make_affine(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed + 1)
    w = (torch.randn(shape, generator=g, dtype=torch.float64) * 0.5 + 1).to(dtype)
    b = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return w, b


def condition(x, labels, eps=1e-5):
    """``max |x_i| / sqrt(var_i + eps)`` over the elements, each with its set's variance
    (``labels`` from :func:`normcore.axes.stat_groups`): how much a rounding of the inputs, of
    relative size u, can move ``x_hat`` (by about ``u * condition``)."""
    xd, lab = x.detach().double().flatten(), labels.flatten()
    count = torch.bincount(lab).double()
    mean = torch.bincount(lab, xd) / count
    var = torch.bincount(lab, (xd - mean[lab]) ** 2) / count
    return float((xd.abs() / torch.sqrt(var[lab] + eps)).max())


def assert_matches(ours, theirs, dtype, grad=False, exact=None, kappa=None):
    """float64: tight agreement with torch.  float32: torch's usual tolerances, or, where the
    problem is ill-conditioned (a tiny spread relative to the mean), an error against a float64
    reference ``exact`` within what the conditioning allows: 4 times torch's own error, or 4
    roundings amplified by the condition number ``kappa`` (:func:`condition`), whichever is
    larger. Torch's error alone is no bound: which of two float32 paths is luckier on an
    ill-conditioned set changes with the CPU's kernels (with ``ATEN_CPU_CAPABILITY=default``
    torch's error on one such input is 20 times smaller than with AVX-512, and ours the same)."""
    tol = (GRAD_TOL if grad else TOL)[dtype]
    if exact is None or torch.allclose(ours, theirs, **tol):
        torch.testing.assert_close(ours, theirs, **tol)
        return
    err_ours = (ours.double() - exact).abs().max().item()
    err_torch = (theirs.double() - exact).abs().max().item()
    scale = exact.abs().max().item()
    rounding = 4 * torch.finfo(dtype).eps / 2 * (kappa or 0.0) * scale
    allowed = max(4 * err_torch, rounding) + tol["atol"] + tol["rtol"] * scale
    assert err_ours <= allowed, (err_ours, err_torch, allowed)
