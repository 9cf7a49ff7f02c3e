"""The fast paths agree with the readable ones: LayerNorm and RMSNorm by blocks of rows or by
compiled loops over each row (normcore.loops, numba: the `loops_or_blocks` fixture of conftest.py
runs a test by each), and GroupNorm and InstanceNorm recomputing x - mu (normcore.rows),
against core.normalize_formula, grad.boxed_backward and torch, on the shapes that select the
paths and on shapes that do not; and outputs keep the memory format torch's do
(channels_last)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
from normcore import axes, core, grad, groups, rows


@pytest.fixture
def small_blocks(monkeypatch):
    """The row path on small tensors: every input of 64 elements or more, blocks of 40
    elements, so that the shapes below have several blocks and a short last one."""
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 64)
    monkeypatch.setattr(rows, "BLOCK_ELEMENTS", max(1, 40 // torch.get_num_threads()))


def _record(monkeypatch, module, name: str) -> list:
    """The results of every call of ``module.name`` from now on, in a list it appends to."""
    results, fn = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: results.append(fn(*a)) or results[-1])
    return results


def _fast_path_equals_the_reference(lay, x, affine, gen):
    """Normalize on ``lay`` (a fast path) against the formula (output, statistics) and the
    boxed backward (each gradient), and a second backward through the same graph against
    the first (nothing saved was overwritten)."""
    w = b = None
    if affine in ("both", "weight"):
        w = (torch.rand(lay.affine_shape, generator=gen, dtype=torch.float64) + 0.5).requires_grad_(True)
    if affine in ("both", "bias"):
        b = torch.randn(lay.affine_shape, generator=gen, dtype=torch.float64).requires_grad_(True)
    gy = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    y, mean, var = grad.Normalize.apply(x, w, b, lay, 1e-5)[:3]
    ref = core.normalize_formula(x, lay, 1e-5, w, b)
    torch.testing.assert_close(y, ref.output)
    torch.testing.assert_close(mean, ref.mean)
    torch.testing.assert_close(var, ref.var)
    leaves = [t for t in (x, w, b) if t is not None]
    fast = torch.autograd.grad(y, leaves, gy, retain_graph=True)
    st = core.standardize(x.detach(), lay, 1e-5)
    boxed = grad.boxed_backward(gy, st.xhat, st.inv_std, None if w is None else w.detach(), lay)
    torch.testing.assert_close(fast[0], boxed[0])
    if w is not None:
        torch.testing.assert_close(fast[1], boxed[1])
    if b is not None:
        torch.testing.assert_close(fast[-1], boxed[2])
    again = torch.autograd.grad(y, leaves, gy)
    for a, f in zip(again, fast):
        torch.testing.assert_close(a, f, rtol=0, atol=0)


ROW_CASES = [  # (norm, shape, normalized_ndim, affine): rows of 8, 12 and 35 elements
    *[("layer", shape, k, affine) for shape, k in (((3, 5, 8), 1), ((6, 3, 4), 2), ((2, 5, 7), 2))
      for affine in ("both", "weight", "bias", "none")],
    *[("rms", shape, 1, affine) for shape in ((3, 5, 8), (6, 12)) for affine in ("weight", "none")],
]


@pytest.mark.parametrize("norm, shape, k, affine", ROW_CASES)
def test_row_blocks_equal_the_formula_and_the_boxed_backward(small_blocks, loops_or_blocks, norm, shape, k,
                                                              affine):
    gen = torch.Generator().manual_seed(len(shape) * 11 + k)
    lay = axes.layout(norm, shape, normalized_ndim=k)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 2).requires_grad_(True)
    assert rows.applies(lay, x) and len(rows._blocks(lay.num_sets, lay.set_size)) > 1
    _fast_path_equals_the_reference(lay, x, affine, gen)


@pytest.mark.parametrize("large_mean", [False, True])
def test_row_blocks_one_pass_statistics_and_their_fallback(small_blocks, monkeypatch, large_mean):
    monkeypatch.setenv("NORMCORE_NUMBA", "0")             # the blocks' statistics
    """Sets whose mean is small beside their spread take the one-pass statistics; one set
    with a large mean sends every block to the corrected two-pass sweep: both the formula's."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(4, 6, 64, generator=gen, dtype=torch.float64)
    if large_mean:
        x[2, 3] += 50.0
    lay = axes.layout("layer", x.shape, normalized_ndim=1)
    seen = _record(monkeypatch, rows, "_one_pass")
    shifts = _record(monkeypatch, rows, "_near_shift")
    _fast_path_equals_the_reference(lay, x.requires_grad_(True), "both", gen)
    assert seen == [not large_mean]
    # the backward recomputes x_hat = x r + (-mu0 r) in one pass after the one-pass forward
    assert shifts and all((s is None) == large_mean for s in shifts)


