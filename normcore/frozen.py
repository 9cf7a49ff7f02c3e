r"""BatchNorm and InstanceNorm with given statistics (eval mode, the running buffers): a
per-channel affine map, as ``torch.autograd.Function`` with its backward by hand.

With :math:`\mu_c` and :math:`\sigma_c^2` fixed (buffers, not functions of the batch), the
formula of :mod:`normcore.core` is affine in :math:`x`, one scale and one shift per channel:

.. math::

    y = (x - \mu_c)\,s_c + \beta_c, \qquad s_c = \gamma_c\, r_c,\quad
    r_c = \frac{1}{\sqrt{\sigma_c^2 + \epsilon}},

and its gradients have no term through the statistics (steps (1)-(2) of
:mod:`normcore.grad` are constants here):

.. math::

    \frac{\partial L}{\partial x} = g\,s_c, \qquad
    \frac{\partial L}{\partial \gamma_c} = r_c \sum g\,(x - \mu_c), \qquad
    \frac{\partial L}{\partial \beta_c} = \sum g,

the sums over every element of channel :math:`c` (batch and positions).  Autograd through
the formula's ops would keep ``x - mu`` and its products for the backward; here the backward
keeps x alone, as torch's kernel does.

Computed as the reference computes (:func:`normcore.core.reference_dtype`: float64 for a
float32 input, each output and gradient rounded once).  No gradient
reaches the running statistics, as in torch (``running_mean`` and ``running_var`` are not
differentiable inputs of ``batch_norm``).  With the kernels on
(:func:`normcore.dispatch.fixed_family`), the forward and the backward are one compiled pass
each (:func:`normcore.kernels.fixed_forward`, :func:`normcore.kernels.fixed_backward`).
"""
from __future__ import annotations

import torch

from . import dispatch, kernels
from .axes import Layout
from .core import PositionalApply, output_format, reference_dtype, set_sum

__all__ = ["FixedStatistics", "applies"]


def applies(x: torch.Tensor) -> bool:
    """Whether :class:`FixedStatistics` takes this input (the running statistics, one value
    per channel, are its callers'): one with channels, and not while ``torch.jit.trace``
    records (a Function would be one opaque call with the input's sizes as constants; the
    formula's ops keep them traced)."""
    return x.dim() >= 2 and not torch.jit.is_tracing()


def _scale(r: torch.Tensor, weight, shape, dtype: torch.dtype) -> torch.Tensor:
    r""":math:`s = \gamma r` in ``r``'s dtype (the reference's), cast to ``dtype``."""
    return (r if weight is None else r * weight.to(r.dtype).reshape(shape)).to(dtype)


def _channel_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of each channel (dim 1) of ``t`` over every other dim, ``(C,)``."""
    return set_sum(t, tuple(d for d in range(t.dim()) if d != 1)).flatten()


class FixedStatistics(PositionalApply, torch.autograd.Function):
    r"""``y = (x - mean) * gamma / sqrt(var + eps) + beta`` per channel, with ``mean`` and
    ``var`` given (the running statistics: BN and IN in eval mode), and the backward of the
    module docstring.

    ``FixedStatistics.apply(x, mean, var, weight, bias, lay, eps)``, ``mean`` and ``var``
    of ``lay.affine_view_shape``, returns ``(y, r)``; only ``y`` is differentiable."""

    generate_vmap_rule = True   # torch.func.vmap batches forward and backward as they are

    @staticmethod
    def forward(x, mean, var, weight, bias, lay: Layout, eps: float):
        cdt = reference_dtype(x)
        r = torch.rsqrt(var.to(cdt) + eps)                                     # r
        if dispatch.fixed_family(lay, x) is not None:                         # the kernels
            C = x.shape[1]
            t = torch.zeros(C, dtype=cdt) if bias is None else bias.to(cdt).reshape(C)
            return kernels.fixed_forward(x, mean.to(cdt).reshape(C), _scale(
                r, weight, lay.affine_view_shape, cdt).reshape(C), t, lay), r
        y = (x.to(cdt) - mean.to(cdt)) * _scale(r, weight, lay.affine_view_shape, cdt)
        if bias is not None:
            y = y + bias.to(cdt).reshape(lay.affine_view_shape)
        return y.to(x.dtype).contiguous(memory_format=output_format(lay, x)), r

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, mean, _var, weight, bias, lay, _eps = inputs
        _, r = output
        ctx.save_for_backward(x, mean, r, weight)
        ctx.mark_non_differentiable(r)
        ctx.set_materialize_grads(False)
        ctx.bias_dtype, ctx.lay = None if bias is None else bias.dtype, lay

    @staticmethod
    def backward(ctx, g, *_):
        if g is None:
            return None, None, None, None, None, None, None
        x, mean, r, weight = ctx.saved_tensors
        need_x, _, _, need_w, need_b = ctx.needs_input_grad[:5]
        need_w, need_b = need_w and weight is not None, need_b and ctx.bias_dtype is not None
        lay = ctx.lay
        cdt = reference_dtype(x)
        family = dispatch.fixed_family(lay, x)
        if family is not None and not torch.is_grad_enabled():
            return _backward_kernel(ctx, g, x, mean, r, weight, need_x, need_w, need_b)
        gc = g.to(cdt)
        dx = dw = db = None
        if need_x:                                                  # g gamma r
            dx = (gc * _scale(r, weight, lay.affine_view_shape, cdt)).to(x.dtype)
        if need_w:                                                  # r sum g (x - mu)
            dw = (_channel_sum(gc * (x.to(cdt) - mean.to(cdt))) * r.flatten()).to(weight.dtype)
        if need_b:                                                  # sum g
            db = _channel_sum(gc).to(ctx.bias_dtype)
        return dx, None, None, dw, db, None, None


def _backward_kernel(ctx, g, x, mean, r, weight, need_x: bool, need_w: bool, need_b: bool):
    """The backward by the kernels (:func:`normcore.kernels.fixed_backward`): one pass over x
    and g, dx rounded once, the sums in float64."""
    C = x.shape[1]
    s = _scale(r, weight, ctx.lay.affine_view_shape, torch.float64).reshape(C)
    dx, sums = kernels.fixed_backward(g, x, mean.double().reshape(C), s, ctx.lay)
    dw = (sums[0] * r.double().flatten()).to(weight.dtype) if need_w else None
    db = sums[1].to(ctx.bias_dtype) if need_b else None
    return dx if need_x else None, None, None, dw, db, None, None
