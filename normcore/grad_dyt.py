r"""Dynamic Tanh (DyT; Zhu, Chen, He, LeCun & Liu 2025) and its hand-derived backward pass.

DyT replaces a normalization layer by an element-wise squashing with a learned scale:

.. math::

    y_i = \gamma_i \tanh(\alpha\, x_i) + \beta_i ,

with one learned **scalar** :math:`\alpha` for the whole layer and :math:`\gamma, \beta`
where LayerNorm keeps them (the trailing ``normalized_shape`` dims) or, for an
``(N, C, *spatial)`` input with ``channels_last=False``, one per channel as in BatchNorm
(:func:`normcore._checks.dyt_layout` asks :mod:`normcore.axes` which).  No statistics: there
is no set :math:`S_i`, and element :math:`i`'s output depends on :math:`x_i` alone.

This module is :mod:`normcore.grad`'s sibling, at the same layer: the formula, and the
autograd Function that carries the backward pass derived below.

Forward: the computational graph
--------------------------------
.. math::

    (1)\quad u_i = \alpha\, x_i \qquad (2)\quad t_i = \tanh u_i \qquad
    (3)\quad y_i = \gamma_i\, t_i + \beta_i

Backward: walk the graph from (3) to (1)
----------------------------------------
Write :math:`g_i = \partial L/\partial y_i`.

(3) :math:`\gamma, \beta` are shared by every element they multiply, so their gradients sum
over those elements (the leading dims; with ``channels_last=False`` the batch and the
positions), and the gradient reaching :math:`t` is scaled by :math:`\gamma`:

.. math::

    \frac{\partial L}{\partial \beta} = \sum g_i, \qquad
    \frac{\partial L}{\partial \gamma} = \sum g_i\, t_i, \qquad
    d_i := \frac{\partial L}{\partial t_i} = \gamma_i\, g_i .

(2) :math:`\tanh' u = 1 - \tanh^2 u`, which the forward pass has already computed:

.. math::

    e_i := \frac{\partial L}{\partial u_i} = d_i\,(1 - t_i^2).

(1) :math:`u_i = \alpha x_i`: :math:`x_i` reaches only :math:`u_i`, while :math:`\alpha`
reaches every :math:`u_k`, so its gradient is a sum over the whole tensor:

.. math::

    \boxed{\;\frac{\partial L}{\partial x_i} = \alpha\,\gamma_i\, g_i\,(1 - t_i^2),
    \qquad
    \frac{\partial L}{\partial \alpha} = \sum_{k} \gamma_k\, g_k\, x_k\,(1 - t_k^2)\;}

Unlike a normalization's gradient (:mod:`normcore.grad`), :math:`\partial L/\partial x_i`
has no sum over other elements: nothing is projected out, and a large :math:`|\alpha x_i|`
(:math:`t_i \to \pm 1`) lets almost no gradient through.  The backward keeps :math:`x` (an
input, kept anyway) and :math:`t`, as autograd through the formula would.

Precision and double backward
-----------------------------
float16 / bfloat16 inputs are computed in float32 and the results cast back to the dtypes
of the tensors they belong to, as in :mod:`normcore.core`: one rounding of the output
instead of one per step, and :math:`1 - t^2` is not taken in half precision (where
:math:`t` has 11 or 8 bits).  The saved :math:`t` is then float32.

The backward is written in differentiable torch ops.  The saved :math:`t` has forgotten how
it depends on :math:`x` and :math:`\alpha`, so when a backward runs with
``create_graph=True`` it is recomputed from the saved inputs (which carry their graph) and
the boxed formulas above are differentiated by autograd: a second derivative goes through
the hand-derived gradient, not through the forward formula.
"""
from __future__ import annotations

import torch

from .axes import Layout
from .core import PositionalApply, compute_dtype, set_sum
from .dispatch import recording as _recording

__all__ = ["DyTFunction", "dyt_formula", "dyt_backward", "tanh_derivative"]


def _affine(t: torch.Tensor, weight, bias, lay: Layout | None, out=None) -> torch.Tensor:
    """Step (3), ``gamma * t + beta``, gamma and beta broadcast over the layout's view.

    Written into ``out`` (a tensor of ``t``'s shape, which may be ``t`` itself) when given
    and contiguous (``t`` has the strides of a transposed input, say), out of place
    (differentiable by autograd) otherwise."""
    if weight is None and bias is None:
        return t
    if lay is None:
        raise ValueError("gamma and beta need the layout that says where they live; "
                         "build it with normcore._checks.dyt_layout")
    tv = t.reshape(lay.view_shape)
    w = None if weight is None else weight.to(t.dtype).reshape(lay.affine_view_shape)
    b = None if bias is None else bias.to(t.dtype).reshape(lay.affine_view_shape)
    if out is None:
        y = tv if w is None else tv * w                                  # gamma t
        return (y if b is None else y + b).reshape(t.shape)              # + beta
    if not out.is_contiguous():
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    ov = out.view(lay.view_shape)
    if w is not None:
        tv = torch.mul(tv, w, out=ov)                                    # gamma t
    if b is not None:
        torch.add(tv, b, out=ov)                                         # + beta
    return out