@pytest.mark.parametrize("wanted", ["x", "weight", "bias"])
def test_row_blocks_give_only_the_gradients_asked_for(small_blocks, loops_or_blocks, wanted):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 10, generator=gen, dtype=torch.float64)
    w = torch.rand(10, generator=gen, dtype=torch.float64) + 0.5
    b = torch.randn(10, generator=gen, dtype=torch.float64)
    gy = torch.randn(4, 6, 10, generator=gen, dtype=torch.float64)
    leaf = {"x": x, "weight": w, "bias": b}[wanted].requires_grad_(True)
    got = torch.autograd.grad(F.layer_norm(x, (10,), w, b), leaf, gy)[0]
    xr, wr, br = (t.detach().clone().requires_grad_(t is leaf) for t in (x, w, b))
    ref = torch.autograd.grad(TF.layer_norm(xr, (10,), wr, br), {"x": xr, "weight": wr, "bias": br}[wanted], gy)[0]
    torch.testing.assert_close(got, ref)


def test_row_blocks_are_twice_differentiable(small_blocks, loops_or_blocks):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(6, generator=gen, dtype=torch.float64) + 0.5).requires_grad_(True)
    b = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    assert rows.applies(axes.layout("layer", x.shape, normalized_ndim=1), x)
    assert torch.autograd.gradgradcheck(lambda x, w, b: F.layer_norm(x, (6,), w, b), (x, w, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_row_blocks_in_half_precision_match_torch(small_blocks, dtype):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, 5, 16, generator=gen).to(dtype).requires_grad_(True)
    w = (torch.rand(16, generator=gen) + 0.5).to(dtype).requires_grad_(True)
    b = torch.randn(16, generator=gen).to(dtype).requires_grad_(True)
    gy = torch.randn(4, 5, 16, generator=gen).to(dtype)
    y = F.layer_norm(x, (16,), w, b)
    got = torch.autograd.grad(y, (x, w, b), gy)
    xr, wr, br = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    yr = TF.layer_norm(xr, (16,), wr, br)
    ref = torch.autograd.grad(yr, (xr, wr, br), gy)
    assert y.dtype == dtype and all(g.dtype == dtype for g in got)
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y, yr, **tol)
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, **tol)


@pytest.mark.parametrize("norm, shape, G, k", [
    ("group", (4, 6, 5), 3, None), ("instance", (4, 3, 7), None, None),
    ("batch", (5, 3, 4), None, None), ("layer", (3, 5, 8), None, 1)])
def test_batch_norm_and_inputs_made_non_contiguous_take_the_plain_path(small_blocks, norm, shape, G, k):
    lay = axes.layout(norm, shape, G, k)
    x = torch.randn(shape, dtype=torch.float64)
    assert rows.applies(lay, x) == (norm != "batch")
    xt = torch.randn(tuple(reversed(shape)), dtype=torch.float64).permute(*range(len(shape) - 1, -1, -1))
    assert not rows.applies(lay, xt)              # a permuted input: the plain path
    xt.requires_grad_(True)
    y = grad.Normalize.apply(xt, None, None, lay, 1e-5)[0]
    torch.testing.assert_close(y, core.normalize_formula(xt, lay, 1e-5).output)


