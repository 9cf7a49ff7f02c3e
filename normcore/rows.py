r"""LayerNorm and RMSNorm over their rows, a cache-sized block of rows at a time; which
inputs take the fast paths (:func:`applies`), here or in :mod:`normcore.groups`.

When :math:`\gamma, \beta` vary along every dim of the set :math:`S` (LayerNorm, RMSNorm:
gamma has ``normalized_shape``) and :math:`S` is the input's trailing dims, the view
``(sets, |S|)`` has one set per row, and rows are independent: the formula of
:mod:`normcore.core` and the boxed gradient of :mod:`normcore.grad` run on a few rows at a
time.  Why: in eager PyTorch every step is one pass over its tensors (about five forward and
ten backward, where torch's fused kernels take one or two); on a tensor larger than the cache
each pass goes to main memory, and every fresh full-size temporary costs page faults.  On a
block of :data:`BLOCK_ELEMENTS` elements (2 MB in float32) the passes hit the cache, and the
only full-size tensors are the output and the input's gradient, as for torch's kernels (the
backward recomputes :math:`\hat x` from the saved input, block by block).

When numba is installed (``normcore[fast]``), a float32 or float64 LayerNorm or RMSNorm on
the CPU goes to :mod:`normcore.loops` instead: the formula as loops over each row, compiled,
reading x once (at (32, 256, 512), one thread: forward 1.3-1.6x torch's time where these
blocks take 2.3-2.6x, forward and backward 1.3x where they take 2.3x).  The blocks below are
the path without numba, on other devices, and for half-precision inputs.

Why not one compiled loop per row by ``torch.compile`` of the formula, called from here: it
was measured at (32, 256, 512), one thread, and not taken.  In float32, inductor's C++ has
no fused multiply-add, and y's error was 1.05-1.33x torch's on 4 of seeds 0-4 of
``tests/test_accuracy.py``; with y formed in float64 and rounded once it was no worse on
all five, but the forward took 1.8-1.9x torch's time in the kernel alone (three passes over
x, as the blocks) and 2.1-2.2x through ``F.layer_norm`` (the blocks, that hour: 2.4x), and
forward and backward 2.4-2.6x (the blocks: 2.3x; inductor's own sums down 8192 rows for
dgamma took 4.4 ms, so g x-hat was written and summed eagerly); the first call in each
process compiled for 2.5-6 s, and under ``ATEN_CPU_CAPABILITY=default`` this graph's C++ did
not compile.

Forward, two sweeps: the sums :math:`\sum x` and :math:`\sum x^2` of each row, over the
whole input at once (without a fused multiply-add, by float32 chunks then in float64 as far as
:math:`r`, rounded once), then, with every row's :math:`r` found, block by block
:math:`\hat x = x\,r + (-\mu r)` (one fused multiply-add,
:func:`normcore.passes.row_affine`) and :math:`\hat x\,\gamma + \beta` written into the
output's rows.  :math:`\sigma^2 = \overline{x^2} - \mu^2` only when every
set's mean is at most half its spread (:func:`_one_pass`: cancellation then costs at most a
quarter of a rounding); otherwise the corrected two-pass algorithm of
:func:`normcore.core.moments`, whose rounded mean ``mu0`` and correction ``delta`` are kept
for the backward (:func:`_shifts`).  RMSNorm's sums of squares by chunks of 64 in float64.

Backward, per block: :math:`\hat x` into a block temporary, :math:`P = g\,\hat x`, then the
four sums: :math:`\partial L/\partial\gamma \mathrel{+}= \sum_{\text{rows}} P`,
:math:`\partial L/\partial\beta \mathrel{+}= \sum_{\text{rows}} g`, and per row
:math:`\sum_S d\,\hat x = P\gamma` and :math:`\sum_S d = g\gamma` (matrix-vector products),
and finally the boxed formula written into the gradient's rows:

.. math::

    \frac{\partial L}{\partial x} = r\Big(g\gamma - \frac{\sum_S d}{n}
        - \hat x\,\frac{\sum_S d\hat x}{n}\Big).

GroupNorm, InstanceNorm, and BatchNorm on ``channels_last`` memory are in
:mod:`normcore.groups`, with the two functions ``Normalize`` calls when :func:`applies`.
"""
from __future__ import annotations

import torch

from . import loops
from .axes import Layout
from .core import FUSED_MULTIPLY_ADD, compute_dtype, inverse_std, writes_in_place
from .passes import column_sums, row_affine, row_sums, sum_of_squares

__all__ = ["BLOCK_ELEMENTS", "MIN_ELEMENTS", "applies", "forward", "backward"]

