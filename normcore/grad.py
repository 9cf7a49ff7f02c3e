r"""Hand-derived backward passes: BatchNorm, LayerNorm, InstanceNorm, GroupNorm and Weight
Standardization as ``torch.autograd.Function``.

Autograd can differentiate :func:`normcore.core.normalize_formula` by itself, through half a
dozen small ops, each storing its own intermediate.  Here the chain rule is done once by hand
and simplified, which gives a backward pass of two reductions and one expression for
:math:`\partial L/\partial x` (two fused multiply-adds).  The derivation is the same for all
four norms, because they differ only in the set :math:`S_i` of elements that share
statistics (:mod:`normcore.axes`).

Forward: the computational graph
--------------------------------
For one set :math:`S` of :math:`n = |S|` elements (``lay.set_size``):

.. math::

    \begin{aligned}
    &(1)\quad \mu = \frac1n \sum_{k\in S} x_k
    &&(2)\quad \sigma^2 = \frac1n \sum_{k\in S} (x_k-\mu)^2 \\
    &(3)\quad r = \frac{1}{\sqrt{\sigma^2+\epsilon}}
    &&(4)\quad \hat x_i = (x_i-\mu)\, r \\
    &(5)\quad y_i = \gamma_i\, \hat x_i + \beta_i
    \end{aligned}

Backward: walk the graph from (5) to (1)
----------------------------------------
Write :math:`g_i = \partial L/\partial y_i` (the incoming gradient).

(5) :math:`\gamma` and :math:`\beta` are shared by every element they multiply, so their
gradients sum over all of those elements (over the leading dims for LN, over the batch and
the positions for BN, IN and GN), and the gradient reaching :math:`\hat x` is scaled by
:math:`\gamma`:

.. math::

    \frac{\partial L}{\partial \beta} = \sum g_i, \qquad
    \frac{\partial L}{\partial \gamma} = \sum g_i\,\hat x_i, \qquad
    d_i := \frac{\partial L}{\partial \hat x_i} = \gamma_i\, g_i .

(4) :math:`x_i` reaches :math:`\hat x_i` directly (factor :math:`r`), and through
:math:`\mu` and :math:`r`, which every :math:`\hat x_k` of the set uses:

.. math::

    \frac{\partial L}{\partial r} = \sum_{k} d_k (x_k-\mu), \qquad
    \frac{\partial L}{\partial \mu}\Big|_{(4)} = -r \sum_k d_k .

(3) :math:`dr/d\sigma^2 = -\tfrac12 (\sigma^2+\epsilon)^{-3/2} = -\tfrac12 r^3`, so

.. math::

    \frac{\partial L}{\partial \sigma^2} = -\frac{r^3}{2} \sum_k d_k (x_k-\mu)
    = -\frac{r^2}{2} \sum_k d_k \hat x_k .

(2) :math:`\partial\sigma^2/\partial x_i = 2(x_i-\mu)/n`; and :math:`\sigma^2` depends on
:math:`\mu` only through :math:`\sum_k (x_k-\mu) = 0`, so that path vanishes.

(1) :math:`\partial\mu/\partial x_i = 1/n`.

Adding the three paths into :math:`x_i`:

.. math::

    \frac{\partial L}{\partial x_i}
    = r\, d_i \;-\; \frac rn \sum_k d_k \;-\; \frac{r^2}{2}\sum_k d_k\hat x_k\cdot
      \frac{2(x_i-\mu)}{n}

and since :math:`(x_i-\mu)\,r = \hat x_i`, the simplified gradient is

.. math::

    \boxed{\;\frac{\partial L}{\partial x_i}
    = \frac{r}{n}\Big(n\, d_i - \sum_{k\in S} d_k - \hat x_i \sum_{k\in S} d_k\,\hat x_k\Big)\;}

It needs only :math:`\hat x` and :math:`r` from the forward pass, and two sums per set.
It says: the gradient of a normalized layer is the incoming gradient with its mean and its
component along :math:`\hat x` projected out (then scaled by :math:`r`), because shifting
all of a set's inputs, or scaling them about their mean, does not change :math:`\hat x`
(up to :math:`\epsilon`).

Where gamma lives: the view
---------------------------
The sums over :math:`S` and the sums for :math:`\gamma, \beta` are over different dims.
:func:`normcore.axes.layout` gives a view of the input (``lay.view_shape``) in which
:math:`S` is the set of dims ``lay.reduce_dims``, and gamma, reshaped to
``lay.affine_view_shape``, broadcasts against it.  Call a dim *gamma-constant* when gamma has
size 1 there.  Then :math:`\partial L/\partial\gamma` sums over the gamma-constant dims, and
the set sums split in two:

* over the reduced dims where gamma is constant (BN: batch and positions; IN, GN: positions),
  :math:`\gamma` factors out, so we reduce :math:`g` and :math:`g\hat x` there, once (these two
  reductions are the only passes over the whole tensor for BN, IN and GN);
* what is left is small (per channel, or per sample and channel): GN then sums
  :math:`\gamma_c\,\cdot` those partial sums over the channels of a group; LN (where every
  reduced dim is a gamma dim) sums :math:`\gamma g` and :math:`\gamma g \hat x` over the
  normalized dims.

The same partial sums, reduced over the remaining gamma-constant dims, are
:math:`\partial L/\partial\beta` and :math:`\partial L/\partial\gamma`.

Weight Standardization
----------------------
WS standardizes each output channel of a weight over its :math:`n = C_{in}\cdot k_h k_w`
entries, with no :math:`\gamma, \beta`, in one of three conventions
(:data:`normcore.functional.WS_CONVENTIONS`): the variance may be unbiased,
:math:`\sigma^2 = \frac{1}{n-c}\sum (w_k-\mu)^2` with :math:`c = 1`, and :math:`\epsilon` may
sit outside the square root, :math:`r = 1/(\sigma+\epsilon)`.  Redo steps (2) and (3):

* with correction :math:`c`, step (2) becomes :math:`\partial\sigma^2/\partial w_i =
  2(w_i-\mu)/(n-c)`: only the last term changes, :math:`\hat w_i \sum d\hat w` is divided by
  :math:`n-c` instead of :math:`n`;
* with :math:`\epsilon` outside, :math:`\partial L/\partial\sigma = -r^2 \sum_k d_k (w_k-\mu)
  = -r \sum_k d_k \hat w_k` and :math:`d\sigma/d\sigma^2 = 1/(2\sigma)`, so
  :math:`\partial L/\partial\sigma^2 = -\frac{r}{2\sigma}\sum_k d_k\hat w_k`; where the
  inside version had :math:`-\frac{r^2}{2}\sum_k d_k\hat w_k`, the last term gains the factor
  :math:`\rho = \frac{1/\sigma}{r} = \frac{\sigma+\epsilon}{\sigma}`.

Together:

.. math::

    \boxed{\;\frac{\partial L}{\partial w_i}
    = r\Big(d_i - \frac1n\sum_k d_k - \hat w_i\,\frac{\rho}{n-c}\sum_k d_k\,\hat w_k\Big),
    \qquad \rho = \begin{cases} 1 & \epsilon \text{ inside } \sqrt{\cdot}\\
    (\sigma+\epsilon)/\sigma & \epsilon \text{ outside}\end{cases}\;}

For the original WS code (:math:`c = 1`, :math:`\epsilon` outside) and in terms of
:math:`w-\mu = \hat w\,(\sigma+\epsilon)` this reads

.. math::

    \frac{\partial L}{\partial w} = \frac{1}{\sigma+\epsilon}\Big(d - \overline{d}
    - (w-\mu)\,\frac{\sum_k d_k (w_k-\mu)}{(n-1)\,\sigma\,(\sigma+\epsilon)}\Big).

At :math:`\sigma = 0` (a constant filter) the square root is not differentiable; then
:math:`\hat w = 0` and the last term is taken as 0, as ``torch.std``'s backward does.

RMSNorm
-------
RMSNorm does not center: :math:`\mu = 0` and :math:`\sigma^2 = \frac1n\sum_k x_k^2`.  Then
:math:`\mu` has no path to :math:`x` and step (2) reads :math:`\partial\sigma^2/\partial x_i
= 2x_i/n`, so the middle term of the boxed formula drops out:

.. math::

    \frac{\partial L}{\partial x_i} = \frac{r}{n}\Big(n\, d_i
      - \hat x_i \sum_{k\in S} d_k\,\hat x_k\Big).

:func:`boxed_backward` is the boxed formula written once, for every set, centered or not:
the reference backward of :class:`Normalize`, and what the tests hold the compiled kernels
(:mod:`normcore.kernels`) to.

Precision
---------
float16 / bfloat16 inputs are computed in float32, and the results (outputs and gradients)
are cast back to the dtypes of the tensors they belong to, as in :mod:`normcore.core`.  The
set sums are taken in float64 for float32 (:func:`normcore.core.set_sum`), and the per-set
factors rounded once.  What the backward keeps (:math:`\hat x`; the kernels: the mean and r
of each set) forgets how it depends on :math:`x`, so with ``create_graph=True`` or under
``torch.func`` (``vmap``, ``grad``, ``jacrev``: torch.func's form, ``setup_context`` and
``generate_vmap_rule``) both Functions recompute :math:`\hat x` from the saved input, with
its graph, and take the same formula on it: differentiable again.
"""
from __future__ import annotations