def test_row_blocks_at_their_real_size_match_torch(loops_or_blocks):
    """Default thresholds: a (64, 16, 1024) input in blocks of 512 rows per thread."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 16, 1024, generator=gen) * 2 + 3).requires_grad_(True)
    w = (torch.rand(1024, generator=gen) + 0.5).requires_grad_(True)
    b = torch.randn(1024, generator=gen).requires_grad_(True)
    lay = axes.layout("layer", x.shape, normalized_ndim=1)
    blocks = rows._blocks(lay.num_sets, lay.set_size)
    assert rows.applies(lay, x) and blocks[0] == (0, min(1024, 512 * torch.get_num_threads()))
    gy = torch.randn(x.shape, generator=gen)
    y = F.layer_norm(x, (1024,), w, b)
    got = torch.autograd.grad(y, (x, w, b), gy)
    xr, wr, br = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    yr = TF.layer_norm(xr, (1024,), wr, br)
    ref = torch.autograd.grad(yr, (xr, wr, br), gy)
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-3)
    with torch.no_grad():                                    # the no-gradient path too
        torch.testing.assert_close(F.layer_norm(x, (1024,), w, b), yr, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# GroupNorm and InstanceNorm: x - mu recomputed in the backward (groups.forward_groups)
# ---------------------------------------------------------------------------------------
GROUP_CASES = [("group", (3, 6, 5), 3), ("group", (2, 6, 3, 4), 2), ("group", (2, 4, 3, 2, 3), 4),
               ("group", (3, 4, 7), 1), ("instance", (3, 4, 7), None), ("instance", (2, 3, 4, 5), None)]


@pytest.mark.parametrize("norm, shape, G", GROUP_CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_group_path_equals_the_formula_and_the_boxed_backward(small_blocks, loops_or_blocks, norm,
                                                               shape, G, affine):
    gen = torch.Generator().manual_seed(len(shape) * 13 + (G or 0))
    lay = axes.layout(norm, shape, G)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 2).requires_grad_(True)
    assert rows.applies(lay, x)
    _fast_path_equals_the_reference(lay, x, affine, gen)


@pytest.mark.parametrize("wanted", ["x", "weight", "bias"])
def test_group_path_gives_only_the_gradients_asked_for(small_blocks, loops_or_blocks, wanted):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 6, 4, 5, generator=gen, dtype=torch.float64)
    w = torch.rand(6, generator=gen, dtype=torch.float64) + 0.5
    b = torch.randn(6, generator=gen, dtype=torch.float64)
    gy = torch.randn(3, 6, 4, 5, generator=gen, dtype=torch.float64)
    leaf = {"x": x, "weight": w, "bias": b}[wanted].requires_grad_(True)
    got = torch.autograd.grad(F.group_norm(x, 3, w, b), leaf, gy)[0]
    xr, wr, br = (t.detach().clone().requires_grad_(t is leaf) for t in (x, w, b))
    ref = torch.autograd.grad(TF.group_norm(xr, 3, wr, br), {"x": xr, "weight": wr, "bias": br}[wanted], gy)[0]
    torch.testing.assert_close(got, ref)


def test_group_path_is_twice_differentiable_and_matches_torch_in_bfloat16(small_blocks,
                                                                           loops_or_blocks):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(4, generator=gen, dtype=torch.float64) + 0.5).requires_grad_(True)
    b = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, w, b: F.group_norm(x, 2, w, b), (x, w, b))
    xb = torch.randn(4, 8, 5, 5, generator=gen).bfloat16().requires_grad_(True)
    gy = torch.randn(4, 8, 5, 5, generator=gen).bfloat16()
    y = F.group_norm(xb, 4)
    got = torch.autograd.grad(y, xb, gy)[0]
    xr = xb.detach().clone().requires_grad_(True)
    yr = TF.group_norm(xr, 4)
    ref = torch.autograd.grad(yr, xr, gy)[0]
    assert y.dtype == got.dtype == torch.bfloat16
    torch.testing.assert_close(y, yr, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------
# memory format: outputs as torch's (channels_last kept by BN, GN and RMSNorm; IN and LN
# return contiguous outputs), with and without gradients, values unchanged
# ---------------------------------------------------------------------------------------
C = 8
_RM, _RV = torch.randn(C), torch.rand(C) + 0.5
_W, _B = torch.rand(C) + 0.5, torch.randn(C)
FORMAT_CASES = {
    "batch train": lambda m, x: m.batch_norm(x, _RM.clone(), _RV.clone(), _W, _B, True),
    "batch eval": lambda m, x: m.batch_norm(x, _RM, _RV, _W, _B, False),
    "instance": lambda m, x: m.instance_norm(x, weight=_W, bias=_B),
    "instance running": lambda m, x: m.instance_norm(x, _RM.clone(), _RV.clone(), _W, _B),
    "group": lambda m, x: m.group_norm(x, 4, _W, _B),
    "layer (C, *S)": lambda m, x: m.layer_norm(x, x.shape[1:]),
    "layer last dim": lambda m, x: m.layer_norm(x, x.shape[-1:]),
    "rms (C, *S)": lambda m, x: m.rms_norm(x, list(x.shape[1:])),
}


@pytest.mark.parametrize("case", sorted(FORMAT_CASES))
@pytest.mark.parametrize("shape, fmt", [((4, C, 5, 6), torch.channels_last),
                                        ((2, C, 3, 4, 5), torch.channels_last_3d)])
@pytest.mark.parametrize("with_grad", [False, True])
def test_outputs_keep_the_memory_format_torch_keeps(case, shape, fmt, with_grad):
    fn = FORMAT_CASES[case]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(memory_format=fmt)
    gy = torch.randn(shape).to(memory_format=fmt)
    out = {}
    for name, mod in (("torch", TF), ("normcore", F)):
        xs = x.detach().clone(memory_format=torch.preserve_format).requires_grad_(with_grad)
        y = fn(mod, xs)
        out[name] = (y, torch.autograd.grad(y, xs, gy)[0] if with_grad else None)
    (yt, gt), (yn, gn) = out["torch"], out["normcore"]
    assert yn.is_contiguous(memory_format=fmt) == yt.is_contiguous(memory_format=fmt)
    assert yn.is_contiguous() == yt.is_contiguous()
    torch.testing.assert_close(yn, yt, rtol=1e-4, atol=1e-4)
    if with_grad:
        assert gn.is_contiguous(memory_format=fmt) == gt.is_contiguous(memory_format=fmt)
        torch.testing.assert_close(gn, gt, rtol=1e-4, atol=1e-4)


def test_the_memory_format_check_can_fail():
    """torch's BatchNorm keeps channels_last; an output made contiguous would not."""
    x = torch.randn(4, C, 5, 6).to(memory_format=torch.channels_last)
    y = F.batch_norm(x, _RM, _RV, _W, _B, False)
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    assert core.output_format(axes.layout("batch", x.shape), x) == torch.channels_last
    assert core.output_format(axes.layout("instance", x.shape), x) == torch.contiguous_format
    assert core.output_format(axes.layout("batch", x.shape), x.contiguous()) == torch.contiguous_format


