r"""Hand-derived backward passes: BatchNorm, LayerNorm, InstanceNorm, GroupNorm and Weight
Standardization as ``torch.autograd.Function``.

Autograd can differentiate :func:`normcore.functional.normalize` by itself, through half a
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

Precision
---------
float16 / bfloat16 inputs are computed in float32, and the results (outputs and gradients)
are cast back to the dtypes of the tensors they belong to, as in
:func:`normcore.functional.normalize`.  :math:`\hat x` is saved in that float32 compute
dtype.  The saved :math:`\hat x` forgets how it depends on :math:`x`, so a second
derivative cannot use it: when a backward runs with ``create_graph=True``, ``Normalize``
differentiates the formula itself, recomputed from the saved inputs (autograd through
:func:`normcore.functional.normalize_formula`), and the result is differentiable again.
``WeightStandardize`` is ``once_differentiable`` and refuses a second derivative.
"""
from __future__ import annotations

import math
import numbers

import torch
from torch.autograd.function import once_differentiable

from . import functional as F
from .axes import Layout, layout
from .functional import (Normalized, WS_CONVENTIONS, _check_param, _verify_batch_size,
                         _verify_spatial_size, check_eps, check_float)

__all__ = [
    "Normalize", "WeightStandardize",
    "normalize", "batch_norm_train", "layer_norm", "instance_norm", "group_norm",
    "weight_standardize", "RMSNormalize", "rms_norm",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _sum(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``t.sum(dims, keepdim=True)``, and ``t`` itself when there is nothing to sum."""
    return t.sum(dims, keepdim=True) if dims else t


def _sum_prod(a: torch.Tensor, b: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``(a * b).sum(dims, keepdim=True)``.  When ``dims`` are the trailing dims (IN, GN,
    WS) it is a batch of dot products, one ``torch.bmm`` that never forms ``a * b``."""
    nd, k = a.dim(), len(dims)
    if k and tuple(dims) == tuple(range(nd - k, nd)) and a.shape == b.shape:
        lead = a.shape[:nd - k]
        dots = torch.bmm(a.reshape(-1, 1, math.prod(a.shape[nd - k:])),
                         b.reshape(-1, math.prod(b.shape[nd - k:]), 1))
        return dots.reshape(lead + (1,) * k)
    return _sum(a * b, dims)


def _standardize(x: torch.Tensor, lay: Layout, eps: float, correction: int, eps_mode: str):
    r"""Steps (1)-(4) of the forward graph, by :func:`normcore.functional.normalize` itself:
    returns :math:`\hat x` (in the view, compute dtype), :math:`\mu`, :math:`\sigma^2` and
    :math:`r`."""
    cdt = _compute_dtype(x.dtype)
    # no gamma, no beta: the primitive's output *is* x_hat
    out = F.normalize(x.to(cdt), lay, eps, correction=correction, eps_mode=eps_mode)
    xhat = out.output.reshape(lay.view_shape)
    if eps_mode == "inside":
        inv_std = torch.rsqrt(out.var + eps)        # (3)  r = 1 / sqrt(var + eps)
    else:
        inv_std = 1.0 / (out.var.sqrt() + eps)      # (3') r = 1 / (std + eps)
    return xhat, out.mean, out.var, inv_std


def _grad_input(g: torch.Tensor, xhat: torch.Tensor, g_scale: torch.Tensor,
                scale: torch.Tensor, sum_d: torch.Tensor, sum_dxhat: torch.Tensor,
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
    :math:`(n - c)/\rho` for Weight Standardization.  Everything but ``g`` and ``xhat`` is
    small: one value per set (or per set and channel).

    The result is written through the view into a fresh tensor of the input's ``shape``:
    autograd would copy a gradient that is a view before storing it in ``x.grad``.
    """
    shift = sum_d * scale * (-1.0 / n)                   # -r * mean_S(d)
    slope = sum_dxhat * scale / (-m)                     # -r * sum_S(d x_hat) / m
    if out is None:  # else: a temporary of the input's shape, overwritten (may be g itself)
        out = torch.empty(shape, dtype=g.dtype, device=g.device)
    view = out.view(g.shape)
    torch.mul(g, g_scale, out=view).add_(shift)          # r d - r mean_S(d)
    view.addcmul_(xhat, slope)                           #     - r x_hat sum_S(d x_hat) / m
    return out


def _sum_times(a: torch.Tensor, w: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``(a * w).sum(dims, keepdim=True)`` as one contraction (``torch.einsum``), without
    forming the full-size product ``a * w``; ``w`` broadcasts against ``a``."""
    idx = "abcdefghijklmnopqrstuvwxyz"[:a.dim()]
    w_idx = "".join(i for i, s in zip(idx, w.shape) if s != 1)
    out_idx = "".join(i for k, i in enumerate(idx) if k not in dims)
    out = torch.einsum(f"{idx},{w_idx}->{out_idx}", a, w.reshape([s for s in w.shape if s != 1]))
    for k in sorted(dims):
        out = out.unsqueeze(k)
    return out


# ---------------------------------------------------------------------------------------
# BN (training), LN, IN, GN: one Function, driven by the Layout
# ---------------------------------------------------------------------------------------
class Normalize(torch.autograd.Function):
    r"""``y = gamma * (x - mu) / sqrt(var + eps) + beta`` over the sets of ``lay``, with the
    hand-derived backward (module docstring).

    ``Normalize.apply(x, weight, bias, lay, eps)`` returns ``(y, mean, var)``; ``mean`` and
    ``var`` (biased, in the view's keepdim shape) are there for running statistics and are
    not differentiable.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, lay: Layout, eps: float):
        xhat, mean, var, inv_std = _standardize(x, lay, eps, 0, "inside")   # (1)-(4)
        cdt = xhat.dtype
        w = None if weight is None else weight.to(cdt).reshape(lay.affine_view_shape)
        b = None if bias is None else bias.to(cdt).reshape(lay.affine_view_shape)
        # (5) y = gamma * x_hat + beta, written through the view into a fresh tensor of the
        # input's shape (an output that were a view, or x_hat itself, could not be modified
        # in place by the caller)
        y = torch.empty(lay.shape, dtype=cdt, device=xhat.device)
        yv = y.view(lay.view_shape)
        if w is not None and b is not None:
            torch.mul(xhat, w, out=yv).add_(b)   # (out-of-place addcmul is slow on CPU)
        elif w is not None:
            torch.mul(xhat, w, out=yv)
        elif b is not None:
            torch.add(xhat, b, out=yv)
        else:
            yv.copy_(xhat)
        ctx.save_for_backward(xhat, inv_std, weight, x, bias)
        ctx.lay = lay
        ctx.eps = eps
        ctx.has_bias = bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.x_dtype = x.dtype
        ctx.mark_non_differentiable(mean, var)
        ctx.set_materialize_grads(False)     # no zero gradients for mean and var
        return y.to(x.dtype), mean, var

    @staticmethod
    def backward(ctx, grad_y, _grad_mean, _grad_var):
        if grad_y is None:                   # y was not used (only mean / var)
            return None, None, None, None, None
        xhat, inv_std, weight, x, bias = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True (a second derivative is coming): the saved x_hat has
            # forgotten how it depends on x, so differentiate the formula itself, recomputed
            # from the saved inputs, which still carry their graph
            return _backward_through_formula(ctx, grad_y, x, weight, bias)
        lay: Layout = ctx.lay
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        need_w = need_w and weight is not None
        need_b = need_b and ctx.has_bias
        cdt, n, ndim = xhat.dtype, lay.set_size, len(lay.view_shape)

        g = grad_y.reshape(lay.view_shape).to(cdt)                  # g = dL/dy
        w = None if weight is None else weight.to(cdt).reshape(lay.affine_view_shape)
        # the view dims along which gamma and beta do not vary (size 1 in affine_view_shape)
        const = tuple(k for k in range(ndim) if lay.affine_view_shape[k] == 1)
        inner = tuple(k for k in lay.reduce_dims if k in const)      # in S, gamma constant
        outer = tuple(k for k in lay.reduce_dims if k not in const)  # in S, gamma varies
        param = tuple(k for k in const if k not in inner)            # outside S, gamma constant

        # The only two passes over the whole tensor: sum g and g x_hat over `inner`
        # (BN: per channel; IN, GN: per sample and channel; LN: nothing to sum, yet).
        # (LN has no inner dims: its dx takes its own sums of d = gamma g below)
        sum_g = _sum(g, inner) if ((need_x and inner) or need_b) else None
        sum_gxhat = None
        if (need_x and inner) or need_w:
            # for LN (no inner dims) this is the full-size g * x_hat: keep it to reuse below
            sum_gxhat = _sum_prod(g, xhat, inner)

        grad_x = grad_w = grad_b = None
        if need_b:                                    # dL/dbeta  = sum of g      (5)
            grad_b = _sum(sum_g, param).reshape(lay.affine_shape).to(ctx.bias_dtype)
        if need_w:                                    # dL/dgamma = sum of g x_hat (5)
            grad_w = _sum(sum_gxhat, param).reshape(lay.affine_shape).to(weight.dtype)
        if need_x:
            if not outer:
                g_scale = inv_std if w is None else inv_std * w       # d r = g (gamma r)
                # BN, IN (and no gamma): gamma is constant on S, so it factors out of the
                # sums:  r (d - sum d / n - x_hat sum d x_hat / n)
                #      = (gamma r) (g - sum g / n - x_hat sum g x_hat / n)
                grad_x = _grad_input(g, xhat, g_scale, g_scale, sum_g, sum_gxhat, n, n, lay.shape)
            elif not inner:
                # LN: gamma varies along every dim of S, so nothing of g was summed yet;
                # form d = gamma g once and take both set sums of it (a dot product each)
                # (large temporaries cost page faults: d goes into the buffer of g x_hat,
                # whose gamma-gradient is taken, and dx is then written over d)
                # (not when grad_w is that very buffer: no leading dims to sum it over)
                spare = sum_gxhat if (need_w and param and sum_gxhat.shape == g.shape) else None
                d = g if w is None else torch.mul(g, w, out=spare)
                sum_d = _sum(d, lay.reduce_dims)
                sum_dxhat = _sum_prod(d, xhat, lay.reduce_dims)
                grad_x = _grad_input(d, xhat, inv_std, inv_std, sum_d, sum_dxhat, n, n, lay.shape,
                                     out=None if w is None or lay.view_shape != lay.shape else d)
            else:
                # GN: gamma varies inside S along the group's channels; finish the set sums
                # of d = gamma g (sum_S gamma g, sum_S gamma g x_hat: small contractions)
                g_scale = inv_std if w is None else inv_std * w       # d r = g (gamma r)
                sum_d = _sum(sum_g, outer) if w is None else _sum_times(sum_g, w, outer)
                sum_dxhat = (_sum(sum_gxhat, outer) if w is None
                             else _sum_times(sum_gxhat, w, outer))
                grad_x = _grad_input(g, xhat, g_scale, inv_std, sum_d, sum_dxhat, n, n, lay.shape)
            grad_x = grad_x.to(ctx.x_dtype)
        return grad_x, grad_w, grad_b, None, None


def _backward_through_formula(ctx, grad_y, x, weight, bias):
    """Normalize's backward by autograd through :func:`functional.normalize_formula`, so that
    the gradient is itself differentiable (double backward)."""
    inputs = (x, weight, bias)
    wanted = [i for i, t in enumerate(inputs) if ctx.needs_input_grad[i] and t is not None]
    y = F.normalize_formula(x, ctx.lay, ctx.eps, weight, bias).output
    grads = torch.autograd.grad(y, [inputs[i] for i in wanted], grad_y, create_graph=True)
    out = [None] * 5
    for i, g in zip(wanted, grads):
        out[i] = g
    return tuple(out)


# ---------------------------------------------------------------------------------------
# Weight Standardization
# ---------------------------------------------------------------------------------------
class WeightStandardize(torch.autograd.Function):
    r"""``w_hat = (w - mu) / sqrt(var + eps)`` or ``(w - mu) / (std + eps)`` per output
    channel, with variance correction ``c``, and the hand-derived backward

    .. math::

        \frac{\partial L}{\partial w} = r\Big(d - \overline{d}
        - \hat w\,\frac{\rho}{n-c}\sum d\,\hat w\Big),\qquad
        \rho = 1 \text{ (inside)},\quad \rho = \frac{\sigma+\epsilon}{\sigma} \text{ (outside)}.

    ``WeightStandardize.apply(weight, eps, correction, eps_mode)``.
    """

    @staticmethod
    def forward(ctx, weight, eps: float, correction: int, eps_mode: str):
        lay = layout("layer", weight.shape)             # S = one output channel's weights
        what, _mean, var, inv_std = _standardize(weight, lay, eps, correction, eps_mode)
        # m = (n - c) / rho, the divisor of the last term of the gradient
        n_c = lay.set_size - correction
        if eps_mode == "inside":
            m = torch.full_like(var, float(n_c))                          # rho = 1
        else:
            std = var.sqrt()
            # rho = (sigma + eps) / sigma.  At sigma = 0 the term is 0 (w_hat = 0 there,
            # and torch.std's backward drops it too); m = inf gives exactly that.
            m = torch.where(std > 0, n_c * std / (std + eps), torch.full_like(std, float("inf")))
        ctx.save_for_backward(what, inv_std, m)
        ctx.lay = lay
        ctx.dtype = weight.dtype
        # a copy: the output must be neither w_hat (saved) nor a view of it
        return what.reshape(weight.shape).to(weight.dtype, copy=True)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_what):
        what, inv_std, m = ctx.saved_tensors
        lay: Layout = ctx.lay
        d = grad_what.reshape(lay.view_shape).to(what.dtype)     # d = dL/dw_hat (no gamma)
        sum_d = d.sum(lay.reduce_dims, keepdim=True)              # sum_S d
        sum_dwhat = _sum_prod(d, what, lay.reduce_dims)          # sum_S d w_hat
        # r (d - sum d / n - w_hat sum d w_hat / m)
        grad_w = _grad_input(d, what, inv_std, inv_std, sum_d, sum_dwhat, lay.set_size, m,
                             lay.shape)
        return grad_w.to(ctx.dtype), None, None, None


# ---------------------------------------------------------------------------------------
# public functions (the signatures of torch.nn.functional, and of normcore.functional)
# ---------------------------------------------------------------------------------------
def normalize(x: torch.Tensor, lay: Layout, eps: float, weight=None, bias=None) -> Normalized:
    r""":func:`normcore.functional.normalize` (biased variance, :math:`\epsilon` inside the
    square root) with the hand-derived backward.  Returns ``Normalized(output, mean, var)``;
    only ``output`` carries gradients."""
    fn = "normalize"
    check_float(x, "x", fn)
    check_eps(eps, fn)
    if not isinstance(lay, Layout):
        raise TypeError(f"{fn}: lay must be a normcore.axes.Layout, got {type(lay).__name__}")
    if tuple(x.shape) != tuple(lay.shape):
        raise ValueError(
            f"{fn}: x has shape {tuple(x.shape)} but the layout was made for shape {lay.shape}; "
            f"build it with normcore.axes.layout(norm, x.shape, ...)")
    _check_param(weight, "weight", lay.affine_shape, fn)
    _check_param(bias, "bias", lay.affine_shape, fn)
    return Normalized(*Normalize.apply(x, weight, bias, lay, eps))


def batch_norm_train(input, weight=None, bias=None, eps=1e-5):
    r"""BatchNorm in training mode (batch statistics; no running buffers): one
    :math:`\mu, \sigma^2` per channel over the batch and every position.  The same as
    ``torch.nn.functional.batch_norm(input, None, None, weight, bias, training=True, eps=eps)``."""
    lay = F.batch_norm_layout(input, weight, bias, eps)
    _verify_batch_size(input.shape, "batch_norm")
    return Normalize.apply(input, weight, bias, lay, eps)[0]


def instance_norm(input, weight=None, bias=None, eps=1e-5):
    r"""InstanceNorm (input statistics; no running buffers): one :math:`\mu, \sigma^2` per
    sample and channel, over the positions."""
    lay = F.instance_norm_layout(input, weight, bias, eps)
    _verify_spatial_size(input.shape, "instance_norm")
    return Normalize.apply(input, weight, bias, lay, eps)[0]


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    r"""LayerNorm: one :math:`\mu, \sigma^2` per leading index over the trailing
    ``normalized_shape`` dims; gamma and beta have ``normalized_shape``."""
    lay = F.layer_norm_layout(input, normalized_shape, weight, bias, eps)
    return Normalize.apply(input, weight, bias, lay, eps)[0]


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    r"""GroupNorm: one :math:`\mu, \sigma^2` per sample and group of ``C // num_groups``
    contiguous channels; gamma and beta per channel."""
    lay = F.group_norm_layout(input, num_groups, weight, bias, eps)
    return Normalize.apply(input, weight, bias, lay, eps)[0]


def weight_standardize(weight, eps=None, *, convention="original"):
    r"""Weight Standardization with the hand-derived backward; the semantics (conventions,
    default ``eps``, errors) of :func:`normcore.functional.weight_standardize`."""
    _, eps, conv = F.weight_standardize_setup(weight, eps, convention)
    return WeightStandardize.apply(weight, float(eps), conv["correction"], conv["eps_mode"])



# ---------------------------------------------------------------------------------------
# RMSNorm: BEGIN rms_norm block (the Function and its public wrapper)
# ---------------------------------------------------------------------------------------
class RMSNormalize(torch.autograd.Function):
    r"""``y = gamma * x * r``, ``r = 1 / sqrt(mean_S(x^2) + eps)`` over the trailing
    ``normalized_shape`` dims, with the hand-derived backward.

    Forward, for one set :math:`S` of :math:`K = |S|` elements:
    :math:`m = \frac1K\sum_k x_k^2`, :math:`r = (m+\epsilon)^{-1/2}`,
    :math:`\hat x_i = x_i r`, :math:`y_i = \gamma_i \hat x_i`.
    Backward, with :math:`d_i = \gamma_i g_i`:

    .. math::

        \frac{\partial L}{\partial r} = \sum_k d_k x_k,\quad
        \frac{\partial r}{\partial m} = -\frac{r^3}{2},\quad
        \frac{\partial m}{\partial x_i} = \frac{2x_i}{K}
        \;\Rightarrow\;
        \boxed{\frac{\partial L}{\partial x_i}
        = r\Big(d_i - \hat x_i\,\frac1K\sum_{k\in S} d_k\hat x_k\Big)},\qquad
        \frac{\partial L}{\partial \gamma_i} = \sum g_i \hat x_i .

    Compared with LayerNorm's boxed formula, the term :math:`-\frac1K\sum_k d_k` is gone:
    there is no mean, so the gradient is not orthogonal to a constant shift of the set.
    Half inputs are computed in float32, as in :func:`normcore.functional.rms_norm_formula`.
    A backward with ``create_graph=True`` differentiates the formula itself (recomputed
    from the saved inputs), so the result is differentiable again, as for
    :class:`Normalize`.

    ``RMSNormalize.apply(x, weight, lay, eps)`` with ``lay`` a LayerNorm
    :class:`~normcore.axes.Layout` and ``eps`` a float.
    """

    @staticmethod
    def forward(ctx, x, weight, lay: Layout, eps: float):
        cdt = _compute_dtype(x.dtype)
        xv = x.reshape(lay.view_shape).to(cdt)
        inv_rms = torch.rsqrt(F._sum_of_squares(xv, lay.reduce_dims) / lay.set_size + eps)  # r
        xhat = xv * inv_rms                                              # x r
        if weight is not None:
            y = xhat * weight.to(cdt).reshape(lay.affine_view_shape)     # gamma x r
        else:
            y = xhat
        # a fresh output (never x_hat itself, which is saved)
        y = y.reshape(lay.shape).to(x.dtype, copy=weight is None)
        ctx.save_for_backward(xhat, inv_rms, weight, x)
        ctx.lay = lay
        ctx.eps = eps
        ctx.x_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, grad_y):
        xhat, inv_rms, weight, x = ctx.saved_tensors
        lay: Layout = ctx.lay
        need_x, need_w = ctx.needs_input_grad[:2]
        need_w = need_w and weight is not None
        if torch.is_grad_enabled():
            # create_graph=True: differentiate the formula, recomputed with its graph
            inputs = [t for t, need in ((x, need_x), (weight, need_w)) if need]
            y, _ = F.rms_norm_formula(x, lay, ctx.eps, weight)
            grads = list(torch.autograd.grad(y, inputs, grad_y, create_graph=True))
            return (grads.pop(0) if need_x else None, grads.pop(0) if need_w else None,
                    None, None)
        cdt, K = xhat.dtype, lay.set_size
        g = grad_y.reshape(lay.view_shape).to(cdt)                      # g = dL/dy
        grad_x = grad_w = None
        if need_w:                                    # dL/dgamma = sum of g x_hat
            grad_w = (g.reshape(-1, K) * xhat.reshape(-1, K)).sum(0)
            grad_w = grad_w.reshape(lay.affine_shape).to(weight.dtype)
        if need_x:
            d = g if weight is None else g * weight.to(cdt).reshape(lay.affine_view_shape)
            sum_dxhat = _sum_prod(d, xhat, lay.reduce_dims)             # sum_S d x_hat
            # r (d - x_hat sum_S(d x_hat) / K), as d r + x_hat (-r sum_S(d x_hat) / K)
            grad_x = torch.mul(d, inv_rms).addcmul_(xhat, sum_dxhat * inv_rms / (-K))
            grad_x = grad_x.reshape(lay.shape).to(ctx.x_dtype)
        return grad_x, grad_w, None, None


def rms_norm(input, normalized_shape, weight=None, eps=None):
    r"""RMSNorm with the hand-derived backward; the semantics (default ``eps``, errors) of
    :func:`normcore.functional.rms_norm`."""
    lay, eps = F.rms_norm_layout(input, normalized_shape, weight, eps, "rms_norm")
    return RMSNormalize.apply(input, weight, lay, eps)
# ---------------------------------------------------------------------------------------
# END rms_norm block
# ---------------------------------------------------------------------------------------
