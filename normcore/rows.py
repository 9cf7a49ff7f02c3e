r"""LayerNorm and RMSNorm over their rows, a cache-sized block of rows at a time; GroupNorm
and InstanceNorm with nothing full-size kept for the backward.

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

Forward, two sweeps over the blocks: the sums :math:`\sum x` and :math:`\sum x^2` of
each row, then, with every row's :math:`r` found at once, :math:`\hat x\,\gamma + \beta`
written into the output's rows.  :math:`\sigma^2 = \overline{x^2} - \mu^2` only when every
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

GroupNorm, InstanceNorm, and BatchNorm on ``channels_last`` memory (:func:`forward_groups`,
:func:`backward_groups`) run on a view of the input's own memory (:class:`_Groups`) and keep
nothing full-size: the backward recomputes what it needs from x into the gradient's own
buffer, and folds the mean (or its correction ``delta``) into small per-channel factors.
Measured at (32, 64, 32, 32), one thread, CPU time: GN fwd+bwd 2.9x torch's time before the
fold, 2.2-2.5x after; GN on ``channels_last`` fwd+bwd 3.2x before, 0.9-1.1x after.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .axes import Layout
from .core import (affine_terms, apply_affine_terms, column_sums, compute_dtype, inverse_std,
                   output_format, row_sums, sum_of_squares, writes_in_place)

__all__ = ["BLOCK_ELEMENTS", "MIN_ELEMENTS", "applies", "forward", "backward",
           "forward_function", "backward_function"]

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
    ``kept`` = ``(mu0, delta)`` for the backward (:func:`_shifts`).  Two sweeps over the
    blocks: the sums (:math:`\sum x`, :math:`\sum x^2`), then, with every set's ``r`` found
    at once, :math:`\hat x\,\gamma + \beta` written into the output.  When some set's mean
    is large beside its spread (:func:`_one_pass`), the second sweep is the two-pass one
    instead (:func:`_two_pass_block`).  Every step writes into a buffer made before the loop
    (``out=``): small temporaries between large allocations fragment the heap (page faults)."""
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
    for s, e in blocks:                                                          # the sums
        xb = x2[s:e].to(cdt)
        if lay.centered:
            var[s:e].copy_(sum_of_squares(xb).view(-1, 1))
            torch.sum(xb, 1, keepdim=True, out=mu0[s:e])
        else:   # RMSNorm: chunks of 64 in float64, r from them (its dx was 1.04x torch's error)
            v64 = sum_of_squares(xb, precise=True).view(-1, 1).double() / n
            var[s:e].copy_(v64)
            inv[s:e].copy_(inverse_std(v64, eps))                                # r
    one_pass = not lay.centered or _one_pass(mu0.div_(n), var.div_(n))          # sigma^2
    if one_pass and lay.centered:
        inv.copy_(inverse_std(var, eps))                                         # r
    for s, e in blocks:
        xb, yb, r = x2[s:e].to(cdt), y2[s:e], inv[s:e]
        if not one_pass:
            _two_pass_block(xb, yb, mu0[s:e], delta[s:e], var[s:e], r, eps)
        elif lay.centered:
            torch.sub(xb, mu0[s:e], out=yb).mul_(r)                              # x_hat
        else:
            torch.mul(xb, r, out=yb)                                             # x_hat
        if w is not None and b is not None:
            torch.addcmul(b, yb, w, out=yb)                                      # gamma x_hat + beta
        elif w is not None:
            yb.mul_(w)
        elif b is not None:
            yb.add_(b)
    shape = lay.stat_shape
    mean = torch.add(mu0, delta, out=stats[4]).reshape(shape)                   # mu0 + delta
    return y, mean, var.reshape(shape), inv.reshape(shape), stats[:2]