@pytest.mark.parametrize("shape, fmt", [((3, 8, 5, 6), torch.channels_last),
                                        ((2, 8, 3, 4, 5), torch.channels_last_3d)])
@pytest.mark.parametrize("G", [1, 4, 8])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_on_channels_last_equals_the_formula(shape, fmt, G, affine):
    """Without gradients, GN on a channels_last input runs on the (N, P, G, C/G) view of its
    memory (groups.group_norm_channels_last): the formula's output and statistics."""
    gen = torch.Generator().manual_seed(G)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 2).to(memory_format=fmt)
    w = torch.rand(shape[1], generator=gen, dtype=torch.float64) + 0.5 if affine else None
    b = torch.randn(shape[1], generator=gen, dtype=torch.float64) if affine else None
    lay = axes.layout("group", shape, G)
    got = groups.group_norm_channels_last(x, lay, 1e-5, w, b)
    ref = core.normalize_formula(x.contiguous(), lay, 1e-5, w, b)
    torch.testing.assert_close(got.output, ref.output)
    torch.testing.assert_close(got.mean, ref.mean)
    torch.testing.assert_close(got.var, ref.var)
    assert got.output.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(F.group_norm(x, G, w, b), got.output, rtol=0, atol=0)


@pytest.mark.parametrize("norm, shape, G", [("group", (2, 6, 3, 4), 3), ("group", (2, 4, 3, 2, 3), 2),
                                            ("group", (3, 4, 5, 2), 4), ("group", (4, 2, 3, 3), 1),
                                            ("instance", (2, 3, 4, 5), None),
                                            ("batch", (5, 3, 4, 2), None), ("batch", (2, 3, 2, 3, 4), None)])
