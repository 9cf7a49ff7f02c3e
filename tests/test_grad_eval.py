"""normcore.grad_eval: BN and IN with given statistics (eval mode) in float32, their factors
rounded once, against the formula's steps differentiated by autograd (``backward="autograd"``),
torch, and the cases that keep the formula."""
import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F
from normcore import axes, grad_eval

G = torch.Generator().manual_seed(5)
X = torch.randn(6, 8, 5, 7, generator=G) * 2 + 1
W, B = torch.rand(8, generator=G) + 0.5, torch.randn(8, generator=G)
RM = torch.cat([torch.linspace(-1, 1, 7), torch.tensor([40.0])])   # one channel far from 0
RV = torch.linspace(0.5, 2, 8)


def _grads(backward, norm="batch", affine=True, create_graph=False):
    x = X.clone().requires_grad_(True)
    w, b = (W.clone().requires_grad_(True), B.clone().requires_grad_(True)) if affine \
        else (None, None)
    if norm == "batch":
        y = F.batch_norm(x, RM, RV, w, b, training=False, backward=backward)
    else:
        y = F.instance_norm(x, RM, RV, w, b, use_input_stats=False, backward=backward)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    live = [t for t in (x, w, b) if t is not None]
    return y, torch.autograd.grad(y, live, dy, create_graph=create_graph)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("norm", ["batch", "instance"])
def test_eval_matches_the_formula_and_torch(norm, affine):
    y, grads = _grads("derived", norm, affine)
    y_ref, grads_ref = _grads("autograd", norm, affine)
    assert y.is_contiguous() and y.shape == X.shape
    torch.testing.assert_close(y, y_ref, rtol=0, atol=4e-6 * y_ref.abs().max().item())
    for a, e in zip(grads, grads_ref):
        torch.testing.assert_close(a, e, rtol=0, atol=4e-6 * e.abs().max().item())
    if norm == "batch":
        ref = TF.batch_norm(X, RM, RV, W if affine else None, B if affine else None)
        torch.testing.assert_close(y, ref, rtol=0, atol=4e-6 * ref.abs().max().item())


def test_eval_is_taken_and_without_gradients_too():
    lay = axes.layout("batch", X.shape)
    assert grad_eval.applies(X, lay, RM.reshape(lay.affine_view_shape),
                             RV.reshape(lay.affine_view_shape), 0, "inside")
    with torch.no_grad():
        y = F.batch_norm(X, RM, RV, W, B)
    assert torch.equal(y, grad_eval.eval_affine(X, lay, RM, RV, 1e-5, W, B))
    # every channel but the one at mean 40 (28 sigma, normalized from x - mu) from x itself
    lay_terms = grad_eval.affine_terms(RM.reshape(lay.affine_view_shape), torch.zeros(
        lay.affine_view_shape), RV.reshape(lay.affine_view_shape), 1e-5, lay.affine_view_shape,
        W, B)
    assert lay_terms[1].flatten().nonzero().flatten().tolist() == [7]
    exact = TF.batch_norm(X.double(), RM.double(), RV.double(), W.double(), B.double())
    assert (y[:, 7].double() - exact[:, 7]).abs().max() <= 2 * 2.0 ** -24 * exact.abs().max()


def test_eval_double_backward_matches_autograd():
    x = X.clone().requires_grad_(True)
    outs = []
    for backward in ("derived", "autograd"):
        w = W.clone().requires_grad_(True)
        y = F.batch_norm(x, RM, RV, w, B, training=False, backward=backward)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        outs.append(torch.autograd.grad(gx.sum(), w)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["float64", "channels_last", "stats_with_grad", "train"])
def test_other_cases_keep_the_formula(case):
    lay = axes.layout("batch", X.shape)
    m, v = RM.reshape(lay.affine_view_shape), RV.reshape(lay.affine_view_shape)
    x = X
    if case == "float64":
        x, m, v = X.double(), m.double(), v.double()
    elif case == "channels_last":
        x = X.contiguous(memory_format=torch.channels_last)
    elif case == "stats_with_grad":
        m = m.clone().requires_grad_(True)
    assert not grad_eval.applies(x, lay, m, v, 0, "inside") or case == "train"
    if case == "train":
        assert not grad_eval.applies(x, axes.layout("layer", X.shape), m, v, 0, "inside")
