r"""Normalization with given statistics (BatchNorm and InstanceNorm in eval mode) in float32,
rounded as few times as can be, with its backward.

With the running statistics :math:`\mu, \sigma^2` fixed, the layer is an affine map per
channel, :math:`y = \gamma\,(x-\mu)\,r + \beta` with :math:`r = 1/\sqrt{\sigma^2+\epsilon}`,
and its gradients are

.. math::

    \frac{\partial L}{\partial x} = g\,(\gamma r), \qquad
    \frac{\partial L}{\partial \gamma} = r \sum g\,(x-\mu), \qquad
    \frac{\partial L}{\partial \beta} = \sum g,

summed over every dim where gamma has size 1 (the batch and the positions).  Through the
formula's steps (:func:`normcore.core.normalize_formula`, differentiated by autograd) each of
them took one or two roundings more than torch's kernel: :math:`r` rounded to float32 and then
:math:`\gamma r` rounded again, the output as :math:`(x-\mu)\,s` then :math:`+\beta` (three
roundings of the output's magnitude), the sums in float32 over 32768 values.  Measured at
(32, 64, 32, 32), seeds 0-4: the output up to 1.20x torch's error, dgamma 1.42x, dbeta 1.14x.

Here the factors come from float64 and are rounded once (:func:`normcore.core.affine_terms`,
with its two forms, :math:`x s + (\beta - \mu s)` for a channel whose mean is within 2
sigma of 0, :math:`(x - \mu) s + \beta` otherwise), dx is one product
:math:`g \cdot \mathrm{fl}(\gamma r)`, and the sums are taken in float64 from float32 rows
(:func:`_shared_sums`), then rounded once.  The backward is written in
out-of-place ops on the saved tensors, so that it is differentiable again (double backward).

Only float32, contiguous inputs with float32 statistics, in eager mode
(:func:`applies`); everything else keeps the formula.
"""
from __future__ import annotations

import math

import torch

from .axes import Layout
from .core import affine_terms, apply_affine_terms, sum_keep, writes_in_place

__all__ = ["NormalizeEval", "applies", "eval_affine"]


def applies(x: torch.Tensor, lay: Layout, mean, var, correction: int, eps_mode: str) -> bool:
    """Whether :func:`eval_affine` (and :class:`NormalizeEval`) take this call: float32,
    contiguous, centered statistics that carry no gradient, biased variance with eps inside,
    in eager mode (not under ``torch.compile``, ``torch.func``, ``torch.export`` or
    ``jit.trace``), and gamma constant along part of every set (BN, IN)."""
    return (x.dtype == torch.float32 and x.is_contiguous() and lay.centered
            and correction == 0 and eps_mode == "inside"
            and isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor)
            and mean.dtype == var.dtype == torch.float32
            and not (mean.requires_grad or var.requires_grad)
            and mean.numel() == var.numel() == _affine_numel(lay)
            and lay.norm in ("batch", "instance")
            and not torch.compiler.is_compiling() and writes_in_place()
            and not torch.jit.is_tracing())


def _affine_numel(lay: Layout) -> int:
    n = 1
    for s in lay.affine_view_shape:
        n *= s
    return n


def eval_affine(x: torch.Tensor, lay: Layout, mean: torch.Tensor, var: torch.Tensor,
                eps: float, weight, bias) -> torch.Tensor:
    """``gamma (x - mean) / sqrt(var + eps) + beta`` into a fresh tensor of ``x``'s shape,
    from the factors of :func:`normcore.core.affine_terms` (each rounded once)."""
    aff = lay.affine_view_shape
    m, v = mean.reshape(aff), var.reshape(aff)
    terms = affine_terms(m, torch.zeros_like(m), v, eps, aff, weight, bias)
    xv = x.view(lay.view_shape)
    y = torch.empty_like(x)
    centered = torch.sub(xv, m) if bool(terms[1].any()) else xv   # only for a far channel
    apply_affine_terms(xv, centered, terms, out=y.view(lay.view_shape))
    return y


def _shared(lay: Layout) -> tuple[int, ...]:
    """The view dims along which gamma and beta are shared (size 1 in the affine view)."""
    return tuple(k for k, s in enumerate(lay.affine_view_shape) if s == 1)


def _shared_sums(t: torch.Tensor, lay: Layout) -> torch.Tensor:
    """The sums of ``t`` (the view's shape) over :func:`_shared`, in float64, reshaped to
    ``lay.affine_shape``: by chunks of 64 along the last dim in float32, then in float64
    (as torch's kernels sum by vector lanes).  Measured at (32, 64, 32, 32), seeds 0-4, AVX-512
    and generic kernels: dgamma 0.6-3.0 roundings of its largest value, torch's 1.7-6.2; with
    rows of 1024 summed in float32, 0.9-2.5, and 1.73 beside torch's 1.73 on one seed."""
    shared, nd = _shared(lay), t.dim()
    k = 0                                        # the shared dims that end the shape
    while k < nd and nd - 1 - k in shared:
        k += 1
    last = math.prod(t.shape[nd - k:])
    if k and last % 64 == 0 and last > 64 and t.is_contiguous():
        chunks = t.reshape(t.shape[:nd - k] + (last // 64, 64)).sum(-1)     # float32
        dims = tuple(d for d in shared if d < nd - k) + (nd - k,)
        return chunks.sum(dims, dtype=torch.float64).reshape(lay.affine_shape)
    return sum_keep(t, shared, double=True).reshape(lay.affine_shape)


class NormalizeEval(torch.autograd.Function):
    """:func:`eval_affine` with the backward of the module docstring:
    ``NormalizeEval.apply(x, mean, var, weight, bias, lay, eps)`` (``mean`` and ``var``
    carry no gradient)."""

    @staticmethod
    def forward(ctx, x, mean, var, weight, bias, lay: Layout, eps: float):
        ctx.save_for_backward(x, mean, var, weight)
        ctx.lay, ctx.eps = lay, eps
        ctx.bias_dtype = None if bias is None else bias.dtype
        return eval_affine(x, lay, mean, var, eps, weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, mean, var, weight = ctx.saved_tensors
        lay: Layout = ctx.lay
        aff = lay.affine_view_shape
        need_x, _, _, need_w, need_b = ctx.needs_input_grad[:5]
        r = torch.rsqrt(var.reshape(aff).double() + ctx.eps)
        g = grad_y.reshape(lay.view_shape).to(torch.float32)
        dx = dw = db = None
        if need_x:                                        # g (gamma r), gamma r rounded once
            s = r if weight is None else r * weight.double().reshape(aff)
            dx = (g * s.float()).reshape(x.shape)
        if need_w and weight is not None:                 # r sum g (x - mu), in float64
            prod = g * (x.view(lay.view_shape) - mean.reshape(aff))
            dw = (_shared_sums(prod, lay) * r.reshape(lay.affine_shape)).to(weight.dtype)
        if need_b and ctx.bias_dtype is not None:         # sum g, in float64
            db = _shared_sums(g, lay).to(ctx.bias_dtype)
        return dx, None, None, dw, db, None, None