@pytest.mark.parametrize("affine", ["both", "none"])
def test_group_path_on_channels_last_memory(small_blocks, loops_or_blocks, norm, shape, G, affine):
    """GN, IN and BN on a channels_last input run on the (N, P, G, C/G) view of its memory
    (BN: (1, N P, C, 1)), in blocks of positions (or, compiled, sample by sample and by
    chunks of positions): the formula's output and statistics, the boxed backward, and
    torch's memory formats."""
    gen = torch.Generator().manual_seed(len(shape) * 17 + (G or 0))
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    lay = axes.layout(norm, shape, G)
    x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 2).to(memory_format=fmt)
    x.requires_grad_(True)
    assert rows.applies(lay, x) and groups._groups(lay, x).pos == 1
    _fast_path_equals_the_reference(lay, x, affine, gen)
    y = grad.Normalize.apply(x, None, None, lay, 1e-5)[0]
    gx = torch.autograd.grad(y, x, torch.randn(shape, dtype=torch.float64).to(memory_format=fmt))[0]
    keeps = norm != "instance"              # torch: GN and BN keep channels_last, IN does not
    assert y.is_contiguous(memory_format=fmt) == gx.is_contiguous(memory_format=fmt) == keeps


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("norm, G", [("group", 2), ("instance", None), ("batch", None)])
def test_group_path_corrects_the_rounded_mean(small_blocks, loops_or_blocks, fmt, norm, G):
    """float32 at |mu| = 300 sigma: the rounding error delta of the mean is taken into the
    small factors of the forward and the backward; with dy along x_hat (so that the
    backward's slope is large) leaving it out moved dx by 100 roundings."""
    if norm == "batch" and fmt == torch.contiguous_format:
        pytest.skip("contiguous BN takes the plain path")
    gen = torch.Generator().manual_seed(9)
    shape = (2, 4, 8, 8)
    x = (300.0 + torch.randn(shape, generator=gen)).to(memory_format=fmt)
    lay = axes.layout(norm, shape, G)
    assert rows.applies(lay, x)
    st = core.standardize(x.double(), lay, 1e-5)
    dy = (st.xhat.reshape(shape) + 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64))
    w = torch.rand(4, generator=gen) + 0.5
    out = {}
    for dt in (torch.float32, torch.float64):
        xs = x.to(dt).requires_grad_(True)
        ws = w.to(dt).requires_grad_(True)
        y = grad.Normalize.apply(xs, ws, None, lay, 1e-5)[0]
        out[dt] = (y,) + torch.autograd.grad(y, (xs, ws), dy.to(dt))
    u = torch.finfo(torch.float32).eps / 2
    for name, a, e in zip(("y", "dx", "dgamma"), out[torch.float32], out[torch.float64]):
        err = (a.double() - e).abs().max() / e.abs().max()
        assert err <= 16 * u, (name, err.item() / u)


def _small_means(norm, shape, G, fmt, gen):
    """``(layout, x)``: a float64 input that requires grad, in ``fmt``, whose every set has
    mean 0.1 and a spread about 1 (the forward's one pass, the backward's folded mean)."""
    lay = axes.layout(norm, shape, G)
    xv = torch.randn(lay.view_shape, generator=gen, dtype=torch.float64)
    x = (xv - xv.mean(lay.reduce_dims, keepdim=True) + 0.1).reshape(shape)
    return lay, x.to(memory_format=fmt).requires_grad_(True)


@pytest.mark.parametrize("norm, shape, G", [("group", (3, 6, 5), 3), ("instance", (2, 3, 4, 5), None),
                                            ("group", (2, 4, 3, 5), 2)])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_group_path_with_small_means_folds_the_mean(small_blocks, monkeypatch, norm, shape, G, fmt):
    """Sets whose mean is at most half their spread: the forward's one pass and the
    backward's folded mean, against the formula and the boxed backward."""
    monkeypatch.setenv("NORMCORE_NUMBA", "0")           # the blocks' own steps
    if fmt == torch.channels_last and len(shape) != 4:
        pytest.skip("channels_last is 4-d")
    gen = torch.Generator().manual_seed(len(shape) * 19 + (G or 0))
    lay, x = _small_means(norm, shape, G, fmt, gen)
    seen = _record(monkeypatch, rows, "_one_pass")
    assert rows.applies(lay, x)
    _fast_path_equals_the_reference(lay, x, "both", gen)
    assert seen and all(seen)