def dyt_formula(x: torch.Tensor, alpha: torch.Tensor, weight=None, bias=None,
                lay: Layout | None = None) -> torch.Tensor:
    r""":math:`\gamma \tanh(\alpha x) + \beta`, differentiable by autograd step by step.

    Without autograd, every step is written over the one fresh tensor :math:`\alpha x`.
    ``lay`` (from :func:`normcore._checks.dyt_layout`) says where gamma and beta live.
    """
    cdt = compute_dtype(x.dtype)
    recording = torch.is_grad_enabled() and any(
        p is not None and p.requires_grad for p in (x, alpha, weight, bias))
    u = x.to(cdt) * alpha.to(cdt).reshape(())                      # (1) u = alpha x
    t = torch.tanh(u) if recording else u.tanh_()                  # (2) t = tanh(u)
    in_place = not recording and not _recording()                 # not under torch.func
    return _affine(t, weight, bias, lay, out=t if in_place else None).to(x.dtype)   # (3)


def tanh_derivative(t: torch.Tensor) -> torch.Tensor:
    r"""Step (2) backward: :math:`\tanh' u = 1 - \tanh^2 u = 1 - t^2`, from the kept :math:`t`."""
    return torch.addcmul(t.new_ones(()), t, t, value=-1)          # 1 - t t, in one pass


def dyt_backward(g, x, alpha, weight, t, lay: Layout | None, needs=(True,) * 4):
    r"""``(dL/dx, dL/dalpha, dL/dgamma, dL/dbeta)`` by the boxed formulas (module docstring),
    in the compute dtype of ``t``; a gradient that ``needs`` does not ask for is None.

    Plain differentiable torch ops: autograd can differentiate this again (double backward),
    given a ``t`` that carries its graph.
    """
    need_x, need_a, need_w, need_b = needs
    view = x.shape if lay is None else lay.view_shape
    gv = g.to(t.dtype).reshape(view)                                 # g = dL/dy
    tv = t.reshape(view)
    grad_x = grad_a = grad_w = grad_b = None
    if need_w or need_b:
        # gamma and beta are shared along the view's dims where they have size 1
        shared = tuple(k for k, s in enumerate(lay.affine_view_shape) if s == 1)
        if need_b:
            grad_b = set_sum(gv, shared).to(t.dtype).reshape(lay.affine_shape)       # sum g
        if need_w:
            grad_w = set_sum(gv * tv, shared).to(t.dtype).reshape(lay.affine_shape)  # sum g t
    if need_x or need_a:
        d = gv if weight is None else gv * weight.to(t.dtype).reshape(lay.affine_view_shape)
        e = d * tanh_derivative(tv)                   # dL/du = gamma g (1 - t^2)
        if need_a:                                    # dL/dalpha = sum_k e_k x_k
            grad_a = torch.linalg.vecdot(e.reshape(-1), x.to(t.dtype).reshape(-1))
        if need_x:                                    # dL/dx = alpha e
            grad_x = (e * alpha.to(t.dtype).reshape(())).reshape(x.shape)
    return grad_x, grad_a, grad_w, grad_b


class DyTFunction(PositionalApply, torch.autograd.Function):
    r"""``y = gamma * tanh(alpha * x) + beta`` with the hand-derived backward (module
    docstring); ``DyTFunction.apply(x, alpha, weight, bias, lay)`` returns ``(y, t)``, ``t``
    the kept :math:`\tanh(\alpha x)` (not differentiable); ``weight`` and ``bias`` may be
    None (then ``lay`` may be None too).  torch.func's form (``setup_context``,
    ``generate_vmap_rule``): ``vmap``, ``grad`` and ``jacrev`` go through the backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, alpha, weight, bias, lay: Layout | None):
        cdt = compute_dtype(x.dtype)
        t = (x.to(cdt) * alpha.to(cdt).reshape(())).tanh_()          # (1)-(2), kept
        # (3) into a fresh tensor: the output must be neither t (saved) nor a view of it
        # (out of place under torch.func, whose batched values fit no plain tensor)
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device) if not _recording() else None
        y = t.clone() if weight is None and bias is None else _affine(t, weight, bias, lay, out)
        if out is None and (weight is not None or bias is not None):
            y = y.clone()     # out of place, y is a view; the caller may modify it in place
        return y.to(x.dtype), t

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, alpha, weight, bias, lay = inputs
        ctx.save_for_backward(x, alpha, weight, output[1])
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.lay = lay
        ctx.bias_dtype = None if bias is None else bias.dtype

    @staticmethod
    def backward(ctx, grad_y, _grad_t):
        if grad_y is None:                   # only t was used
            return None, None, None, None, None
        x, alpha, weight, t = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True (a second derivative is coming): recompute t from the saved
            # inputs, which still carry their graph, so that the gradient is differentiable
            t = torch.tanh(x.to(t.dtype) * alpha.to(t.dtype).reshape(()))
        needs = list(ctx.needs_input_grad[:4])
        needs[2] = needs[2] and weight is not None
        needs[3] = needs[3] and ctx.bias_dtype is not None
        gx, ga, gw, gb = dyt_backward(grad_y, x, alpha, weight, t, ctx.lay, needs)
        return (None if gx is None else gx.to(x.dtype),
                None if ga is None else ga.reshape(alpha.shape).to(alpha.dtype),
                None if gw is None else gw.to(weight.dtype),
                None if gb is None else gb.to(ctx.bias_dtype),
                None)