import torch

from . import dispatch, kernels
from .axes import Layout, layout
from .core import PositionalApply, affine, compute_dtype, output_format, set_sum, standardize

# The ops that run these Functions are those of normcore.functional (``backward="derived"``,
# their default): one op per name.
__all__ = ["Normalize", "WeightStandardize", "boxed_backward", "ws_grad_input"]


def _set_mean(t: torch.Tensor, dims: tuple[int, ...], n) -> torch.Tensor:
    """The mean of ``t`` over each set, summed in float64 for float32 and rounded once."""
    return (set_sum(t, dims) / n).to(t.dtype)


def boxed_backward(grad_y: torch.Tensor, xhat: torch.Tensor, inv_std: torch.Tensor,
                   weight, lay: Layout, needs=(True, True, True)):
    r"""``(dL/dx, dL/dgamma, dL/dbeta)`` by the boxed formula, written once for every set
    (None where ``needs`` says so):

    .. math::

        \frac{\partial L}{\partial x_i} = r\Big(d_i
        - [\text{centered}]\,\overline{d} - \hat x_i\,\overline{d\,\hat x}\Big),
        \qquad d = \gamma\, g, \quad \overline{\,\cdot\,} = \frac1n\sum_{k\in S}.

    ``xhat`` and ``inv_std`` are in the view; out of place, so differentiable again when
    ``xhat`` carries its graph."""
    g = grad_y.to(xhat.dtype, memory_format=torch.contiguous_format)              # g = dL/dy
    g = g.reshape(lay.view_shape)
    n, dims = lay.set_size, lay.reduce_dims
    dx = dgamma = dbeta = None
    if needs[0]:
        d = g if weight is None else g * weight.to(xhat.dtype).reshape(lay.affine_view_shape)
        dx = d - xhat * _set_mean(d * xhat, dims, n)                           # d - x_hat mean(d x_hat)
        if lay.centered:
            dx = dx - _set_mean(d, dims, n)                                    #   - mean(d)
        dx = (dx * inv_std).reshape(lay.shape)                                  # times r
    # gamma and beta are shared along the dims where they have size 1
    shared = tuple(k for k, s in enumerate(lay.affine_view_shape) if s == 1)
    if needs[1] and weight is not None:
        dgamma = set_sum(g * xhat, shared).reshape(lay.affine_shape)
    if needs[2]:
        dbeta = set_sum(g, shared).reshape(lay.affine_shape)
    return dx, dgamma, dbeta