#: elements per block and thread: 2 MB in float32, so that a block of x, of the output and a
#: temporary stay in cache (measured at (8192, 512): blocks of 256, 1024, 4096 and 8192 rows
#: took 11.8, 10.3, 13.3 and 21.7 ms for forward and backward, on one thread)
BLOCK_ELEMENTS = 1 << 19
#: the norms that :func:`forward_groups` computes (BN on ``channels_last`` memory only)
GROUP_NORMS = ("group", "instance", "batch")
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
    if x.numel() < MIN_ELEMENTS:
        return False
    if lay.norm in ("group", "instance"):          # channels_last: on its own memory
        return x.dim() >= 3 and (x.is_contiguous() or _channels_last(x))
    if lay.norm == "batch":                        # BN: on channels_last memory only
        return _channels_last(x) and not x.is_contiguous()
    if not x.is_contiguous():
        return False
    nd, k = len(lay.view_shape), len(lay.reduce_dims)
    return (lay.norm in ("layer", "rms") and lay.reduce_dims == tuple(range(nd - k, nd))
            and lay.num_sets > 1
            and tuple(lay.affine_view_shape[nd - k:]) == tuple(lay.view_shape[nd - k:]))


def _channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is ``channels_last`` (4-d) or ``channels_last_3d`` (5-d) memory."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return fmt is not None and x.is_contiguous(memory_format=fmt)


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """``x``'s memory format: contiguous, or ``channels_last`` (3d) when it is that."""
    if x.is_contiguous() or not _channels_last(x):
        return torch.contiguous_format
    return torch.channels_last if x.dim() == 4 else torch.channels_last_3d