@pytest.mark.parametrize("norm, shape, G, used", [
    ("group", (2, 4, 16, 16), 2, True),          # rows of 256 positions: chunks of 128
    ("instance", (2, 3, 8, 16), None, True),     # rows of 128, six chunks
    ("instance", (3, 3, 8, 16), None, False),    # nine chunks: no pairs, the product instead
    ("group", (2, 256, 2, 2), 2, False),         # rows of 4 positions
])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_group_backward_dot_products_by_chunks(monkeypatch, norm, shape, G, used, fmt):
    """Sets near 0, one block (the size at which the contiguous backward takes sum_P g x by
    ``bmm`` of pairs of chunks, groups._row_dots): against the formula and the boxed
    backward; taken where the rows cut into pairs of chunks, and never on ``channels_last``
    memory, whose view ends in channels, not positions (there (2, 256, 2, 2) has 128)."""
    monkeypatch.setenv("NORMCORE_NUMBA", "0")           # the blocks' own steps
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 64)
    gen = torch.Generator().manual_seed(sum(shape))
    lay, x = _small_means(norm, shape, G, fmt, gen)
    taken = _record(monkeypatch, groups, "_row_dots")
    assert rows.applies(lay, x)
    _fast_path_equals_the_reference(lay, x, "both", gen)
    contiguous = fmt == torch.contiguous_format
    assert any(t is not None for t in taken) == (used and contiguous)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("norm, G", [("group", 2), ("instance", None)])
def test_group_backward_takes_x_itself_in_the_sets_near_zero(small_blocks, monkeypatch, fmt, norm,
                                                             G):
    """Sets near 0 beside sets far from it (means 0 or 40 sigma): the backward
    subtracts 0 in the first (x itself) and mu0 in the others, and puts the rest of each
    mean into the small factors; against float64, every gradient within 4 roundings, and
    x - m is formed exactly where m = 0."""
    monkeypatch.setenv("NORMCORE_NUMBA", "0")           # the blocks' own steps
    gen = torch.Generator().manual_seed(12)
    shape = (2, 4, 8, 8)
    loc = {"group": torch.tensor([0.0, 0.05, 40.0, 40.0]),        # GN: a group of each
           "instance": torch.tensor([0.0, 40.0, 0.05, -40.0])}[norm].reshape(1, 4, 1, 1)
    x = (torch.randn(shape, generator=gen) + loc).to(memory_format=fmt)
    lay = axes.layout(norm, shape, G)
    assert rows.applies(lay, x)
    dy = torch.randn(shape, generator=gen, dtype=torch.float64)
    w, b = torch.rand(4, generator=gen) + 0.5, torch.randn(4, generator=gen)
    subtracted = []
    sub = torch.sub
    def spy(a, m, **kw):
        subtracted.append(m.detach().clone())
        return sub(a, m, **kw)
    out = {}
    for dt in (torch.float32, torch.float64):
        xs, ws, bs = (t.to(dt).requires_grad_(True) for t in (x, w, b))
        y = grad.Normalize.apply(xs, ws, bs, lay, 1e-5)[0]
        if dt == torch.float32:
            groups.torch.sub = spy
        try:
            out[dt] = torch.autograd.grad(y, (xs, ws, bs), dy.to(dt))
        finally:
            groups.torch.sub = sub
    u = torch.finfo(torch.float32).eps / 2
    for name, a, e in zip(("dx", "dgamma", "dbeta"), out[torch.float32], out[torch.float64]):
        err = (a.double() - e).abs().max() / e.abs().max()
        assert err <= 4 * u, (name, err.item() / u)
    m = subtracted[0]        # the per-set shift: 0 in the sets near 0, the mean in the others
    assert m.numel() > 1 and (m == 0).any() and (m.abs() > 30).any()


