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
the readable reference that the tests hold the fast paths of :class:`Normalize` to.

Precision
---------
float16 / bfloat16 inputs are computed in float32, and the results (outputs and gradients)
are cast back to the dtypes of the tensors they belong to, as in
:mod:`normcore.core`.  What the backward keeps (:math:`\hat x`, or :math:`x-\mu` where
gamma folds into a small per-set scale) is in that float32 compute dtype.  It forgets how
it depends on :math:`x`, so with ``create_graph=True`` or under ``torch.func`` (``vmap``,
``grad``, ``jacrev``: torch.func's form, ``setup_context`` and ``generate_vmap_rule``)
``Normalize`` takes :func:`boxed_backward` on :math:`\hat x` recomputed from the saved
input, out of place: differentiable again.  ``WeightStandardize`` refuses a second one.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import groups, rows
from .axes import Layout, layout
from .core import (FUSED_MULTIPLY_ADD, PositionalApply, affine_out_of_place, affine_terms,
                   apply_affine, apply_affine_terms, compute_dtype, inverse_std, moment_parts,
                   moments, output_format, scale_is_small, standardize, writes_in_place,
                   ws_grad_input)
from .passes import sum_keep, sum_of_products

# The ops that run these Functions are those of normcore.functional (``backward="derived"``,
# their default): one op per name.
__all__ = ["Normalize", "WeightStandardize", "boxed_backward"]


# ---------------------------------------------------------------------------------------
# the reference: the boxed formula, one path for every set
# ---------------------------------------------------------------------------------------
def boxed_backward(grad_y: torch.Tensor, xhat: torch.Tensor, inv_std: torch.Tensor,
                   weight, lay: Layout):
    r"""``(dL/dx, dL/dgamma, dL/dbeta)`` by the boxed formula, written once for every set:

    .. math::

        \frac{\partial L}{\partial x_i} = \frac{r}{n}\Big(n\, d_i
        - [\text{centered}]\sum_{k\in S} d_k - \hat x_i \sum_{k\in S} d_k\,\hat x_k\Big),
        \qquad d = \gamma\, g .

    Readable and slow (every product is formed); :class:`Normalize` computes the same with
    fewer passes, and the tests hold it to this.  ``xhat`` and ``inv_std`` are in the view.
    """
    g = grad_y.reshape(lay.view_shape).to(xhat.dtype)                        # g = dL/dy
    w = 1.0 if weight is None else weight.to(xhat.dtype).reshape(lay.affine_view_shape)
    n, dims = lay.set_size, lay.reduce_dims
    d = g * w                                                                  # dL/dx_hat
    sum_d = d.sum(dims, keepdim=True) if lay.centered else 0.0
    dx = inv_std / n * (n * d - sum_d - xhat * (d * xhat).sum(dims, keepdim=True))
    # gamma and beta are shared along the dims where they have size 1
    shared = tuple(k for k, s in enumerate(lay.affine_view_shape) if s == 1)
    dgamma = (g * xhat).sum(shared).reshape(lay.affine_shape)
    dbeta = g.sum(shared).reshape(lay.affine_shape)
    return dx.reshape(lay.shape), dgamma, dbeta


# ---------------------------------------------------------------------------------------
# the fast path: the same formula in two reductions and one fused pass
# ---------------------------------------------------------------------------------------
def _grad_input(g: torch.Tensor, xhat: torch.Tensor, g_scale: torch.Tensor,
                scale: torch.Tensor, sum_d, sum_dxhat: torch.Tensor,
                n: int, m, shape, out: torch.Tensor | None = None) -> torch.Tensor:
    r"""The boxed formula, as two fused multiply-adds over the full tensor:

    .. math::

        \frac{\partial L}{\partial x} = r\,\Big(d - \frac{\sum_S d}{n}
        - \hat x\,\frac{\sum_S d\hat x}{m}\Big)
        = \underbrace{g \cdot (\gamma r)}_{r\,d}
        \;+\; \hat x\cdot\Big(-\frac{r\sum_S d\hat x}{m}\Big)
        \;+\; \Big(-\frac{r\sum_S d}{n}\Big)

    ``g_scale`` is what multiplies the incoming gradient :math:`g` (:math:`\gamma r`, or
    :math:`r` without gamma), ``scale`` multiplies the set sums (:math:`r`, or
    :math:`\gamma r` when gamma is constant on the set and the sums are of :math:`g`
    rather than :math:`d = \gamma g`).  ``m`` is :math:`n` for the biased variance, or
    :math:`(n - c)/\rho` for Weight Standardization.  ``sum_d`` is ``None`` for an
    uncentered layout (RMSNorm: no mean term).  Everything but ``g`` and ``xhat`` is small.

    The result is written through the view into a fresh tensor of the input's ``shape``
    (or ``out``): autograd would copy a gradient that is a view before storing it.
    """
    slope = sum_dxhat * scale / (-m)                     # -r * sum_S(d x_hat) / m
    if not writes_in_place():                            # torch.func: out of place
        dx = g * g_scale + xhat * slope
        return (dx if sum_d is None else dx + sum_d * scale * (-1.0 / n)).reshape(shape)
    if out is None:  # else: a temporary of the input's shape, overwritten (may be g itself)
        out = torch.empty(shape, dtype=g.dtype, device=g.device)
    view = out.view(g.shape)
    torch.mul(g, g_scale, out=view)                      # r d
    if sum_d is not None:
        view.add_(sum_d * scale * (-1.0 / n))            #     - r mean_S(d)
    view.addcmul_(xhat, slope)                           #     - r x_hat sum_S(d x_hat) / m
    return out


class Normalize(PositionalApply, torch.autograd.Function):
    r"""``y = gamma * (x - mu) / sqrt(var + eps) + beta`` over the sets of ``lay`` (BN in
    training, LN, IN, GN, RMSNorm), with the hand-derived backward (module docstring).

    ``Normalize.apply(x, weight, bias, lay, eps)`` returns ``(y, mean, var, kept, inv_std)``;
    only ``y`` is differentiable: ``mean`` and ``var`` (biased, in the view's keepdim shape)
    are there for running statistics, ``kept`` and ``inv_std`` for the backward.

    What the backward keeps: :math:`x-\mu` for BN, IN and GN, whose gamma is constant along
    part of each set (:func:`~normcore.core.scale_is_small`: :math:`\hat x` is never formed);
    :math:`\hat x` for LN and RMSNorm, whose gamma multiplies it element by element; on
    large inputs nothing full-size (:mod:`normcore.rows` recomputes from x what it needs).
    """

    generate_vmap_rule = True   # torch.func.vmap batches forward and backward as they are

    @staticmethod
    def forward(x, weight, bias, lay: Layout, eps: float):
        if rows.applies(lay, x):            # large LN, RMSNorm, GN, IN: normcore.rows
            return groups.forward_function(x, weight, bias, lay, eps)  # keeps no x - mu
        xv = x.reshape(lay.view_shape).to(compute_dtype(x.dtype))
        rounded, delta, var, centered = moment_parts(xv, lay)                 # (1)-(2)
        mean = rounded if delta is None else rounded + delta
        inv_std = inverse_std(var, eps)                                        # (3)
        fmt = output_format(lay, x)                    # torch's memory format
        if not writes_in_place():                      # torch.func: out of place
            xhat = centered * inv_std                                          # (4)
            y = affine_out_of_place(xhat, lay, weight, bias).reshape(lay.shape)  # (5)
            # a fresh tensor, not a view: the caller may modify it in place (ReLU(inplace))
            y = y.to(x.dtype).clone(memory_format=fmt)
            return y, mean, var, centered if scale_is_small(lay) else xhat, inv_std
        # The output: fresh (a view could not be modified in place), in torch's memory format
        y = torch.empty_like(x, dtype=xv.dtype, memory_format=fmt)
        yv = y.view(lay.view_shape)
        if scale_is_small(lay):
            # (4)-(5), rounded as few times as can be (float32, contiguous: a channels_last
            # input keeps the single form, whose two passes are faster on its strides)
            if xv.dtype == torch.float32 and x.is_contiguous():
                terms = affine_terms(rounded, delta, var, eps, lay.affine_view_shape, weight, bias)
                apply_affine_terms(xv, centered, terms, out=yv)
            else:                                      # float64: nothing to gain
                apply_affine(centered, inv_std, lay, weight, bias, out=yv)     # (4)-(5)
            kept = centered                                                    # x - mu
        else:
            kept = torch.mul(centered, inv_std, out=None if centered is xv else centered)  # (4)
            apply_affine(kept, None, lay, weight, bias, out=yv)                # (5), kept x_hat
        return y.to(x.dtype), mean, var, kept, inv_std

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, lay, eps = inputs
        _, mean, var, kept, inv_std = output
        by_rows = rows.applies(lay, x)       # normcore.rows: `kept` is small (rows._shifts)
        ctx.save_for_backward(kept, inv_std, weight, x, bias, var)
        ctx.kept_is_xhat = None if by_rows else not scale_is_small(lay)
        ctx.lay, ctx.eps = lay, eps
        ctx.bias_dtype, ctx.x_dtype = None if bias is None else bias.dtype, x.dtype
        ctx.mark_non_differentiable(mean, var, kept, inv_std)
        ctx.set_materialize_grads(False)     # no zero gradients for the other outputs

    @staticmethod
    def backward(ctx, grad_y, *_):
        if grad_y is None:                   # y was not used (only mean / var)
            return None, None, None, None, None
        kept, inv_std, weight, x, bias, var = ctx.saved_tensors
        if torch.is_grad_enabled() or not writes_in_place():
            # a second derivative is coming, or torch.func (which always builds a graph)
            return _differentiable_backward(ctx, grad_y, x, weight)
        if ctx.kept_is_xhat is None:          # normcore.rows: `kept` is (mu0, delta)
            return groups.backward_function(ctx, grad_y, kept, inv_std, weight, x)
        lay: Layout = ctx.lay
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_w, need_b = need_w and weight is not None, need_b and bias is not None
        ndim, fmt = len(lay.view_shape), output_format(lay, x)   # fmt: torch's memory format
        g = grad_y.reshape(lay.view_shape).to(kept.dtype)            # g = dL/dy
        w = None if weight is None else weight.to(kept.dtype).reshape(lay.affine_view_shape)
        # x_hat = kept * per_kept: (x - mu) * r (BN, IN, GN), or x_hat itself (LN, RMSNorm)
        per_kept = None if ctx.kept_is_xhat else inv_std
        # the view dims along which gamma and beta do not vary (size 1 in affine_view_shape)
        const = tuple(k for k in range(ndim) if lay.affine_view_shape[k] == 1)
        inner = tuple(k for k in lay.reduce_dims if k in const)      # in S, gamma constant
        outer = tuple(k for k in lay.reduce_dims if k not in const)  # in S, gamma varies
        param = tuple(k for k in const if k not in inner)            # outside S, gamma constant

        if not outer and per_kept is not None and g.dtype == torch.float32:  # BN, IN
            out = torch.empty_like(x, dtype=g.dtype, memory_format=fmt)
            dx, dw, db = _float32_backward(lay, g, kept, var, ctx.eps, weight, inner, param,
                                           (need_x, need_w, need_b), out)
            return (dx if dx is None else dx.to(ctx.x_dtype, memory_format=fmt),
                    dw if dw is None else dw.to(weight.dtype),
                    db if db is None else db.to(ctx.bias_dtype), None, None)

        # The only two passes over the whole tensor: sum g and g x_hat over `inner`
        # (BN: per channel; IN, GN: per sample and channel; LN: nothing to sum, yet).
        sum_g = sum_keep(g, inner) if ((need_x and inner and lay.centered) or need_b) else None
        sum_gxhat = out = None
        if (need_x and inner) or need_w:
            if per_kept is None:
                # for LN (no inner dims) this is the full-size g * x_hat: kept to reuse below
                sum_gxhat = sum_of_products(g, kept, inner)
            else:
                # r is constant on S: sum g x_hat = r sum g (x - mu).  The product goes into
                # the tensor that dx is then written over: one full-size tensor per pass
                out = torch.empty_like(x, dtype=g.dtype, memory_format=fmt)
                sum_gxhat = sum_of_products(g, kept, inner, out=out.view(g.shape)) * per_kept

        grad_x = grad_w = grad_b = None
        if need_b:                                    # dL/dbeta  = sum of g      (5)
            grad_b = sum_keep(sum_g, param).reshape(lay.affine_shape).to(ctx.bias_dtype)
        if need_w:                                    # dL/dgamma = sum of g x_hat (5)
            grad_w = sum_keep(sum_gxhat, param).reshape(lay.affine_shape).to(weight.dtype)
        if need_x:
            grad_x = _input_gradient(lay, g, kept, per_kept, inv_std, w, sum_g, sum_gxhat, inner,
                                     outer, param, need_w, out).to(ctx.x_dtype, memory_format=fmt)
        return grad_x, grad_w, grad_b, None, None


def _float32_backward(lay: Layout, g, kept, var, eps: float, weight, inner, param, needs, out):
    r"""``(dx, dgamma, dbeta)`` (None where not needed), float32 BN and IN (``kept``: x - mu):
    :math:`dx = c_0 + (x-\mu)\,s + g\,c_1`, :math:`c_1 = \gamma r`, :math:`c_0 = -c_1\sum_S g/n`,
    :math:`s = -c_1 r^2 \sum_S g (x-\mu)/n`, each rounded once from float64 (from float32 values
    they took 3-4 roundings, shared by a channel); small terms first, :math:`g c_1` last (without
    FMA, ``ATEN_CPU_CAPABILITY=default``, the largest values take 2 roundings, not 4)."""
    need_x, need_w, need_b = needs
    sum_gc = None                                       # out: x's shape, for g (x - mu), dx
    sum_g = sum_keep(g, inner, double=True) if (need_x or need_b) else None       # sum_S g
    if need_x or need_w:                                        # sum_S g (x - mu), float64
        sum_gc = sum_of_products(g, kept, inner, out=out.view(g.shape), double=True)
    r = torch.rsqrt(var.double() + eps)
    dbeta = sum_keep(sum_g, param).reshape(lay.affine_shape) if need_b else None
    dgamma = sum_keep(sum_gc * r, param).reshape(lay.affine_shape) if need_w else None
    if need_x:
        gr = r if weight is None else r * weight.double().reshape(lay.affine_view_shape)
        c0 = (gr * sum_g * (-1.0 / lay.set_size)).to(g.dtype)
        slope = (gr * r * r * sum_gc * (-1.0 / lay.set_size)).to(g.dtype)
        out.view(g.shape).copy_(c0.expand_as(g)).addcmul_(kept, slope).addcmul_(g, gr.float())
    return (out if need_x else None), dgamma, dbeta


def _on_kept(per_xhat: torch.Tensor, per_kept) -> torch.Tensor:
    """A factor of x_hat as a factor of the kept tensor: x_hat f = kept (per_kept f)."""
    return per_xhat if per_kept is None else per_xhat * per_kept


def _input_gradient(lay, g, kept, per_kept, inv_std, w, sum_g, sum_gxhat, inner, outer,
                    param, need_w, out=None):
    """dL/dx by the boxed formula, in the fewest passes for where gamma lives.  x_hat is
    ``kept * per_kept`` (``per_kept`` None: ``kept`` is x_hat): the term in x_hat is taken on
    ``kept``, its per-set factor times ``per_kept``.  ``out``: a spare tensor of the input's
    shape for dx (BN, IN, GN), or None."""
    n, centered = lay.set_size, lay.centered
    if not outer:
        # BN, IN (and no gamma): gamma is constant on S, so it factors out of the sums:
        #   r (d - sum d / n - x_hat sum d x_hat / n)
        # = (gamma r) (g - sum g / n - x_hat sum g x_hat / n)
        g_scale = inv_std if w is None else inv_std * w             # d r = g (gamma r)
        return _grad_input(g, kept, g_scale, g_scale, sum_g if centered else None,
                           _on_kept(sum_gxhat, per_kept), n, n, lay.shape, out)
    if not inner:
        # LN, RMSNorm: gamma varies along every dim of S, so nothing of g was summed yet;
        # form d = gamma g once and take both set sums of it (a dot product each).  Large
        # temporaries cost page faults: d goes into the buffer of g x_hat once its gamma
        # gradient is taken (not when grad_w is that very buffer: no leading dims), and dx
        # is then written over d.  (Here kept is x_hat.)
        spare = sum_gxhat if (need_w and param and sum_gxhat.shape == g.shape) else None
        d = g if w is None else torch.mul(g, w, out=spare)
        sum_d = sum_keep(d, lay.reduce_dims) if centered else None
        sum_dxhat = sum_of_products(d, kept, lay.reduce_dims)
        reuse = w is not None and d.is_contiguous()
        return _grad_input(d, kept, inv_std, inv_std, sum_d, sum_dxhat, n, n, lay.shape,
                           out=d.view(lay.shape) if reuse else None)
    # GN: gamma varies inside S along the group's channels; finish the set sums of
    # d = gamma g (sum_S gamma g, sum_S gamma g x_hat: sums of small per-channel tensors)
    g_scale = inv_std if w is None else inv_std * w                 # d r = g (gamma r)
    # (also LN and RMSNorm when normalized_shape has a size-1 dim: gamma is constant there;
    # RMSNorm has no mean term, and sum_g was not taken)
    if not centered:
        sum_d = None
    else:
        sum_d = sum_keep(sum_g if w is None else sum_g * w, outer)
    sum_dxhat = sum_keep(sum_gxhat if w is None else sum_gxhat * w, outer)
    return _grad_input(g, kept, g_scale, inv_std, sum_d, _on_kept(sum_dxhat, per_kept),
                       n, n, lay.shape, out)


def _differentiable_backward(ctx, grad_y, x, weight):
    """Normalize's backward by :func:`boxed_backward`, with x_hat recomputed from the saved
    input (which carries its graph) in out-of-place ops: the result is differentiable again
    (double backward) and can be batched by ``torch.func.vmap``."""
    lay = ctx.lay
    _, var, centered = moments(x.reshape(lay.view_shape).to(compute_dtype(x.dtype)), lay)
    inv_std = inverse_std(var, ctx.eps)
    dx, dw, db = boxed_backward(grad_y, centered * inv_std, inv_std, weight, lay)
    need = ctx.needs_input_grad
    return (dx.to(x.dtype) if need[0] else None,
            dw.to(weight.dtype) if need[1] and weight is not None else None,
            db.to(ctx.bias_dtype) if need[2] and ctx.bias_dtype is not None else None, None, None)


# ---------------------------------------------------------------------------------------
# Weight Standardization
# ---------------------------------------------------------------------------------------
class WeightStandardize(PositionalApply, torch.autograd.Function):
    r"""``w_hat = (w - mu) / sqrt(var + eps)`` or ``(w - mu) / (std + eps)`` per output
    channel, with variance correction ``c``, and the hand-derived backward

    .. math::

        \frac{\partial L}{\partial w} = r\Big(d - \overline{d}
        - \hat w\,\frac{\rho}{n-c}\sum d\,\hat w\Big),\qquad
        \rho = 1 \text{ (inside)},\quad \rho = \frac{\sigma+\epsilon}{\sigma} \text{ (outside)}.

    ``WeightStandardize.apply(weight, eps, correction, eps_mode)`` returns ``(w_hat, kept,
    inv_std, m)``: the output, and what the backward keeps (non-differentiable).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(weight, eps: float, correction: int, eps_mode: str):
        lay = layout("layer", weight.shape)             # S = one output channel's weights
        # a weight is small: float32 goes through float64 (was up to 1.9x torch's error)
        wd = weight.double() if weight.dtype == torch.float32 else weight
        w_hat, _mean, var, inv_std = standardize(wd, lay, eps, correction, eps_mode)
        # m = (n - c) / rho, the divisor of the last term of the gradient
        n_c = lay.set_size - correction
        if eps_mode == "inside":
            m = torch.full_like(var, float(n_c))                          # rho = 1
        else:
            std = var.sqrt()
            # rho = (sigma + eps) / sigma.  At sigma = 0 the term is 0 (w_hat = 0 there,
            # and torch.std's backward drops it too); m = inf gives exactly that.
            m = torch.where(std > 0, n_c * std / (std + eps), torch.full_like(std, float("inf")))
        if weight.dtype == torch.float32 and FUSED_MULTIPLY_ADD:
            w_hat = w_hat.to(torch.float32)       # kept rounded: core.ws_grad_input's float32 form
        # a copy: the output must be neither w_hat (saved) nor a view of it
        return w_hat.reshape(weight.shape).to(weight.dtype, copy=True), w_hat, inv_std, m

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*output[1:])
        ctx.mark_non_differentiable(*output[1:])
        ctx.lay, ctx.dtype = layout("layer", inputs[0].shape), inputs[0].dtype

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_what, *_):
        w_hat, inv_std, m = ctx.saved_tensors
        lay: Layout = ctx.lay
        d = grad_what.reshape(lay.view_shape).to(w_hat.dtype)     # d = dL/dw_hat (no gamma)
        wide = w_hat.dtype == torch.float32                       # the sums in float64
        buf = torch.empty_like(d) if wide else None               # d w_hat, then the gradient
        sum_d = sum_keep(d, lay.reduce_dims, double=wide)                        # sum_S d
        sum_dwhat = sum_of_products(d, w_hat, lay.reduce_dims, buf, double=wide)  # sum_S d w_hat
        buf = buf if writes_in_place() else None
        grad_w = ws_grad_input(d, w_hat, inv_std, sum_d, sum_dwhat, lay.set_size, m, buf)
        return grad_w.reshape(lay.shape).to(ctx.dtype), None, None, None