def _recording_graph() -> bool:
    """A second derivative is coming (``create_graph``), or torch.func, which differentiates
    the backward itself: the backward must be built from x, out of place."""
    return torch.is_grad_enabled() or torch._C._are_functorch_transforms_active()


class Normalize(PositionalApply, torch.autograd.Function):
    r"""``y = gamma * (x - mu) / sqrt(var + eps) + beta`` over the sets of ``lay`` (BN in
    training, LN, IN, GN, RMSNorm), with the hand-derived backward (module docstring).

    ``Normalize.apply(x, weight, bias, lay, eps)`` returns ``(y, mean, var, kept, r)``; only
    ``y`` is differentiable: ``mean`` and ``var`` (biased, in the view's keepdim shape) are
    there for running statistics, ``kept`` and ``r`` for the backward.  Which code computes
    it is :func:`normcore.dispatch.family`'s choice: the reference (:mod:`normcore.core`,
    :func:`boxed_backward`; ``kept`` is :math:`\hat x`) or the compiled kernels
    (:mod:`normcore.kernels`; ``kept`` is each set's mean in float64, and x is read again).
    """

    generate_vmap_rule = True   # torch.func.vmap batches forward and backward as they are

    @staticmethod
    def forward(x, weight, bias, lay: Layout, eps: float):
        family = dispatch.family(lay, x)
        if family is not None:
            return kernels.forward(family, x, weight, bias, lay, eps)
        st = standardize(x, lay, eps)                                           # (1)-(4)
        y = affine(st.xhat, lay, weight, bias).reshape(lay.shape)               # (5)
        # a fresh tensor in torch's memory format, neither x_hat (which is saved) nor a view
        # (the caller may modify the output in place: ReLU(inplace=True))
        y = y.to(x.dtype, memory_format=output_format(lay, x), copy=y.dtype == x.dtype)
        cdt = compute_dtype(x.dtype)
        return y, st.mean.to(cdt), st.var.to(cdt), st.xhat, st.inv_std

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, lay, eps = inputs
        _, mean, var, kept, inv_std = output
        ctx.save_for_backward(x, weight, kept, inv_std)
        ctx.family = dispatch.family(lay, x)
        ctx.lay, ctx.eps = lay, eps
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(mean, var, kept, inv_std)
        ctx.set_materialize_grads(False)     # no zero gradients for the other outputs

    @staticmethod
    def backward(ctx, grad_y, *_):
        if grad_y is None:                   # y was not used (only mean / var)
            return None, None, None, None, None
        x, weight, kept, inv_std = ctx.saved_tensors
        lay: Layout = ctx.lay
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.bias_dtype is not None
        if _recording_graph() or ctx.family is None:
            if _recording_graph():           # x_hat again, from x and its graph
                st = standardize(x, lay, ctx.eps)
                kept, inv_std = st.xhat, st.inv_std
            dx, dw, db = boxed_backward(grad_y, kept, inv_std, weight, lay,
                                        (need_x, need_w, need_b))
        else:
            dx, dw, db = kernels.backward(ctx.family, grad_y, x, weight, kept, inv_std, lay)
        return (dx.to(x.dtype, memory_format=output_format(lay, x)) if need_x else None,
                dw.to(weight.dtype) if need_w and weight is not None else None,
                db.to(ctx.bias_dtype) if need_b else None, None, None)