@pytest.mark.parametrize("norm, shape, G", [("group", (2, 4, 32, 32), 2), ("instance", (2, 3, 8, 8), None)])
@pytest.mark.parametrize("means", ["small", "mixed", "large"])
def test_contiguous_float32_groups_round_each_output_about_once(small_blocks, loops_or_blocks, norm,
                                                                shape, G, means):
    """groups._precise_groups (contiguous float32 GN and IN, sets of 2048 by chunks, of 64
    exactly): means within half the spread (one pass), from 0 to 4 sigma per channel (both
    forms of core.affine_terms in one tensor), and 300 sigma (x - mu0 rounded once): the
    output within 3 roundings of the largest, the variance within 2 of its largest, the mean
    within 2 of the largest mean of |x|: a float32 sum's rounding is relative to the sum of
    |x|, 8 times the mean at 0.1 sigma (there the mean is torch.mean's, bit for bit, 1.4
    roundings of the largest mean on AVX-512 and 2.7 under the generic kernels)."""
    gen = torch.Generator().manual_seed(31)
    loc = {"small": torch.full((shape[1],), 0.1), "mixed": torch.linspace(0.0, 4.0, shape[1]),
           "large": torch.full((shape[1],), 300.0)}[means].reshape(1, -1, 1, 1)
    x = (torch.randn(shape, generator=gen) + loc).contiguous()
    lay = axes.layout(norm, shape, G)
    assert rows.applies(lay, x)
    w = torch.rand(shape[1], generator=gen) + 0.5
    b = torch.randn(shape[1], generator=gen)
    got = grad.Normalize.apply(x, w, b, lay, 1e-5)[:3]
    ref = core.normalize_formula(x.double(), lay, 1e-5, w.double(), b.double())
    u = torch.finfo(torch.float32).eps / 2
    scale = {"y": ref.output.abs().max(), "var": ref.var.abs().max(),
             "mean": x.double().reshape(lay.view_shape).abs().mean(lay.reduce_dims).max()}
    for name, a, e, k in zip(("y", "mean", "var"), got, (ref.output, ref.mean, ref.var), (3, 2, 2)):
        err = (a.double() - e).abs().max() / scale[name]
        assert err <= k * u, (name, err.item() / u)


@pytest.mark.parametrize("norm", ["layer", "instance", "group"])
def test_the_float64_input_gradient_of_the_generic_kernels(small_blocks, monkeypatch, norm):
    """Without a fused multiply-add (the generic kernels) the float32 input gradient of LN's
    blocks and of GN and IN is computed in float64 and rounded once; here that branch runs on
    any CPU, against torch's gradient in float64."""
    monkeypatch.setattr(rows, "FUSED_MULTIPLY_ADD", False)
    monkeypatch.setattr(groups, "FUSED_MULTIPLY_ADD", False)
    monkeypatch.setenv("NORMCORE_NUMBA", "0")              # LN: the blocks, not the loops
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, 6, 64, generator=gen) * 2 + 0.5
    x[1, 2] += 30.0                                      # a set with a large mean
    w = torch.rand(6 if norm != "layer" else 64, generator=gen) + 0.5
    ours = {"layer": lambda x, w: F.layer_norm(x, (64,), w),
            "instance": lambda x, w: F.instance_norm(x, weight=w),
            "group": lambda x, w: F.group_norm(x, 3, w)}[norm]
    theirs = {"layer": lambda x, w: TF.layer_norm(x, (64,), w),
              "instance": lambda x, w: TF.instance_norm(x, weight=w),
              "group": lambda x, w: TF.group_norm(x, 3, w)}[norm]
    gy = torch.randn(x.shape, generator=gen)
    xs = x.clone().requires_grad_(True)
    seen = []
    mul = torch.Tensor.addcmul_
    monkeypatch.setattr(torch.Tensor, "addcmul_",
                        lambda self, *a, **k: seen.append(self.dtype) or mul(self, *a, **k))
    got = torch.autograd.grad(ours(xs, w), xs, gy)[0]
    monkeypatch.undo()
    assert torch.float64 in seen, "the float64 branch did not run"
    xd = x.double().requires_grad_(True)
    ref = torch.autograd.grad(theirs(xd, w.double()), xd, gy.double())[0]
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("norm", ["layer", "group"])
def test_without_a_gradient_to_record_the_fast_path_runs_without_the_function(small_blocks,
                                                                              monkeypatch, norm):
    """Under no_grad (or with no input requiring grad) the fast path is called directly: the
    autograd Function would only add its own overhead (about 25 us a call)."""
    import normcore.functional as functional
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, 6, 64, generator=gen)
    w = torch.rand(64 if norm == "layer" else 6, generator=gen) + 0.5
    op = (lambda x: F.layer_norm(x, (64,), w)) if norm == "layer" else (
        lambda x: F.group_norm(x, 3, w))
    want = op(x.clone().requires_grad_(True)).detach()          # through the Function

    def refuse(*args):
        raise AssertionError("Normalize.apply ran with no gradient to record")
    monkeypatch.setattr(functional.Normalize, "apply", refuse)
    with torch.no_grad():
        assert torch.equal(op(x), want)
    assert torch.equal(op(x), want)