def _two_pass_block(xb, yb, mu0, delta, var, r, eps: float) -> None:
    r""":math:`\hat x` of a block of rows into ``yb`` by the corrected two-pass algorithm
    (:func:`_variance`), for large means; the statistics into ``delta``, ``var`` and ``r``."""
    n = xb.shape[1]
    c = torch.sub(xb, mu0, out=yb)                                               # x - mu0
    d = torch.sum(c, 1, keepdim=True, out=delta).div_(n)                        # delta
    _variance(var.copy_(sum_of_squares(c).view(-1, 1)), d, n)                   # sigma^2
    r.copy_(inverse_std(var, eps))                                               # r
    if not _negligible(d, r):
        c.sub_(d)                                                                # x - mu
    c.mul_(r)                                                                    # x_hat


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
    ok = bool((mu * mu).mul_(5.0).le_(mean_square).all())
    if ok:
        mean_square.sub_(mu * mu)
    return ok


def _negligible(delta: torch.Tensor, inv_std: torch.Tensor) -> bool:
    r"""Whether subtracting ``delta`` (the rounding error of the mean) would move no
    :math:`\hat x = (c - \delta)\,r` by more than an eighth of a rounding of 1: then the
    pass over the block that subtracts it is skipped."""
    bound = torch.finfo(delta.dtype).eps / 16
    return bool((delta * inv_std).abs().max() <= bound)


def _shifts(kept: torch.Tensor):
    r"""``(mu0, delta)`` from what the forward kept: ``mu0`` the rounded mean the forward
    centered with, ``delta`` the mean of ``x - mu0`` (its rounding error).  The backward
    recomputes ``x - mu0`` from x, bit for bit the forward's, and takes ``delta`` into its
    small per-set factors (GN, IN) or subtracts it (LN, when not negligible)."""
    return kept[0], kept[1]


def backward(g: torch.Tensor, x: torch.Tensor, kept: torch.Tensor, inv_std: torch.Tensor,
             weight, lay: Layout, need_x: bool, need_w: bool, need_b: bool,
             x_dtype: torch.dtype, bias_dtype: torch.dtype | None):
    """``(dL/dx, dL/dgamma, dL/dbeta)`` in the dtypes of x, gamma and beta (None where not
    needed), block by block from the saved input, ``kept`` (:func:`_shifts`) and ``r``;
    every step writes into a buffer made before the loop, as in :func:`forward`."""
    n, sets = lay.set_size, lay.num_sets
    cdt = inv_std.dtype
    steps = _blocks(sets, n)
    w = None if weight is None else weight.to(cdt).reshape(n)
    mu0, delta = _shifts(kept)
    r2 = inv_std.reshape(sets, 1)
    sums = torch.empty(2, sets, 1, dtype=cdt, device=g.device)        # per row, per block
    # RMSNorm: gamma sums in float64 (its dgamma was 1.1x torch's error); LN is well below
    acc = torch.float64 if cdt == torch.float32 and not lay.centered else cdt
    parts = torch.zeros(2, len(steps), n, dtype=acc, device=g.device)
    tmp = torch.empty(2, min(steps[0][1], sets), n, dtype=cdt, device=g.device)
    x2, g2 = x.reshape(sets, n), g.reshape(sets, n).to(cdt)
    dx = torch.empty(lay.shape, dtype=cdt, device=g.device) if need_x else None
    for k, (s, e) in enumerate(steps):
        gb, rb = g2[s:e], r2[s:e]
        xhat, prod = tmp[0, :e - s], tmp[1, :e - s]
        if lay.centered:
            c = torch.sub(x2[s:e].to(cdt), mu0[s:e], out=xhat)          # x - mu0
            if not _negligible(delta[s:e], rb):
                c.sub_(delta[s:e])                                      # x - mu
            c.mul_(rb)                                                  # x_hat
        else:
            torch.mul(x2[s:e].to(cdt), rb, out=xhat)
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