def _blocks(rows: int, row_size: int):
    """``(start, stop)`` of each block of rows: :data:`BLOCK_ELEMENTS` per thread, so that each
    op still splits across torch's threads, and no more blocks (each op waits for a thread)."""
    step = max(1, BLOCK_ELEMENTS * torch.get_num_threads() // max(row_size, 1))
    return [(s, min(s + step, rows)) for s in range(0, rows, step)]


def forward(x: torch.Tensor, lay: Layout, eps: float, weight, bias):
    r"""``(y, mean, var, inv_std, kept)``: ``y`` a fresh tensor of ``lay.shape`` in the compute
    dtype, the statistics of shape ``lay.stat_shape`` (``mean`` zeros when uncentered), and
    ``kept`` = ``(mu0, delta)`` for the backward (:func:`_shifts`).  Two sweeps: the sums
    (:math:`\sum x`, :math:`\sum x^2`; by blocks only for a half-precision x, made float32 a
    block at a time), then, with every set's ``r`` found at once, by blocks
    :math:`\hat x\,\gamma + \beta` written into the output.  When some set's mean
    is large beside its spread (:func:`_one_pass`), the second sweep is the two-pass one
    instead (:func:`_two_pass_block`).  Every step writes into a buffer made before the loop
    (``out=``): small temporaries between large allocations fragment the heap (page faults)."""
    if loops.takes(x):
        return _forward_loops(x, lay, eps, weight, bias)
    cdt = compute_dtype(x.dtype)
    n, sets = lay.set_size, lay.num_sets
    stats = torch.zeros(5, sets, 1, dtype=cdt, device=x.device)
    mu0, delta, var, inv = stats[0], stats[1], stats[2], stats[3]
    w = None if weight is None else weight.to(cdt).reshape(1, n)
    b = None if bias is None else bias.to(cdt).reshape(1, n)
    x2 = x.reshape(sets, n)
    y = torch.empty(lay.shape, dtype=cdt, device=x.device)
    y2 = y.view(sets, n)
    blocks = _blocks(sets, n)
    # Without a fused multiply-add (the generic kernels) the sums are float64 as far as r: in
    # float32, LN's y was 1.19x torch's error there; with it they are as good in float32 (y
    # 0.74-0.95x torch's) and 0.45 ms faster at (32, 256, 512)
    wide = lay.centered and not FUSED_MULTIPLY_ADD
    sums = torch.empty(2, sets, 1, dtype=torch.float64 if wide else cdt, device=x.device)
    # the sums in one go when x is in the compute dtype: no temporary is full-size, and by
    # blocks they took 1.5 ms in place of 0.9 (at (32, 256, 512), the ops' own overhead)
    for s, e in blocks if x.dtype != cdt else [(0, sets)]:                       # the sums
        xb = x2[s:e].to(cdt)
        if lay.centered:
            sums[0, s:e].copy_(row_sums(xb) if wide else xb.sum(1, keepdim=True))
            sums[1, s:e].copy_(sum_of_squares(xb, double=wide).view(-1, 1))
        else:   # RMSNorm: chunks of 64 in float64, r from them (its dx was 1.04x torch's error)
            v64 = sum_of_squares(xb, precise=True).view(-1, 1).double() / n
            var[s:e].copy_(v64)
            inv[s:e].copy_(inverse_std(v64, eps))                                # r
    one_pass = True
    if lay.centered:
        mu, mean_square = sums[0].div_(n), sums[1].div_(n)
        one_pass = _one_pass(mu, mean_square)                                    # sigma^2
        mu0.copy_(mu)
        if one_pass:
            var.copy_(mean_square)
            inv.copy_(inverse_std(mean_square, eps))                             # r
            shift = _shift(mu0, inv)                                             # -mu0 r
    for s, e in blocks:
        xb, yb, r = x2[s:e].to(cdt), y2[s:e], inv[s:e]
        if not one_pass:
            _two_pass_block(xb, yb, mu0[s:e], delta[s:e], var[s:e], r, eps)
        elif lay.centered:
            row_affine(xb, r, shift[s:e], out=yb)                                # x_hat
        else:
            torch.mul(xb, r, out=yb)                                             # x_hat
        if w is not None and b is not None:
            torch.addcmul(b, yb, w, out=yb)                                  # gamma x_hat + beta
        elif w is not None:
            yb.mul_(w)
        elif b is not None:
            yb.add_(b)
    shape = lay.stat_shape
    mean = torch.add(mu0, delta, out=stats[4]).reshape(shape)                   # mu0 + delta
    return y, mean, var.reshape(shape), inv.reshape(shape), stats[:2]


def _forward_loops(x: torch.Tensor, lay: Layout, eps: float, weight, bias):
    """:func:`forward` by :func:`normcore.loops.forward`: the same results, to a rounding."""
    n, sets = lay.set_size, lay.num_sets
    y = torch.empty(lay.shape, dtype=x.dtype)
    stats = loops.forward(x.reshape(sets, n), eps, lay.centered, weight, bias, y.view(sets, n))
    return (y, *_loop_statistics(stats, x.dtype, lay.stat_shape))


def _loop_statistics(stats: torch.Tensor, dtype: torch.dtype, shape):
    """``(mean, var, inv_std, kept)`` from the float64 ``(3, sets)`` mean, variance and r of
    :mod:`normcore.loops`: ``kept`` the mean as ``mu0`` (rounded) and ``delta`` (the rest),
    as the blocks keep it (:func:`_shifts`)."""
    mu, var, r = stats
    mu0 = mu.to(dtype)
    kept = torch.stack([mu0, (mu - mu0.double()).to(dtype)]).view(2, -1, 1)
    return mu0.reshape(shape), var.to(dtype).reshape(shape), r.to(dtype).reshape(shape), kept


def _backward_loops(g, x, kept, inv_std, weight, lay: Layout, need_x: bool, need_w: bool,
                    need_b: bool, bias_dtype):
    """:func:`backward` by :func:`normcore.loops.backward`: from the mean the forward kept
    (``mu0 + delta`` in float64) and its ``r``."""
    n, sets = lay.set_size, lay.num_sets
    g2 = g.reshape(sets, n).to(x.dtype).contiguous()
    dx = torch.empty(lay.shape, dtype=x.dtype)
    sums = loops.backward(g2, x.reshape(sets, n), weight, _kept_mean(kept), inv_std.double(),
                          lay.centered, dx.view(sets, n))
    return _loop_gradients(dx, sums, lay, weight, bias_dtype, need_x, need_w, need_b)


def _kept_mean(kept: torch.Tensor) -> torch.Tensor:
    """The forward's mean in float64, ``mu0 + delta`` (:func:`_shifts`)."""
    mu0, delta = _shifts(kept)
    return mu0.double() + delta.double()


def _loop_gradients(dx, sums, lay: Layout, weight, bias_dtype, need_x: bool, need_w: bool,
                    need_b: bool):
    """``(dL/dx, dL/dgamma, dL/dbeta)`` from a compiled backward's ``dx`` and its float64
    ``(2, C)`` sums, in the dtypes of gamma and beta (None where not needed)."""
    shape = lay.affine_shape
    return (dx if need_x else None,
            sums[0].reshape(shape).to(weight.dtype) if need_w else None,
            sums[1].reshape(shape).to(bias_dtype) if need_b else None)


def _two_pass_block(xb, yb, mu0, delta, var, r, eps: float) -> None:
    r""":math:`\hat x` of a block of rows into ``yb`` by the corrected two-pass algorithm
    (:func:`_variance`), for large means; the statistics into ``delta``, ``var`` and ``r``."""
    n = xb.shape[1]
    c = torch.sub(xb, mu0, out=yb)                                               # x - mu0
    d64 = row_sums(c) / n                                                       # delta
    v64 = sum_of_squares(c, double=True).view(-1, 1) / n - d64 * d64            # sigma^2
    d = delta.copy_(d64)
    var.copy_(v64)
    r.copy_(inverse_std(v64, eps))                                               # r
    _xhat(xb, c, mu0, d, r, centered=True)                                       # x_hat


def _xhat(xb, out, mu0, delta, r, centered: bool) -> None:
    r""":math:`\hat x` of a block of rows into ``out``, each row in the form that rounds less:
    where :math:`|\mu|\,r \le 2`, :math:`x\,r + (-\mu r)` fused (the shift, rounded once, is
    at most 2 where the largest :math:`|\hat x|` are 3-5); elsewhere, a large mean,
    :math:`(x - \mu_0)\,r + (-\delta r)`, whose :math:`x - \mu_0` is exact or nearly so.
    :math:`\mu = \mu_0 + \delta` from the kept float32 values, as the backward recomputes it.
    ``centered``: ``out`` holds :math:`x - \mu_0` already.  The forward's two-pass sweep and
    the backward after it; from :math:`(x - \mu)\,r` alone LN's y was 1.09x torch's error
    (AVX-512, seed 4 of ``benchmarks/accuracy.py``), with this 0.77x."""
    mu, rd = mu0.double() + delta.double(), r.double()
    near = (mu.abs() * rd).le(2.0)
    if bool(near.all()):
        row_affine(xb, r, _shift(mu, r), out=out)
        return
    shift = (torch.where(near, -mu, -delta.double()) * rd).to(r.dtype)
    if bool(near.any()):
        torch.sub(xb, torch.where(near, 0.0, mu0), out=out)                       # x or x - mu0
    elif not centered:
        torch.sub(xb, mu0, out=out)                                                # x - mu0
    row_affine(out, r, shift, out=out)


def _variance(sum_sq: torch.Tensor, delta: torch.Tensor, n: int) -> torch.Tensor:
    r"""In place, the sums of squares of ``c = x - mu0`` (mean ``delta``) made :math:`\sigma^2 =
    \frac1n\sum_S c^2 - \delta^2`, the variance of ``c - delta`` without forming it."""
    return sum_sq.div_(n).sub_(delta * delta)


def _one_pass(mu: torch.Tensor, mean_square: torch.Tensor) -> bool:
    r"""Whether every set's mean is small beside its spread, :math:`4\,\mu^2 \le
    \overline{x^2} - \mu^2` (:math:`|\mu| \le \sigma/2`): then :math:`\sigma^2 =
    \overline{x^2} - \mu^2` loses at most a quarter of a rounding to cancellation, and
    ``mean_square`` becomes the variance (in place).  Otherwise (a large mean) the caller
    takes the two passes (:func:`_variance`)."""
    square = mu * mu
    ok = bool(torch.le(square * 5.0, mean_square).all())
    if ok:
        mean_square.sub_(square)
    return ok


def _near_shift(mu0: torch.Tensor, delta: torch.Tensor, r: torch.Tensor):
    r""":math:`-\mu_0 r` per row, rounded once from float64, when the forward took the one pass
    (``delta`` 0 in every set, and :math:`|\mu_0|\,r \le 1/2`): then :math:`\hat x = x\,r +
    (-\mu_0 r)` fused is the forward's :math:`\hat x` bit for bit (in the backward's float64
    blocks of the generic kernels, the same formula unrounded).  None otherwise."""
    if bool(delta.any()) or bool((mu0 * r).abs().max() > 0.5):
        return None
    return _shift(mu0, r)


def _shift(mu: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    r""":math:`-\mu r` per row in float64, rounded once to ``r``'s dtype: the shift of
    :math:`\hat x = x\,r + (-\mu r)`, the same bits wherever the forward and the backward
    form it."""
    return (-mu.double() * r.double()).to(r.dtype)


def _shifts(kept: torch.Tensor):
    r"""``(mu0, delta)`` from what the forward kept: ``mu0`` the rounded mean the forward
    centered with, ``delta`` the mean of ``x - mu0`` (its rounding error).  The backward
    recomputes ``x - mu0`` from x, bit for bit the forward's, and takes ``delta`` into its
    small per-set factors (GN, IN) or into the shift of its x_hat (LN, :func:`_xhat`)."""
    return kept[0], kept[1]


def backward(g: torch.Tensor, x: torch.Tensor, kept: torch.Tensor, inv_std: torch.Tensor,
             weight, lay: Layout, need_x: bool, need_w: bool, need_b: bool,
             x_dtype: torch.dtype, bias_dtype: torch.dtype | None):
    """``(dL/dx, dL/dgamma, dL/dbeta)`` in the dtypes of x, gamma and beta (None where not
    needed), block by block from the saved input, ``kept`` (:func:`_shifts`) and ``r``;
    every step writes into a buffer made before the loop, as in :func:`forward`."""
    if loops.takes(x):
        return _backward_loops(g, x, kept, inv_std, weight, lay, need_x, need_w, need_b,
                               bias_dtype)
    n, sets = lay.set_size, lay.num_sets
    cdt = inv_std.dtype
    # without a fused multiply-add (the generic kernels) LN's blocks in float64, rounded once
    # into dx: in float32 its dx was 1.01x torch's error there (seed 4 of benchmarks/accuracy)
    bdt = torch.float64 if cdt == torch.float32 and lay.centered and not FUSED_MULTIPLY_ADD \
        else cdt
    steps = _blocks(sets, n)
    w = None if weight is None else weight.to(bdt).reshape(n)
    mu0, delta = (t.to(bdt) for t in _shifts(kept))
    r2 = inv_std.reshape(sets, 1).to(bdt)
    # every set's mean small beside its spread (the forward's one pass): x_hat = x r + (-mu0 r)
    # in one fused pass, as the forward made it; otherwise (x - mu) r in two or three
    shift = _near_shift(mu0, delta, r2) if lay.centered else None
    sums = torch.empty(2, sets, 1, dtype=bdt, device=g.device)        # per row, per block
    # RMSNorm: gamma sums in float64 (its dgamma was 1.1x torch's error); LN is well below
    acc = torch.float64 if cdt == torch.float32 and not lay.centered else bdt
    parts = torch.zeros(2, len(steps), n, dtype=acc, device=g.device)
    tmp = torch.empty(2 + (bdt != cdt), min(steps[0][1], sets), n, dtype=bdt, device=g.device)
    x2, g2 = x.reshape(sets, n), g.reshape(sets, n).to(cdt)
    dx = torch.empty(lay.shape, dtype=cdt, device=g.device) if need_x else None
    for k, (s, e) in enumerate(steps):
        gb, rb = g2[s:e].to(bdt), r2[s:e]
        xhat, prod = tmp[0, :e - s], tmp[1, :e - s]
        if shift is not None:
            row_affine(x2[s:e].to(bdt), rb, shift[s:e], out=xhat)       # x r - mu0 r
        elif lay.centered:                                              # as the forward
            _xhat(x2[s:e].to(bdt), xhat, mu0[s:e], delta[s:e], rb, centered=False)
        else:
            torch.mul(x2[s:e].to(bdt), rb, out=xhat)
        torch.mul(gb, xhat, out=prod)                                   # g x_hat
        if need_w:
            column_sums(prod, parts[0, k])                             # dL/dgamma, these rows
        if need_b:
            column_sums(gb, parts[1, k])                               # dL/dbeta, these rows
        if not need_x:
            continue
        # per row, with d = gamma g: -sum_S(d x_hat) / n and -sum_S(d) / n
        sdx, sd = sums[0, s:e], sums[1, s:e]
        if w is None:
            torch.sum(prod, 1, keepdim=True, out=sdx)
        else:
            torch.mv(prod, w, out=sdx.view(-1))
        out = dx.view(sets, n)[s:e] if bdt == cdt else tmp[2, :e - s]
        if lay.centered:
            if w is None:
                torch.sum(gb, 1, keepdim=True, out=sd)
            else:
                torch.mv(gb, w, out=sd.view(-1))
            # - x_hat sum(d x_hat) / n - sum(d) / n, one fused pass
            row_affine(xhat, sdx.mul_(-1.0 / n), sd.mul_(-1.0 / n), out=out)
        else:   # x_hat = x r: the factor on x itself, one rounding fewer
            torch.mul(x2[s:e].to(bdt), sdx.mul_(rb).mul_(-1.0 / n), out=out)
        if w is None:
            out.add_(gb)                                                # + d
        else:
            out.addcmul_(gb, w)
        out.mul_(rb)                                                    # times r
        if bdt != cdt:
            dx.view(sets, n)[s:e].copy_(out)                           # rounded once
    shape = lay.affine_shape
    return (None if dx is None else dx.to(x_dtype),
            parts[0].sum(0).reshape(shape).to(weight.dtype) if need_w else None,
            parts[1].sum(0).reshape(shape).to(bias_dtype) if need_b else None)
