r"""LayerNorm and RMSNorm over their rows, a cache-sized block of rows at a time; GroupNorm
and InstanceNorm with nothing full-size kept for the backward.

When :math:`\gamma, \beta` vary along every dim of the set :math:`S` (LayerNorm, RMSNorm:
gamma has ``normalized_shape``) and :math:`S` is the input's trailing dims, the view
``(sets, |S|)`` has one set per row, and rows are independent: the formula of
:mod:`normcore.core` and the boxed gradient of :mod:`normcore.grad` can run on a few rows at
a time.  Nothing changes in the arithmetic (each row is summed by the same reductions, in
the same order); what changes is where the data is while the passes run.

Why: in eager PyTorch every step is one pass over its tensors, and the formula takes about
five passes forward and ten backward, where torch's fused kernels take one or two.  On a
tensor larger than the cache each pass goes to main memory, and every fresh full-size
temporary costs page faults as it is first written.  On a block of about
:data:`BLOCK_ELEMENTS` elements (2 MB in float32) the repeated passes hit the cache:
the input is read from memory once, the output written once, and the only full-size
tensors are the output (forward) and the input's gradient (backward), as for torch's
kernels.  The backward recomputes :math:`\hat x` from the saved input, block by block,
instead of keeping a full-size :math:`\hat x` from the forward.

Forward, per block of rows: :math:`\mu` (a row sum), :math:`x-\mu` written into the
output's rows, :math:`\sigma^2` (the squared norm of each centered row, two-pass as in
:func:`normcore.core.moments`), then :math:`\hat x\,\gamma + \beta` in place.

Backward, per block: :math:`\hat x` into a block temporary, :math:`P = g\,\hat x`, then the
four sums: :math:`\partial L/\partial\gamma \mathrel{+}= \sum_{\text{rows}} P`,
:math:`\partial L/\partial\beta \mathrel{+}= \sum_{\text{rows}} g`, and per row
:math:`\sum_S d\,\hat x = P\gamma` and :math:`\sum_S d = g\gamma` (matrix-vector products),
and finally the boxed formula written into the gradient's rows:

.. math::

    \frac{\partial L}{\partial x} = r\Big(g\gamma - \frac{\sum_S d}{n}
        - \hat x\,\frac{\sum_S d\hat x}{n}\Big).

GroupNorm and InstanceNorm (:func:`forward_groups`, :func:`backward_groups`) take the plain
path's steps, but where it keeps a full-size :math:`x-\mu` for the backward (a second fresh
tensor beside the output), the backward here recomputes it from x into the gradient's own
buffer: two more passes, one fresh tensor fewer per step (measured: GN at (32, 64, 32, 32)
forward and backward 2.7-3.2x torch's time before, 2.2-2.4x after, on one thread).
"""
from __future__ import annotations

import math

import torch

from .axes import Layout
from .core import (affine_terms, apply_affine_terms, compute_dtype, inverse_std,
                   sum_of_squares, writes_in_place)

__all__ = ["BLOCK_ELEMENTS", "MIN_ELEMENTS", "applies", "forward", "backward",
           "forward_function", "backward_function"]

#: elements per block and thread: 2 MB in float32, so that a block of x, of the output and a
#: temporary stay in cache (measured at (8192, 512): blocks of 256, 1024, 4096 and 8192 rows
#: took 11.8, 10.3, 13.3 and 21.7 ms for forward and backward, on one thread)
BLOCK_ELEMENTS = 1 << 19
#: below this size the whole tensor is one block and the per-block Python steps cost more
#: than they save: the plain path of :class:`normcore.grad.Normalize` runs instead
MIN_ELEMENTS = 1 << 20