# ---------------------------------------------------------------------------------------
# GroupNorm and InstanceNorm: nothing full-size kept, x - mu recomputed in the backward
# ---------------------------------------------------------------------------------------
class _Groups(NamedTuple):
    """GN's sets on the memory of x, with no copy: ``view`` is ``(N, G, C/G, P)`` for a
    contiguous input and ``(N, P, G, C/G)`` for a ``channels_last`` one (``P`` positions;
    IN is GN with one channel per group); sums over ``pos`` give one value per channel,
    then over ``chan`` one per group."""

    view: tuple
    pos: int
    chan: int
    n: int

    def of(self, t: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
        """``t`` (of the input's shape and memory format) as the view, in ``cdt``."""
        if self.pos == 1:
            return t.movedim(1, -1).reshape(self.view).to(cdt)
        return t.reshape(self.view).to(cdt)

    def per_group(self, t: torch.Tensor) -> torch.Tensor:
        """A value per (sample, group), ``(N * G, 1)``, broadcastable against the view."""
        N, G = self.view[0], self.view[1 if self.pos == 3 else 2]
        return t.view((N, G, 1, 1) if self.pos == 3 else (N, 1, G, 1))

    def spread(self, t: torch.Tensor) -> torch.Tensor:
        """A value per (sample, group) made a value per (sample, channel) (small), for the
        ``channels_last`` view: broadcast along the innermost C/G channels, an op over the
        view runs C/G values at a time (10x slower); contiguous, the whole channel axis."""
        if self.pos == 3:
            return t
        return t.expand(-1, -1, -1, self.view[3]).contiguous()

    def per_channel(self, t: torch.Tensor) -> torch.Tensor:
        """gamma or beta, ``(C,)``, broadcastable against the view."""
        return t.view((1,) + tuple(1 if k == self.pos else s for k, s in
                                   enumerate(self.view) if k > 0))

    def group_sum(self, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The sum of ``t`` (the view's shape) over each set, into ``out`` (``(N * G, 1)``)."""
        if self.pos == 3:               # contiguous: a row of (N G, C/G P) per set
            return torch.sum(t.reshape(out.shape[0], -1), 1, keepdim=True, out=out)
        torch.sum(t.sum(1, keepdim=True), 3, keepdim=True, out=self.per_group(out))
        return out

    def sum_of_squares(self, c: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The squared norm of each set of ``c`` into ``out`` (``(N * G, 1)``); ``channels_last``:
        by blocks of samples (or positions) squared into a temporary (``vector_norm``: 10x)."""
        if self.pos == 3:
            return out.copy_(sum_of_squares(c.reshape(out.shape[0], -1)).view(-1, 1))
        N, P = c.shape[0], c.shape[1]
        sq = torch.zeros(N, 1, *c.shape[2:], dtype=c.dtype, device=c.device)
        per_position = c[0, 0].numel()
        step = max(1, BLOCK_ELEMENTS // per_position)          # positions per block
        tmp = torch.empty(min(step, N * P), *c.shape[2:], dtype=c.dtype, device=c.device)
        if step >= P:                                           # whole samples per block
            k = step // P
            for s in range(0, N, k):
                e = min(s + k, N)
                t = torch.mul(c[s:e], c[s:e], out=tmp[:(e - s) * P].view(e - s, *c.shape[1:]))
                torch.sum(t, 1, keepdim=True, out=sq[s:e])
        else:                                                   # a sample by its positions
            for i in range(N):
                for s in range(0, P, step):
                    e = min(s + step, P)
                    t = torch.mul(c[i, s:e], c[i, s:e], out=tmp[:e - s])
                    sq[i].add_(t.sum(0, keepdim=True))
        torch.sum(sq, 3, keepdim=True, out=self.per_group(out))
        return out


def _groups(lay: Layout, x: torch.Tensor) -> _Groups:
    """The :class:`_Groups` of ``lay`` on ``x``'s memory (contiguous or ``channels_last``).
    BatchNorm on ``channels_last`` memory is GN's view with one sample of ``N P``
    positions and one channel per group: ``(1, N P, C, 1)``."""
    if lay.norm == "batch":
        return _Groups((1, lay.set_size, lay.shape[1], 1), 1, 3, lay.set_size)
    N, G = lay.view_shape[0], lay.view_shape[1]
    P = lay.set_size * G // lay.shape[1] if lay.norm == "group" else lay.set_size
    Cg = lay.shape[1] // G
    if x.is_contiguous():
        return _Groups((N, G, Cg, P), 3, 2, lay.set_size)
    return _Groups((N, P, G, Cg), 1, 3, lay.set_size)


def forward_groups(x: torch.Tensor, lay: Layout, eps: float, weight, bias):
    r"""GN, IN (and BN on ``channels_last`` memory), ``(y, mean, var, inv_std, kept)``.  A
    contiguous float32 input: :func:`_precise_groups`.  Otherwise the sum and the sum of
    squares of each set, and when :func:`_one_pass` holds :math:`y = x\,(\gamma r) + (\beta -
    \mu\,\gamma r)` (the mean folded into the small shift); else ``x - mu0`` into the output,
    its mean ``delta`` (:func:`_variance`) and :math:`(x-\mu_0)(\gamma r) + (\beta -
    \delta\,\gamma r)` in place.  The backward gets x, ``(mu0, delta)`` and r, not a full-size
    x - mu: the output is the only full-size tensor made (each costs its page faults).  A
    ``channels_last`` input runs on the ``(N, P, G, C/G)`` view of its memory, and so is y."""
    cdt = compute_dtype(x.dtype)
    grp = _groups(lay, x)
    n = grp.n
    stats = torch.zeros(5, lay.num_sets, 1, dtype=cdt, device=x.device)
    mu0, delta, var, inv = stats[0], stats[1], stats[2], stats[3]
    xv = grp.of(x, cdt)
    y = torch.empty_like(x, dtype=cdt, memory_format=torch.preserve_format)
    yv = grp.of(y, cdt)
    if cdt == torch.float32 and grp.pos == 3:          # contiguous: the two forms, float64
        _precise_groups(xv, yv, grp, stats, eps, weight, bias)
    else:
        grp.group_sum(xv, mu0).div_(n)                                               # mu0
        grp.sum_of_squares(xv, var).div_(n)                                          # mean square
        one_pass = _one_pass(mu0, var)                                               # sigma^2
        if not one_pass:
            torch.sub(xv, grp.spread(grp.per_group(mu0)), out=yv)                   # x - mu0
            grp.group_sum(yv, delta).div_(n)                                         # delta
            _variance(grp.sum_of_squares(yv, var), delta, n)                      # sigma^2
        inv.copy_(inverse_std(var, eps))                                             # r
        scale = grp.per_group(inv)
        if weight is not None:
            scale = scale * grp.per_channel(weight.to(cdt))                          # gamma r
        # the shift: beta - mu gamma r (one pass), or beta - delta gamma r after x - mu0
        shift = grp.per_group(mu0 if one_pass else delta) * scale
        shift = -shift if bias is None else grp.per_channel(bias.to(cdt)) - shift
        if one_pass and grp.pos == 1:   # channels_last: scale, shift vary along the inner C
            torch.addcmul(grp.spread(shift), xv, grp.spread(scale), out=yv)         # y
        elif one_pass:
            torch.mul(xv, grp.spread(scale), out=yv).add_(grp.spread(shift))        # y
        else:
            yv.mul_(grp.spread(scale)).add_(grp.spread(shift))                       # y
    shape = lay.stat_shape
    mean = torch.add(mu0, delta, out=stats[4]).reshape(shape)                   # mu0 + delta
    return y, mean, var.reshape(shape), inv.reshape(shape), stats[:2]


def _precise_groups(xv, yv, grp: _Groups, stats, eps: float, weight, bias) -> None:
    r"""Contiguous float32 GN, IN into ``yv``, ``stats``: sums by chunks in float64 (the squares by
    chunks of 64: by 256, IN's y was 1.08x torch's error, and GN's, in sets of 8192 under the
    generic kernels, 1.28x); :math:`\overline{x^2} - \mu^2` when
    :func:`_one_pass` holds, else ``x - mu0`` rounded once, its mean ``delta`` folded into the
    variance (squares summed exactly in short sets) and shift; y as :func:`core.affine_terms`."""
    mu0, delta, var, inv = stats[0], stats[1], stats[2], stats[3]
    n, rows = grp.n, xv.reshape(mu0.shape[0], -1)
    mu64 = row_sums(rows) / n
    var64 = sum_of_squares(rows, precise=True, double=True).view(-1, 1) / n
    near = _one_pass(mu64, var64)                                # sigma^2 in place when near
    mu0.copy_(mu64)
    if near:
        delta.copy_(mu64 - mu0.double())
    else:
        c = torch.sub(xv, grp.per_group(mu0), out=yv)                            # x - mu0
        grp.group_sum(c, delta).div_(n)                                          # delta
        var64 = sum_of_squares(c.reshape(rows.shape), precise=True, exact=n <= 1024)
        var64 = var64.view(-1, 1) / n - delta.double().square()                 # sigma^2
    var.copy_(var64)
    inv.copy_(r64 := inverse_std(var64, eps))                                    # r
    shape = (1, grp.view[1], grp.view[2], 1)                                     # (1, G, C/G, 1)
    if not near:
        st = [grp.per_group(t) for t in (mu0, delta, var64)]
        apply_affine_terms(xv, yv, affine_terms(*st, eps, shape, weight, bias, uncorrected=True),
                           out=yv)                                               # y
        return
    # every set near 0: affine_terms' first form x s + (beta - mu s), fewer small steps
    s = grp.per_group(r64) * (1.0 if weight is None else weight.double().view(shape))
    t = grp.per_group(mu64) * (s := s.to(xv.dtype)).double()
    t = (-t if bias is None else bias.double().view(shape) - t).to(xv.dtype)
    yv.copy_(t.expand_as(yv)).addcmul_(xv, s)                                    # y


def backward_groups(g: torch.Tensor, x: torch.Tensor, kept: torch.Tensor,
                    inv_std: torch.Tensor, weight, lay: Layout, need_x: bool, need_w: bool,
                    need_b: bool, x_dtype: torch.dtype, bias_dtype: torch.dtype | None):
    r"""GN, IN: the boxed formula with gamma constant over the positions (:mod:`normcore.grad`),
    ``c = x - mu0`` recomputed into the gradient's buffer, once for :math:`\sum g\,c` per
    channel, once for the gradient; ``delta`` (:func:`_shifts`) goes into the small factors,
    :math:`\sum g\,(x-\mu) = \sum g\,c - \delta \sum g`, :math:`(x-\mu)\,s + t = c\,s + (t -
    \delta s)`.  When every :math:`|\mu|\,r \le 1/2` ``c`` is not formed (:math:`x\,s + (t -
    \mu s)`, the terms in :math:`\mu` at most half the others).  ``g``, ``x`` and the input's
    gradient in one memory format.  The gradients in the dtypes of x, gamma and beta."""
    cdt = inv_std.dtype
    grp = _groups(lay, x)
    n, chan = grp.n, grp.chan
    acc = torch.float64 if cdt == torch.float32 else cdt    # the small factors, rounded once
    mu0, delta = (grp.per_group(t) for t in _shifts(kept))
    r, mu0_c = grp.per_group(inv_std), grp.spread(mu0)
    fold = bool((mu0 * r).abs().max() <= 0.5)            # the mean small beside the spread
    w = None if weight is None else grp.per_channel(weight.to(acc))
    r64, mu64, d64 = r.to(acc), mu0.to(acc), delta.to(acc)
    xv, gv = grp.of(x, cdt), grp.of(g, cdt)
    sum_g = _position_sums(gv, grp, acc)                                         # sum_P g
    sum_gxhat = dx = None
    if need_x or need_w:
        dx = torch.empty_like(x, dtype=cdt, memory_format=torch.preserve_format)
        out = grp.of(dx, cdt)
        if fold:
            torch.mul(xv, gv, out=out)                                           # g x
            shift_g = (mu64 + d64) * sum_g
        else:
            torch.sub(xv, mu0_c, out=out).mul_(gv)                               # g (x - mu0)
            shift_g = d64 * sum_g
        sum_gxhat = _position_sums(out, grp, acc).sub_(shift_g).mul_(r64)      # sum_P g x_hat
    if need_x:
        # per group, with d = gamma g: sum_S d and sum_S d x_hat, then
        # dL/dx = g (gamma r) + (x - mu) (-r^2 sum_S(d x_hat) / n) - r sum_S(d) / n
        d, dxh = (sum_g, sum_gxhat) if w is None else (sum_g * w, sum_gxhat * w)
        slope = dxh.sum(chan, keepdim=True).mul_(r64 * r64 * (-1.0 / n))
        shift = d.sum(chan, keepdim=True).mul_(r64 * (-1.0 / n)).sub_(d64 * slope)
        if fold:                                             # x s + (t - mu0 s)
            torch.mul(xv, grp.spread(slope.to(cdt)), out=out).add_(
                grp.spread((shift - mu64 * slope).to(cdt)))
        else:                                                # (x - mu0) s + t
            torch.sub(xv, mu0_c, out=out).mul_(grp.spread(slope.to(cdt))).add_(
                grp.spread(shift.to(cdt)))
        out.addcmul_(gv, grp.spread(r) if w is None else (r64 * w).to(cdt))
    shape = lay.affine_shape
    return (dx.to(x_dtype) if need_x else None,
            sum_gxhat.sum(0).reshape(shape).to(weight.dtype) if need_w else None,
            sum_g.sum(0).reshape(shape).to(bias_dtype) if need_b else None)


def _position_sums(t: torch.Tensor, grp: _Groups, acc: torch.dtype) -> torch.Tensor:
    """The sums of the view ``t`` over its positions, keepdim, in ``acc``: a contiguous float32
    view by rows of float32 chunks then float64 (:func:`normcore.core.row_sums`); a
    ``channels_last`` one in its own dtype first (a float64 sum down its positions: 8x).
    With these sums and the per-set factors in float64 (:func:`backward_groups`),
    InstanceNorm's dgamma went from 1.09x torch's error to 0.69x (generic kernels, seed 2);
    either alone gave 0.71."""
    if grp.pos == 3 and t.dtype == torch.float32:
        return row_sums(t.reshape(-1, t.shape[-1])).view(t.shape[:-1] + (1,)).to(acc)
    return t.sum(grp.pos, keepdim=True).to(acc)


# ---------------------------------------------------------------------------------------
# normcore.grad.Normalize's forward and backward when :func:`applies`
# ---------------------------------------------------------------------------------------
def forward_function(x, weight, bias, lay: Layout, eps: float):
    """:func:`forward` (or :func:`forward_groups`) inside ``Normalize.forward``: ``(y, mean,
    var, kept, inv_std)``, ``y`` in the input's dtype and torch's memory format; ``kept``
    (:func:`_shifts`) is small, where the plain path keeps x - mu or x_hat."""
    run = forward_groups if lay.norm in GROUP_NORMS else forward
    y, mean, var, inv_std, kept = run(x, lay, eps, weight, bias)
    return y.to(x.dtype, memory_format=output_format(lay, x)), mean, var, kept, inv_std


def backward_function(ctx, grad_y, kept, inv_std, weight, x):
    """:func:`backward` inside ``Normalize.backward``: its five gradients."""
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    has_b = ctx.bias_dtype is not None
    run = backward_groups if ctx.lay.norm in GROUP_NORMS else backward
    fmt = _memory_format(x)                        # g as x, for the views of _Groups
    grad_x, grad_w, grad_b = run(grad_y.contiguous(memory_format=fmt), x, kept, inv_std, weight,
                                 ctx.lay, need_x, need_w and weight is not None,
                                 need_b and has_b, ctx.x_dtype, ctx.bias_dtype)
    if grad_x is not None:                         # torch's memory format
        grad_x = grad_x.contiguous(memory_format=output_format(ctx.lay, x))
    return grad_x, grad_w, grad_b, None, None
