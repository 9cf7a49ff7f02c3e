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
the formula's ops gets the same numbers with four or five full-size tensors (``x - mu``, its
product, the output, and a gradient for each product); here there are two, the output and
the input's gradient, as in torch's kernel, and the product :math:`g\,(x-\mu)` is formed
in the gradient's buffer before the gradient overwrites it.

The output is rounded as :func:`normcore.core.affine_terms` does: :math:`s_c` once from
float64, and :math:`y = x\,s_c + (\beta_c - \mu_c s_c)` (torch's form) for a channel whose
mean is within 2 sigma of 0, else :math:`(x - \mu_c)\,s_c + \beta_c`.  The sums are taken
in float64 (by rows of float32 first), and :math:`r_c` multiplies them in float64.  No
gradient reaches the running statistics, as in torch (``running_mean`` and
``running_var`` are not differentiable inputs of ``batch_norm``).

On ``channels_last`` memory, with numba installed, the backward is one compiled pass over x
and g (:func:`normcore.positions.backward_fixed`: dx in float64 rounded once, the two sums in
float64): BN eval fwd+bwd at (32, 64, 32, 32), one thread, 1.1x torch's time where the
torch ops below take 1.9-2.1x.
"""
from __future__ import annotations

import torch

from . import loops, positions
from .axes import Layout
from .core import (NEAR_ZERO, PositionalApply, affine_terms, compute_dtype, output_format,
                   scale_and_shift, writes_in_place)
from .passes import column_sums, row_affine, row_sums

__all__ = ["FixedStatistics", "applies"]


def applies(x: torch.Tensor) -> bool:
    """Whether :class:`FixedStatistics` takes this input (the running statistics, one value
    per channel, are its callers'): one with channels, and not while ``torch.jit.trace``
    records (a Function would be one opaque call with the input's sizes as constants; the
    formula's ops keep them traced)."""
    return x.dim() >= 2 and not torch.jit.is_tracing()


def _terms(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, lay: Layout, eps: float,
           weight, bias):
    """``(s_x, s_c, t, r)``: the factors of :func:`normcore.core.affine_terms` for the fixed
    statistics (``s_c`` None when every channel's mean is near 0, the usual case, found in
    fewer small steps), and ``r`` in float64."""
    cdt = compute_dtype(x.dtype)
    shape = lay.affine_view_shape
    mu, v = mean.to(cdt).double(), var.to(cdt).double()
    r = torch.rsqrt(v + eps)
    eager = writes_in_place() and not torch.compiler.is_compiling()
    if eager and bool((mu.abs() <= NEAR_ZERO * v.sqrt()).all()):
        s, t = scale_and_shift(r, mu, shape, weight, bias, cdt)
        return s, None, t, r
    return (*affine_terms(mean.to(cdt), torch.zeros_like(mean, dtype=cdt), var.to(cdt), eps,
                          shape, weight, bias), r)


def _channel_inner(t: torch.Tensor) -> bool:
    """Whether the channel dim (1) is innermost in memory (``channels_last``, or ``(N, C)``):
    then a per-channel scale varies along the inner loop and one ``addcmul`` vectorizes."""
    return t.stride(1) == 1 and t.shape[1] > 1


def _forward(x: torch.Tensor, mean: torch.Tensor, terms, lay: Layout) -> torch.Tensor:
    """``y = x s_x + ((x - mu) s_c + t)`` in the compute dtype and torch's memory format."""
    s_x, s_c, t = terms
    cdt = s_x.dtype
    xv = x.to(cdt)
    if not writes_in_place() or torch.compiler.is_compiling():
        # out of place, branch-free (torch.func; torch.compile fuses it)
        return xv * s_x + ((xv - mean.to(cdt)) * s_c + t)
    y = torch.empty_like(x, dtype=cdt, memory_format=output_format(lay, x))
    if s_c is None:                       # every channel's mean near 0: x s + t
        if _channel_inner(y):
            return torch.addcmul(t, xv, s_x, out=y)
        if xv.is_contiguous() and y.is_contiguous() and y.dim() > 2 and y.numel():
            rows = (y.shape[0], y.shape[1], y[0, 0].numel())     # positions per channel
            row_affine(xv.reshape(rows), s_x.reshape(1, -1, 1), t.reshape(1, -1, 1),
                       out=y.view(rows))             # fused multiply-add: one rounding
            return y
        return y.copy_(t.expand_as(y)).addcmul_(xv, s_x)
    torch.sub(xv, mean.to(cdt), out=y)                                   # x - mu
    if _channel_inner(y):
        torch.addcmul(t, y, s_c, out=y)                                  # (x - mu) s + t
    else:
        y.mul_(s_c).add_(t)
    return y.addcmul_(xv, s_x) if bool(s_x.any()) else y                 # + x s (near)


def channel_sums(t: torch.Tensor) -> torch.Tensor:
    """The sum of each channel (dim 1) of ``t`` over every other dim, ``(C,)``, in float64 for
    float32 ``t`` (by rows of float32 first: :func:`normcore.passes.row_sums`,
    :func:`normcore.passes.column_sums`), in ``t``'s dtype otherwise."""
    C = t.shape[1]
    acc = torch.float64 if t.dtype == torch.float32 else t.dtype
    if _channel_inner(t) and t.dim() > 2:          # channels_last: (N * positions, C) rows
        rows = t.movedim(1, -1).reshape(-1, C)
    elif t.dim() == 2:
        rows = t
    else:
        rows = None
    if rows is not None and rows.is_contiguous():
        out = torch.empty(C, dtype=acc, device=t.device)
        column_sums(rows, out)
        return out
    per_row = t.reshape(t.shape[0] * C, -1)         # contiguous: a row of positions per (n, c)
    if acc == t.dtype:
        return per_row.sum(1).view(t.shape[0], C).sum(0)
    return row_sums(per_row.contiguous()).view(t.shape[0], C).sum(0)


def _exact_dots(x: torch.Tensor, mean: torch.Tensor, g: torch.Tensor,
                buf: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum g\,(x - \mu)` per channel, ``(C,)`` float64, for contiguous float32 ``x``,
    ``g`` of at least four samples: :math:`x - \mu` and its product with ``g`` are exact in float64
    (24-bit operands), so the sums carry only float64's own roundings.  x and g are copied,
    a quarter of the samples at a time, into the memory of ``buf`` (float32, x's size: the
    input gradient's, written after) read as float64: no temporary as large as x.  From
    float32 products (two roundings each) and float32 partial sums, dgamma was 1.001x torch's
    error (seed 4 of benchmarks/accuracy.py, AVX-512); now 0.09-0.47x on seeds 0-4 (generic
    kernels: 0.14-0.42x), for 1.3x -> 1.6x torch's time (fwd+bwd at (32, 64, 32, 32)).
    Contiguous input only: on ``channels_last`` memory the copies took BN eval fwd+bwd from
    1.9x torch's time to 2.5x; and not under torch.compile (:meth:`FixedStatistics.backward`)."""
    N, C = x.shape[0], x.shape[1]
    per_sample = x[0].numel()
    step = max(1, min(N // 4, (1 << 18) // max(per_sample, 1)))
    scratch = buf.as_strided((buf.numel(),), (1,)).view(torch.float64)
    half = step * per_sample
    out = torch.zeros(C, dtype=torch.float64, device=x.device)
    mu = mean.double()
    for s in range(0, N, step):
        xs, gs = x[s:s + step], g[s:s + step]
        a = scratch[:xs.numel()].view(xs.shape).copy_(xs).sub_(mu)              # x - mu
        b = scratch[half:half + xs.numel()].view(xs.shape).copy_(gs)
        out.add_(channel_sums(a.mul_(b)))                                       # exact
    return out


class FixedStatistics(PositionalApply, torch.autograd.Function):
    r"""``y = (x - mean) * gamma / sqrt(var + eps) + beta`` per channel, with ``mean`` and
    ``var`` given (the running statistics: BN and IN in eval mode), and the backward of the
    module docstring.

    ``FixedStatistics.apply(x, mean, var, weight, bias, lay, eps)``, ``mean`` and ``var``
    of ``lay.affine_view_shape``, returns ``(y, r)``; only ``y`` is differentiable."""

    generate_vmap_rule = True   # torch.func.vmap batches forward and backward as they are

    @staticmethod
    def forward(x, mean, var, weight, bias, lay: Layout, eps: float):
        *terms, r = _terms(x, mean, var, lay, eps, weight, bias)
        return _forward(x, mean, terms, lay).to(x.dtype), r

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
        shape = ctx.lay.affine_view_shape
        cdt = compute_dtype(x.dtype)
        s = r if weight is None else r * weight.double().reshape(shape)    # gamma r, float64
        if torch.is_grad_enabled() or not writes_in_place():
            # a second derivative, or torch.func: differentiable, out of place
            dims = tuple(d for d in range(x.dim()) if d != 1)
            rw = r.to(cdt) if weight is None else r.to(cdt) * weight.to(cdt).reshape(shape)
            dx = (g.to(cdt) * rw).to(x.dtype) if need_x else None
            dw = ((g.to(cdt) * (x.to(cdt) - mean.to(cdt))).sum(dims) * r.to(cdt).flatten()
                  ).to(weight.dtype) if need_w else None
            db = g.to(cdt).sum(dims).to(ctx.bias_dtype) if need_b else None
            return dx, None, None, dw, db, None, None
        fmt = torch.channels_last if _channel_inner(x) and x.dim() == 4 else (
            torch.channels_last_3d if _channel_inner(x) and x.dim() == 5
            else torch.contiguous_format)
        gv = g.to(cdt).contiguous(memory_format=fmt)      # g in x's memory format
        if fmt != torch.contiguous_format and loops.takes(x):
            return _backward_loops(ctx, gv, x, mean, r, s, need_x, need_w, need_b, fmt)
        buf = torch.empty_like(x, dtype=cdt, memory_format=fmt) if need_x or need_w else None
        dw = db = None
        # not under torch.compile: there the float64 view of buf's memory gave a wrong dgamma
        # (tests/test_compile.py, inductor, BN and IN in eval mode)
        if need_w and cdt == torch.float32 and x.shape[0] >= 4 and x.numel() % 2 == 0 \
                and not _channel_inner(x) and not torch.compiler.is_compiling():
            dw = (_exact_dots(x, mean, gv, buf) * r.flatten()).to(weight.dtype)
        elif need_w:
            torch.sub(x.to(cdt), mean.to(cdt), out=buf).mul_(gv)               # g (x - mu)
            dw = (channel_sums(buf) * r.flatten()).to(weight.dtype)
        if need_b:
            db = channel_sums(gv).to(ctx.bias_dtype)
        dx = None
        if need_x:
            dx = torch.mul(gv, s.to(cdt), out=buf).to(x.dtype)                  # g gamma r
        return dx, None, None, dw, db, None, None


def _backward_loops(ctx, gv, x, mean, r, s, need_x: bool, need_w: bool, need_b: bool, fmt):
    """The backward on ``channels_last`` memory in one compiled pass over x and g
    (:func:`normcore.positions.backward_fixed`): dx in float64 rounded once, the sums in
    float64."""
    C = x.shape[1]
    dx = torch.empty_like(x, memory_format=fmt)
    x3 = x.movedim(1, -1).reshape(1, -1, C)         # a copy if x is not channels_last itself
    sums = positions.backward_fixed(positions.as_positions(gv.to(x.dtype), 1), x3.contiguous(),
                                    mean.double().reshape(C), s.reshape(C),
                                    positions.as_positions(dx, 1))
    dw = (sums[0] * r.flatten()).to(ctx.saved_tensors[3].dtype) if need_w else None
    db = sums[1].to(ctx.bias_dtype) if need_b else None
    return dx if need_x else None, None, None, dw, db, None, None