def applies(lay: Layout, x: torch.Tensor) -> bool:
    """True when ``x`` is contiguous and large enough and either ``lay``'s sets are the rows
    of the ``(sets, |S|)`` view with gamma along all of :math:`S` (LayerNorm, RMSNorm: by
    blocks of rows), or the norm is GroupNorm or InstanceNorm with positions
    (:func:`forward_groups`)."""
    # not under torch.func, torch.export or jit.trace (they refuse out=), nor torch.compile
    # (which fuses the plain path's passes itself)
    if torch.compiler.is_compiling() or not writes_in_place():
        return False
    if x.numel() < MIN_ELEMENTS or not x.is_contiguous():
        return False
    if lay.norm in ("group", "instance"):
        return x.dim() >= 3
    nd, k = len(lay.view_shape), len(lay.reduce_dims)
    return (lay.norm in ("layer", "rms") and lay.reduce_dims == tuple(range(nd - k, nd))
            and lay.num_sets > 1
            and tuple(lay.affine_view_shape[nd - k:]) == tuple(lay.view_shape[nd - k:]))


def _blocks(rows: int, row_size: int):
    """``(start, stop)`` of each block of rows: :data:`BLOCK_ELEMENTS` per thread, so that
    each op of a block still splits across torch's threads, and there are no more blocks
    (every op a parallel region, and on a loaded machine each costs a wait for a thread)."""
    step = max(1, BLOCK_ELEMENTS * torch.get_num_threads() // max(row_size, 1))
    return [(s, min(s + step, rows)) for s in range(0, rows, step)]


def forward(x: torch.Tensor, lay: Layout, eps: float, weight, bias):
    """``(y, mean, var, inv_std)``: ``y`` a fresh tensor of ``lay.shape`` in the compute
    dtype, the statistics of shape ``lay.stat_shape`` (``mean`` zeros when uncentered).

    Every step writes into a buffer made before the loop (``out=``): small temporaries
    made between the large allocations fragment the heap, and the next call's output then
    comes from fresh pages (page faults cost more than the whole computation)."""
    cdt = compute_dtype(x.dtype)
    n, sets = lay.set_size, lay.num_sets
    stats = torch.zeros(4, sets, 1, dtype=cdt, device=x.device)
    mean, var, inv, delta = stats[0], stats[1], stats[2], stats[3]
    w = None if weight is None else weight.to(cdt).reshape(1, n)
    b = None if bias is None else bias.to(cdt).reshape(1, n)
    x2 = x.reshape(sets, n)
    y = torch.empty(lay.shape, dtype=cdt, device=x.device)
    y2 = y.view(sets, n)
    for s, e in _blocks(sets, n):
        xb, yb, v, r = x2[s:e].to(cdt), y2[s:e], var[s:e], inv[s:e]
        if lay.centered:
            mu = torch.sum(xb, 1, keepdim=True, out=mean[s:e]).div_(n)          # mu
            c = torch.sub(xb, mu, out=yb)                                        # x - mu
            _correct_mean(c, mu, delta[s:e], n)
        else:
            c = xb                                                               # RMSNorm
        # RMSNorm: chunks of 64 in float64 (its dx was 1.04x torch's error); LN needs none
        v64 = sum_of_squares(c, precise=not lay.centered).view(-1, 1).double() / n
        v.copy_(v64)                                                             # sigma^2
        r.copy_(inverse_std(v64, eps))                                           # r
        torch.mul(c, r, out=yb)                                                  # x_hat
        if w is not None and b is not None:
            torch.addcmul(b, yb, w, out=yb)                                      # gamma x_hat + beta
        elif w is not None:
            yb.mul_(w)
        elif b is not None:
            yb.add_(b)
    shape = lay.stat_shape
    return y, mean.reshape(shape), var.reshape(shape), inv.reshape(shape)


def _correct_mean(c: torch.Tensor, mu: torch.Tensor, delta: torch.Tensor, n: int) -> None:
    """In place, on ``c = x - mu`` (one set per row of ``c``'s ``(sets, -1)`` view): the
    mean of ``c`` (the rounding error of ``mu``, :func:`normcore.core.moments`) into
    ``delta``, then subtracted from ``c`` and added to ``mu``."""
    rows2 = c.view(delta.shape[0], -1)
    torch.sum(rows2, 1, keepdim=True, out=delta).div_(n)
    rows2.sub_(delta)
    mu.add_(delta.view(mu.shape))


def _centered(x: torch.Tensor, out: torch.Tensor, lead: int, n: int) -> torch.Tensor:
    """``x - mu`` into ``out``, one set per index of the ``lead`` leading dims, with mu
    recomputed from x and corrected as the forward corrects it (the saved mean, rounded
    once more, would shift every x_hat by a rounding of ``|mu| / sigma``)."""
    mu = x.sum(tuple(range(lead, x.dim())), keepdim=True).div_(n)
    c = torch.sub(x, mu, out=out)
    _correct_mean(c, mu, torch.empty(math.prod(x.shape[:lead]), 1, dtype=mu.dtype,
                                     device=mu.device), n)
    return c


def backward(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor,
             weight, lay: Layout, need_x: bool, need_w: bool, need_b: bool,
             x_dtype: torch.dtype, bias_dtype: torch.dtype | None):
    """``(dL/dx, dL/dgamma, dL/dbeta)`` in the dtypes of x, gamma and beta (None where not
    needed), block by block from the saved input and statistics; every step writes into a
    buffer made before the loop, as in :func:`forward`."""
    n, sets = lay.set_size, lay.num_sets
    cdt = inv_std.dtype
    steps = _blocks(sets, n)
    w = None if weight is None else weight.to(cdt).reshape(n)
    mu, r2 = mean.reshape(sets, 1), inv_std.reshape(sets, 1)
    sums = torch.empty(2, sets, 1, dtype=cdt, device=g.device)        # per row, per block
    acc = torch.float64 if cdt == torch.float32 else cdt               # gamma, beta sums
    parts = torch.zeros(2, len(steps), n, dtype=acc, device=g.device)
    tmp = torch.empty(2, min(steps[0][1], sets), n, dtype=cdt, device=g.device)
    x2, g2 = x.reshape(sets, n), g.reshape(sets, n).to(cdt)
    dx = torch.empty(lay.shape, dtype=cdt, device=g.device) if need_x else None
    for k, (s, e) in enumerate(steps):
        gb, rb = g2[s:e], r2[s:e]
        xhat, prod = tmp[0, :e - s], tmp[1, :e - s]
        if lay.centered:
            _centered(x2[s:e].to(cdt), xhat, 1, n).mul_(rb)                 # x_hat
        else:
            torch.mul(x2[s:e].to(cdt), rb, out=xhat)
        torch.mul(gb, xhat, out=prod)                                   # g x_hat
        if need_w:
            _column_sums(prod, parts[0, k])                             # dL/dgamma, these rows
        if need_b:
            _column_sums(gb, parts[1, k])                               # dL/dbeta, these rows
        if not need_x:
            continue
        # per row, with d = gamma g: -sum_S(d x_hat) / n and -sum_S(d) / n
        sdx, sd = sums[0, s:e], sums[1, s:e]
        if w is None:
            torch.sum(prod, 1, keepdim=True, out=sdx)
        else:
            torch.mv(prod, w, out=sdx.view(-1))
        out = dx.view(sets, n)[s:e]
        if lay.centered:
            torch.mul(xhat, sdx.mul_(-1.0 / n), out=out)                # - x_hat sum(d x_hat) / n
        else:   # x_hat = x r: the factor on x itself, one rounding fewer
            torch.mul(x2[s:e].to(cdt), sdx.mul_(rb).mul_(-1.0 / n), out=out)
        if lay.centered:
            if w is None:
                torch.sum(gb, 1, keepdim=True, out=sd)
            else:
                torch.mv(gb, w, out=sd.view(-1))
            out.add_(sd.mul_(-1.0 / n))                                 # - sum(d) / n
        if w is None:
            out.add_(gb)                                                # + d
        else:
            out.addcmul_(gb, w)
        out.mul_(rb)                                                    # times r
    shape = lay.affine_shape
    return (None if dx is None else dx.to(x_dtype),
            parts[0].sum(0).reshape(shape).to(weight.dtype) if need_w else None,
            parts[1].sum(0).reshape(shape).to(bias_dtype) if need_b else None)


def _column_sums(t: torch.Tensor, out: torch.Tensor) -> None:
    """The sums of the columns of ``t`` into ``out`` (float64 for float32 ``t``): by 32 rows
    in float32, then in ``out``'s dtype (measured at (1024, 512): a float32 sum down 1024 rows
    was 2.3 roundings of the largest sum, by 32 rows 0.7, for 1.5x its time; a float64 sum
    down the whole column, 6x)."""
    rows = t.shape[0]
    if out.dtype != t.dtype and rows % 32 == 0 and rows > 32:
        t = t.view(rows // 32, 32, -1).sum(1)
    torch.sum(t, 0, dtype=out.dtype, out=out)


# ---------------------------------------------------------------------------------------
# GroupNorm and InstanceNorm: nothing full-size kept, x - mu recomputed in the backward
# ---------------------------------------------------------------------------------------
def _group_view(lay: Layout):
    """``(N, G, C/G, P)`` with ``P`` the number of positions: GN's view with the positions
    flattened, and IN's as GN with one channel per group."""
    N, G = lay.view_shape[0], lay.view_shape[1]
    P = lay.set_size * G // lay.shape[1] if lay.norm == "group" else lay.set_size
    return N, G, lay.shape[1] // G, P


def forward_groups(x: torch.Tensor, lay: Layout, eps: float, weight, bias):
    r"""GN, IN: the plain path's steps (a row sum, x - mu into the output, the squared
    norm of each centered set, then the output in place, in the two forms of
    :func:`normcore.core.affine_terms`); the
    backward gets x, mu and r, not the full-size x - mu the plain path keeps, so that the
    output is the only full-size tensor made (each fresh one costs its page faults)."""
    cdt = compute_dtype(x.dtype)
    N, G, Cg, P = _group_view(lay)
    stats = torch.empty(4, N * G, 1, dtype=cdt, device=x.device)
    mean, var, inv = stats[0], stats[1], stats[2]
    xv = x.reshape(N, G, Cg, P).to(cdt)
    y = torch.empty(lay.shape, dtype=cdt, device=x.device)
    yv = y.view(N, G, Cg, P)
    torch.sum(xv.reshape(N * G, -1), 1, keepdim=True, out=mean).div_(lay.set_size)      # mu
    torch.sub(xv, mean.view(N, G, 1, 1), out=yv)                                    # x - mu~
    # the rounding error of mu~ (normcore.core.moments), not subtracted from x - mu~ (a
    # second rounding of each value): sum (x - mu)^2 = sum (x - mu~)^2 - n delta^2, and
    # -delta (gamma r) goes into the shift of the output
    delta = torch.sum(yv.view(N * G, -1), 1, keepdim=True, out=stats[3]).div_(lay.set_size)
    # short sets (IN of 32 x 32) summed in float64: one rounding of each output with the split of
    # normcore.core.affine_terms needs the variance to a fraction of a rounding
    sq = sum_of_squares(yv.view(N * G, -1), precise=True, exact=lay.set_size <= 1024)
    var64 = sq.view(-1, 1) / lay.set_size
    var64 = var64 - delta.double().square()
    var.copy_(var64)                                                                # sigma^2
    inv.copy_(inverse_std(var64, eps))                                              # r
    st = [t.view(N, G, 1, 1) for t in (mean, delta, var64)]
    terms = affine_terms(*st, eps, (1, G, Cg, 1), weight, bias, uncorrected=True)
    apply_affine_terms(xv, yv, terms, out=yv)                                       # y
    mean.add_(delta)                                                                # mu
    shape = lay.stat_shape
    return y, mean.reshape(shape), var.reshape(shape), inv.reshape(shape)


def backward_groups(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                    inv_std: torch.Tensor, weight, lay: Layout, need_x: bool, need_w: bool,
                    need_b: bool, x_dtype: torch.dtype, bias_dtype: torch.dtype | None):
    r"""GN, IN: the boxed formula with gamma constant over the positions (module docstring of
    :mod:`normcore.grad`), x - mu recomputed into the gradient's own buffer: once for
    :math:`\sum g\,(x-\mu)` per channel, once for the gradient.  Returns the three
    gradients in the dtypes of x, gamma and beta (None where not needed)."""
    cdt = inv_std.dtype
    N, G, Cg, P = _group_view(lay)
    n = lay.set_size
    mu, r = mean.reshape(N, G, 1, 1), inv_std.reshape(N, G, 1, 1)
    w = None if weight is None else weight.to(cdt).view(1, G, Cg, 1)
    sums = torch.empty(2, N, G, Cg, 1, dtype=cdt, device=g.device)
    xv, gv = x.reshape(N, G, Cg, P).to(cdt), g.reshape(N, G, Cg, P).to(cdt)
    torch.sum(gv.reshape(-1, P), 1, keepdim=True, out=sums[0].view(-1, 1))         # sum_P g
    sum_g, sum_gxhat = sums[0], sums[1]
    dx = None
    if need_x or need_w:
        dx = torch.empty(lay.shape, dtype=cdt, device=g.device)
        out = dx.view(N, G, Cg, P)
        _centered(xv, out, 2, n).mul_(gv)                                              # g (x - mu)
        torch.sum(out.view(-1, P), 1, keepdim=True, out=sum_gxhat.view(-1, 1))
        sum_gxhat.mul_(r)                                                           # sum_P g x_hat
    if need_x:
        # per group, with d = gamma g: sum_S d and sum_S d x_hat, then
        # dL/dx = g (gamma r) + (x - mu) (-r^2 sum_S(d x_hat) / n) - r sum_S(d) / n
        d, dxh = (sum_g, sum_gxhat) if w is None else (sum_g * w, sum_gxhat * w)
        slope = dxh.sum(2, keepdim=True).mul_(r * r * (-1.0 / n))
        shift = d.sum(2, keepdim=True).mul_(r * (-1.0 / n))
        _centered(xv, out, 2, n).mul_(slope).add_(shift)
        out.addcmul_(gv, r if w is None else r * w)
    shape = lay.affine_shape
    return (dx.to(x_dtype) if need_x else None,
            sum_gxhat.sum(0).reshape(shape).to(weight.dtype) if need_w else None,
            sum_g.sum(0).reshape(shape).to(bias_dtype) if need_b else None)


# ---------------------------------------------------------------------------------------
# normcore.grad.Normalize's forward and backward when :func:`applies`
# ---------------------------------------------------------------------------------------
def forward_function(x, weight, bias, lay: Layout, eps: float):
    """:func:`forward` (or :func:`forward_groups`) inside ``Normalize.forward``:
    ``(y, mean, var, inv_std)``, ``y`` in the input's dtype.  ``Normalize.setup_context``
    saves the mean where the plain path keeps x - mu or x_hat, and marks it with
    ``ctx.kept_is_xhat = None``."""
    run = forward_groups if lay.norm in ("group", "instance") else forward
    y, mean, var, inv_std = run(x, lay, eps, weight, bias)
    return y.to(x.dtype), mean, var, inv_std


def backward_function(ctx, grad_y, mean, inv_std, weight, x):
    """:func:`backward` inside ``Normalize.backward``: its five gradients."""
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    has_b = ctx.bias_dtype is not None
    run = backward_groups if ctx.lay.norm in ("group", "instance") else backward
    grads = run(grad_y, x, mean, inv_std, weight, ctx.lay, need_x,
                     need_w and weight is not None, need_b and has_b, ctx.x_dtype, ctx.bias_dtype)
    return grads + (None, None)