# ---------------------------------------------------------------------------------------
# Weight Standardization
# ---------------------------------------------------------------------------------------
def _ws_terms(weight: torch.Tensor, eps: float, correction: int, eps_mode: str):
    r"""``(w_hat, r, m)`` in the reference's dtype (float64 for a float32 weight): the output,
    r, and the divisor :math:`m = (n - c)/\rho` of the gradient's last term; at
    :math:`\sigma = 0` with :math:`\epsilon` outside, :math:`m = \infty` (:math:`\hat w = 0`
    there, and ``torch.std``'s backward drops the term too).  Out of place: differentiable
    when ``weight`` carries its graph."""
    lay = layout("layer", weight.shape)                 # S = one output channel's weights
    st = standardize(weight, lay, eps, correction, eps_mode)
    n_c = lay.set_size - correction
    if eps_mode == "inside":
        m = torch.full_like(st.var, float(n_c))                              # rho = 1
    else:
        std = st.var.sqrt()                                                  # rho = (s + e) / s
        m = torch.where(std > 0, n_c * std / (std + eps), torch.full_like(std, float("inf")))
    return st.xhat, st.inv_std, m


class WeightStandardize(PositionalApply, torch.autograd.Function):
    r"""``w_hat = (w - mu) / sqrt(var + eps)`` or ``(w - mu) / (std + eps)`` per output
    channel, with variance correction ``c``, and the hand-derived backward

    .. math::

        \frac{\partial L}{\partial w} = r\Big(d - \overline{d}
        - \hat w\,\frac{\rho}{n-c}\sum d\,\hat w\Big),\qquad
        \rho = 1 \text{ (inside)},\quad \rho = \frac{\sigma+\epsilon}{\sigma} \text{ (outside)}.

    ``WeightStandardize.apply(weight, eps, correction, eps_mode)`` returns ``(w_hat, kept,
    inv_std, m)``: the output, and what the backward keeps (non-differentiable).  With
    ``create_graph=True`` the backward recomputes them from the weight: a MAML-style second
    derivative goes through it.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(weight, eps: float, correction: int, eps_mode: str):
        w_hat, r, m = _ws_terms(weight, eps, correction, eps_mode)
        # a copy: the output must be neither w_hat (saved) nor a view of it
        return w_hat.reshape(weight.shape).to(weight.dtype, copy=True), w_hat, r, m

    @staticmethod
    def setup_context(ctx, inputs, output):
        weight, eps, correction, eps_mode = inputs
        ctx.save_for_backward(weight, *output[1:])
        ctx.mark_non_differentiable(*output[1:])
        ctx.args = (eps, correction, eps_mode)

    @staticmethod
    def backward(ctx, grad_what, *_):
        weight, w_hat, r, m = ctx.saved_tensors
        if _recording_graph():
            w_hat, r, m = _ws_terms(weight, *ctx.args)
        lay = layout("layer", weight.shape)
        d = grad_what.to(w_hat.dtype, memory_format=torch.contiguous_format).reshape(
            lay.view_shape)                                       # d = dL/dw_hat (no gamma)
        grad = ws_grad_input(d, w_hat, r, m, lay)
        return grad.reshape(weight.shape).to(weight.dtype), None, None, None


def ws_grad_input(d, w_hat, r, m, lay: Layout) -> torch.Tensor:
    r"""The boxed formula of Weight Standardization, :math:`r\,(d - \overline{d} - \hat w
    \sum d\hat w / m)`, on the view; out of place (differentiable again)."""
    n, dims = lay.set_size, lay.reduce_dims
    return r * (d - set_sum(d, dims) / n - w_hat * (set_sum(d * w_hat, dims) / m))
