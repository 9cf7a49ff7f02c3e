r"""GroupNorm, InstanceNorm, and BatchNorm on ``channels_last`` memory: the fast paths of
:mod:`normcore.rows` whose sets are not rows; the two functions ``Normalize`` calls when
:func:`normcore.rows.applies` (:func:`forward_function`, :func:`backward_function`); and
GroupNorm's formula on ``channels_last`` memory (:func:`group_norm_channels_last`).

:func:`forward_groups` and :func:`backward_groups` run on a view of the input's own memory
(:class:`_Groups`) and keep nothing full-size: the backward recomputes what it needs from x
into the gradient's own buffer, and folds the mean (or its correction ``delta``) into small
per-channel factors.  Measured at (32, 64, 32, 32), one thread, CPU time: GN fwd+bwd 2.9x
torch's time before the fold, 2.2-2.5x after, 2.15-2.25x with :math:`\sum g\,x` by
:func:`_row_dots` (a heap that keeps freed memory: ``benchmarks/speed.py``); GN on
``channels_last`` fwd+bwd 3.2x before, 0.6-1.1x after.

With numba installed, float32 and float64 inputs on the CPU go to the compiled kernels
instead: :mod:`normcore.loops` on contiguous memory, :mod:`normcore.positions` on
``channels_last``.  At (32, 64, 32, 32), one thread: GN fwd+bwd 1.2-1.4x torch's time where
the blocks below take 2.2-2.3x, BN train on ``channels_last`` 1.4-1.7x where they take
2.1-2.2x.  The blocks are the path without numba, on other devices and in half precision.

The one-pass test, the corrected variance and the kept shifts are :mod:`normcore.rows`'s
(:func:`normcore.rows._one_pass`, :func:`normcore.rows._variance`,
:func:`normcore.rows._shifts`), read through the module so that one change reaches both.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import loops, positions, rows
from .axes import Layout
from .core import (FUSED_MULTIPLY_ADD, Normalized, affine_terms, apply_affine_terms,
                   compute_dtype, inverse_std, output_format, scale_and_shift)
from .passes import row_affine, row_sums, sum_of_squares

__all__ = ["forward_groups", "backward_groups", "forward_function", "backward_function",
           "group_norm_channels_last"]


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
        by blocks of samples (or positions, :func:`_sample_blocks`) squared into a temporary
        (``vector_norm``: 10x)."""
        if self.pos == 3:
            return out.copy_(sum_of_squares(c.reshape(out.shape[0], -1)).view(-1, 1))
        sq = torch.zeros(c.shape[0], 1, *c.shape[2:], dtype=c.dtype, device=c.device)
        blocks = _sample_blocks(c, self)
        tmp = torch.empty(c[blocks[0][0]].numel(), dtype=c.dtype, device=c.device)
        for idx, k in blocks:
            cb = c[idx]
            sq[k].add_(torch.mul(cb, cb, out=tmp[:cb.numel()].view(cb.shape)).sum(1, keepdim=True))
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
    squares of each set, and when :func:`normcore.rows._one_pass` holds :math:`y = x\,(\gamma
    r) + (\beta - \mu\,\gamma r)` (the mean folded into the small shift); else ``x - mu0``
    into the output, its mean ``delta`` (:func:`normcore.rows._variance`) and
    :math:`(x-\mu_0)(\gamma r) + (\beta - \delta\,\gamma r)` in place.  The backward gets x,
    ``(mu0, delta)`` and r, not a full-size x - mu: the output is the only full-size tensor
    made (each costs its page faults).  A ``channels_last`` input runs on the ``(N, P, G,
    C/G)`` view of its memory, and so is y."""
    cdt = compute_dtype(x.dtype)
    grp = _groups(lay, x)
    if loops.takes(x):                              # the compiled kernels
        y = torch.empty_like(x, memory_format=torch.preserve_format)
        if grp.pos == 3:                            # contiguous: set by set
            N, G, Cg, P = grp.view
            stats = loops.forward_by_sets(x.reshape(N * G, Cg, P), eps, weight, bias, G,
                                          y.view(N * G, Cg, P))
        else:                                       # channels_last: by positions
            stats = positions.forward_positions(_positions(x, grp), eps, weight, bias,
                                                grp.view[3], _positions(y, grp))
        return (y, *rows._loop_statistics(stats, x.dtype, lay.stat_shape))
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
        one_pass = rows._one_pass(mu0, var)                                          # sigma^2
        if not one_pass:
            torch.sub(xv, grp.spread(grp.per_group(mu0)), out=yv)                   # x - mu0
            grp.group_sum(yv, delta).div_(n)                                         # delta
            rows._variance(grp.sum_of_squares(yv, var), delta, n)                    # sigma^2
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
    chunks of 128: by 256, IN's y was 1.08x torch's error, and GN's, in sets of 8192 under the
    generic kernels, 1.28x; by 64, as accurate on seeds 0-4 and 0.1 ms slower at (32, 64, 32,
    32)); :math:`\overline{x^2} - \mu^2` when
    :func:`normcore.rows._one_pass` holds, else ``x - mu0`` rounded once, its mean ``delta``
    folded into the variance (squares summed exactly in short sets) and shift; y as
    :func:`normcore.core.affine_terms`."""
    mu0, delta, var, inv = stats[0], stats[1], stats[2], stats[3]
    n, flat = grp.n, xv.reshape(mu0.shape[0], -1)              # a row per set
    mu64 = row_sums(flat).div_(n)
    var64 = sum_of_squares(flat, precise=True, double=True, chunk=128).view(-1, 1).div_(n)
    near = rows._one_pass(mu64, var64)                           # sigma^2 in place when near
    mu0.copy_(mu64)
    if near:
        torch.sub(mu64, mu0, out=delta)           # in float64 (promotion), rounded once
    else:
        c = torch.sub(xv, grp.per_group(mu0), out=yv)                            # x - mu0
        grp.group_sum(c, delta).div_(n)                                          # delta
        var64 = sum_of_squares(c.reshape(flat.shape), precise=True, exact=n <= 1024)
        var64 = var64.view(-1, 1) / n - delta.double().square()                 # sigma^2
    var.copy_(var64)
    inv.copy_(r64 := inverse_std(var64, eps))                                    # r
    shape = (1, grp.view[1], grp.view[2], 1)                                     # (1, G, C/G, 1)
    if not near:
        st = [grp.per_group(t) for t in (mu0, delta, var64)]
        apply_affine_terms(xv, yv, affine_terms(*st, eps, shape, weight, bias, uncorrected=True),
                           out=yv)                                               # y
        return
    # every set near 0: affine_terms' first form x s + (beta - mu s)
    s, t = scale_and_shift(grp.per_group(r64), grp.per_group(mu64), shape, weight, bias, xv.dtype)
    row_affine(xv, s, t, out=yv)                                                 # y


def backward_groups(g: torch.Tensor, x: torch.Tensor, kept: torch.Tensor,
                    inv_std: torch.Tensor, weight, lay: Layout, need_x: bool, need_w: bool,
                    need_b: bool, x_dtype: torch.dtype, bias_dtype: torch.dtype | None):
    r"""GN, IN: the boxed formula with gamma constant over the positions (:mod:`normcore.grad`),
    ``c = x - m`` recomputed into the gradient's buffer, once for :math:`\sum g\,c` per
    channel, once for the gradient, with ``m`` per set: 0 where :math:`|\mu|\,r \le 1/2`
    (``c`` is x itself, exact; the terms in :math:`\mu` at most half the others), the rounded
    mean ``mu0`` elsewhere.  The rest of the mean, :math:`\mu - m` (with ``delta``,
    :func:`normcore.rows._shifts`), goes into the small factors: :math:`\sum g\,(x-\mu) =
    \sum g\,c - (\mu - m) \sum g` and :math:`(x-\mu)\,s + t = c\,s + (t - (\mu - m)\,s)`.
    When every set is near 0, ``c`` is not formed.  ``g``, ``x`` and the input's gradient in
    one memory format; on ``channels_last`` memory both sweeps go by blocks of samples (of
    positions for BN's one sample, :func:`_sample_blocks`), the sums of each block taken
    while it is in cache and added in float64.  The gradients in the dtypes of x, gamma and
    beta."""
    cdt = inv_std.dtype
    grp = _groups(lay, x)
    if loops.takes(x):                              # the compiled kernels
        return _backward_loops(g, x, kept, inv_std, weight, lay, grp, need_x, need_w, need_b,
                               bias_dtype)
    n, chan = grp.n, grp.chan
    acc = torch.float64 if cdt == torch.float32 else cdt    # the small factors, rounded once
    mu0, delta = (grp.per_group(t) for t in rows._shifts(kept))
    r = grp.per_group(inv_std)
    near = (mu0 * r).abs() <= 0.5                     # per set: the mean small beside the spread
    fold = bool(near.all())
    # the shift taken from x: 0 in such a set (x itself, exact), mu0 in the others
    m = mu0.new_zeros(()) if fold else torch.where(near, 0.0, mu0)
    m_c = None if fold else grp.spread(m)
    w = None if weight is None else grp.per_channel(weight.to(acc))
    r64, d64 = r.to(acc), delta.to(acc)
    off = mu0.to(acc) + d64 - m.to(acc)                                          # mu - m
    xv, gv = grp.of(x, cdt), grp.of(g, cdt)
    blocks = _sample_blocks(xv, grp)
    sum_gxhat = dx = None
    if need_x or need_w:
        dx = torch.empty_like(x, dtype=cdt, memory_format=torch.preserve_format)
        out = grp.of(dx, cdt)
        # contiguous (one block): sum_P g first, then sum_P g x by dot products where c is x
        # (_row_dots), else the product; channels_last by blocks, whose two sums read
        # g (x - m) and g from cache (BN's backward 0.5 ms faster at (32, 64, 32, 32); GN's
        # contiguous one was 0.4 ms slower in that order)
        by_blocks = len(blocks) > 1
        sums = [1 if k == grp.pos else size for k, size in enumerate(gv.shape)]
        sum_g = torch.zeros(sums, dtype=acc, device=g.device) if by_blocks else \
            _position_sums(gv, grp, acc)                                           # sum_P g
        sum_gc = torch.zeros(sums, dtype=acc, device=g.device)
        for idx, k in blocks:
            xb, gb, ob = xv[idx], gv[idx], out[idx]
            dots = _row_dots(xb, gb) if fold and grp.pos == 3 else None
            if dots is not None:                           # contiguous, c = x: sum_P g x
                sum_gc.copy_(dots)
                continue
            c = xb if fold else torch.sub(xb, _take(m_c, k), out=ob)             # x - m
            torch.mul(c, gb, out=ob)                                               # g (x - m)
            if by_blocks:
                sum_g[k].add_(_position_sums(gb, grp, acc))                        # sum_P g
            sum_gc[k].add_(_position_sums(ob, grp, acc))                           # sum_P g c
        sum_gxhat = sum_gc.sub_(off * sum_g).mul_(r64)                            # sum_P g x_hat
    else:
        sum_g = _position_sums(gv, grp, acc)                                       # sum_P g
    if need_x:
        # per group, with d = gamma g: sum_S d and sum_S d x_hat, then
        # dL/dx = g (gamma r) + (x - mu) (-r^2 sum_S(d x_hat) / n) - r sum_S(d) / n
        d, dxh = (sum_g, sum_gxhat) if w is None else (sum_g * w, sum_gxhat * w)
        slope = dxh.sum(chan, keepdim=True).mul_(r64 * r64 * (-1.0 / n))
        shift = d.sum(chan, keepdim=True).mul_(r64 * (-1.0 / n)).sub_(off * slope)
        # the generic kernels (no fused multiply-add): dx in float64, rounded once; in float32
        # IN's dx was 1.10x torch's error there (seed 4 of benchmarks/accuracy)
        wide = cdt == torch.float32 and not FUSED_MULTIPLY_ADD
        q = grp.spread(r64) if w is None else r64 * w                              # gamma r
        s, t = (grp.spread(v) for v in (slope, shift))
        if not wide:
            s, t, q = s.to(cdt), t.to(cdt), q.to(cdt)
        for idx, k in blocks:       # (x - m) s + (t - (mu - m) s) + g gamma r
            xb, gb, ob = xv[idx], gv[idx], out[idx]
            if wide:
                c = xb.double() if fold else xb.double().sub_(_take(m_c, k))
                c.mul_(_take(s, k)).add_(_take(t, k))
                ob.copy_(c.addcmul_(gb.double(), _take(q, k)))
                continue
            c = xb if fold else torch.sub(xb, _take(m_c, k), out=ob)
            if grp.pos == 1:    # channels_last: s, t vary along the inner channels, one pass
                torch.addcmul(_take(t, k), c, _take(s, k), out=ob)
            else:
                row_affine(c, _take(s, k), _take(t, k), out=ob)
            ob.addcmul_(gb, _take(q, k))
    shape = lay.affine_shape
    return (dx.to(x_dtype) if need_x else None,
            sum_gxhat.sum(0).reshape(shape).to(weight.dtype) if need_w else None,
            sum_g.sum(0).reshape(shape).to(bias_dtype) if need_b else None)


def _backward_loops(g, x, kept, inv_std, weight, lay: Layout, grp: _Groups, need_x: bool,
                    need_w: bool, need_b: bool, bias_dtype):
    """:func:`backward_groups` by :func:`normcore.loops.backward_by_sets` (contiguous) or
    :func:`normcore.positions.backward_positions`, from the mean the forward kept and its
    ``r``."""
    mu, r = rows._kept_mean(kept), inv_std.double()
    dx = torch.empty_like(x, memory_format=torch.preserve_format)
    g = g.to(x.dtype)
    if grp.pos == 3:                                # contiguous: set by set
        N, G, Cg, P = grp.view
        sums = loops.backward_by_sets(g.reshape(N * G, Cg, P).contiguous(),
                                      x.reshape(N * G, Cg, P), weight, G, mu, r,
                                      dx.view(N * G, Cg, P))
    else:                                           # channels_last: by positions
        g = g.contiguous(memory_format=rows._memory_format(x))
        sums = positions.backward_positions(_positions(g, grp), _positions(x, grp), weight,
                                            grp.view[3], mu, r, _positions(dx, grp))
    return rows._loop_gradients(dx, sums, lay, weight, bias_dtype, need_x, need_w, need_b)


def _positions(t: torch.Tensor, grp: _Groups) -> torch.Tensor:
    """``t`` on ``channels_last`` memory as its ``(N, P, C)`` view (BatchNorm: ``(1, N P,
    C)``), with no copy: :func:`normcore.positions.as_positions`."""
    return positions.as_positions(t, grp.view[0])


def _sample_blocks(v: torch.Tensor, grp: _Groups):
    """``(index, samples)`` of each block of the view ``v``: on ``channels_last`` memory about
    :data:`normcore.rows.BLOCK_ELEMENTS` elements per thread, whole samples (dim 0) or, when
    one sample is larger, a sample's positions (dim 1: BN's one sample); a contiguous view is
    one block.  ``samples`` indexes the small per-sample factors (:func:`_take`)."""
    N, per_sample = v.shape[0], v[0].numel()
    if grp.pos == 3:
        return [((slice(0, N),), slice(0, N))]
    if per_sample > rows.BLOCK_ELEMENTS * torch.get_num_threads():
        P = v.shape[1]
        return [((slice(i, i + 1), slice(s, e)), slice(i, i + 1))
                for i in range(N) for s, e in rows._blocks(P, per_sample // P)]
    return [((slice(s, e),), slice(s, e)) for s, e in rows._blocks(N, per_sample)]


#: the values of a row whose dot product :func:`_row_dots` takes in one piece (measured at
#: (2048, 1024), one thread: chunks of 64, 128, 256 and 1024 took 2.3, 0.69, 0.57 and 0.47 ms,
#: where ``mul`` and the row sums took 0.64 ms without their write into the gradient's buffer;
#: under 128, ``bmm`` takes its own loop, not the BLAS kernel)
DOT_CHUNK = 128


def _row_dots(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor | None:
    r""":math:`\sum_P g\,x` of each row of the contiguous views ``x``, ``g`` (``(..., P)``),
    keepdim, in float64, or None when ``P`` is not a multiple of :data:`DOT_CHUNK` or the
    chunks do not pair up.  The rows are cut into chunks of :data:`DOT_CHUNK` values; each
    chunk's dot product is taken in x's dtype by the BLAS kernel (with fused multiply-adds
    where the CPU has them: no rounded product), and they are summed in float64.  The dots
    of two chunks at a time are the diagonal of one ``bmm`` product :math:`G_2 X_2^T`
    (``(2, 128) @ (128, 2)``).  One read of x and g and no product written, where ``mul``
    into the gradient's buffer and its row sums took two passes and a write.  By chunks of
    256, GN's dgamma was 0.31-0.82x torch's error (seeds 0-4 of benchmarks/accuracy.py), by
    whole rows of 1024 values up to 1.00x; by 128, 0.22-0.50x (0.26-0.58x under the generic
    kernels), as with the product and its sums."""
    P, chunk = x.shape[-1], DOT_CHUNK
    if P % chunk or (x.numel() // chunk) % 2 or not (x.is_contiguous() and g.is_contiguous()):
        return None
    pairs = x.numel() // (2 * chunk)
    dots = torch.bmm(g.reshape(pairs, 2, chunk), x.reshape(pairs, 2, chunk).transpose(1, 2))
    per_row = dots.diagonal(dim1=1, dim2=2).reshape(-1, P // chunk)
    return per_row.sum(-1, dtype=torch.float64).reshape(x.shape[:-1] + (1,))


def _take(t: torch.Tensor | None, samples: slice):
    """A small per-sample factor (or one shared by every sample) for a block's samples."""
    return t if t is None or t.shape[0] == 1 else t[samples]


def _position_sums(t: torch.Tensor, grp: _Groups, acc: torch.dtype) -> torch.Tensor:
    """The sums of the view ``t`` over its positions, keepdim, in ``acc``: a contiguous float32
    view by rows of float32 chunks then float64 (:func:`normcore.passes.row_sums`); a
    ``channels_last`` one in its own dtype first (a float64 sum down its positions: 8x).
    With these sums and the per-set factors in float64 (:func:`backward_groups`),
    InstanceNorm's dgamma went from 1.09x torch's error to 0.69x (generic kernels, seed 2);
    either alone gave 0.71."""
    if grp.pos == 3 and t.dtype == torch.float32:
        return row_sums(t.reshape(-1, t.shape[-1])).view(t.shape[:-1] + (1,)).to(acc)
    return t.sum(grp.pos, keepdim=True).to(acc)


def group_norm_channels_last(x: torch.Tensor, lay: Layout, eps: float, weight=None,
                             bias=None) -> Normalized:
    r"""GroupNorm's formula, without autograd, on a ``channels_last`` (or
    ``channels_last_3d``) input, through the view of its memory ``(N, P, G, C/G)`` (``P``
    positions), which is contiguous.  The same steps as :func:`normalize_formula` (two-pass
    statistics, centering first), summed over the positions first and then over the
    ``C/G`` channels of a group: on the ``(N, G, C/G, *S)`` view of such an input every pass
    strides over its innermost ``C/G`` channels and runs 10-20x slower than torch's kernel.
    The output is ``channels_last`` as torch's."""
    cdt = compute_dtype(x.dtype)
    N, C, G = x.shape[0], x.shape[1], lay.num_groups
    xp = x.movedim(1, -1).reshape(N, -1, G, C // G).to(cdt)           # (N, P, G, C/G)
    y = torch.empty_like(x, dtype=cdt)                                  # channels_last
    yp = y.movedim(1, -1).view(xp.shape)
    n = lay.set_size
    mean = xp.sum(1, keepdim=True).sum(3, keepdim=True) / n            # mu, (N, 1, G, 1)
    torch.sub(xp, mean.expand(-1, -1, -1, xp.shape[3]).contiguous(), out=yp)   # x - mu
    var = yp.square().sum(1, keepdim=True).sum(3, keepdim=True) / n     # sigma^2
    scale = inverse_std(var, eps).expand(-1, -1, -1, xp.shape[3])     # r
    if weight is not None:
        scale = scale * weight.to(cdt).view(1, 1, G, -1)                # gamma r
    yp.mul_(scale.contiguous())
    if bias is not None:
        yp.add_(bias.to(cdt).view(1, 1, G, -1))                         # + beta
    return Normalized(y.to(x.dtype), mean.reshape(lay.stat_shape), var.reshape(lay.stat_shape))


# ---------------------------------------------------------------------------------------
# normcore.grad.Normalize's forward and backward when :func:`normcore.rows.applies`
# ---------------------------------------------------------------------------------------
def forward_function(x, weight, bias, lay: Layout, eps: float):
    """:func:`normcore.rows.forward` (or :func:`forward_groups`) inside
    ``Normalize.forward``: ``(y, mean, var, kept, inv_std)``, ``y`` in the input's dtype and
    torch's memory format; ``kept`` (:func:`normcore.rows._shifts`) is small, where the plain
    path keeps x - mu or x_hat."""
    run = forward_groups if lay.norm in rows.GROUP_NORMS else rows.forward
    y, mean, var, inv_std, kept = run(x, lay, eps, weight, bias)
    return y.to(x.dtype, memory_format=output_format(lay, x)), mean, var, kept, inv_std


def backward_function(ctx, grad_y, kept, inv_std, weight, x):
    """:func:`normcore.rows.backward` (or :func:`backward_groups`) inside
    ``Normalize.backward``: its five gradients."""
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    has_b = ctx.bias_dtype is not None
    run = backward_groups if ctx.lay.norm in rows.GROUP_NORMS else rows.backward
    fmt = rows._memory_format(x)                   # g as x, for the views of _Groups
    grad_x, grad_w, grad_b = run(grad_y.contiguous(memory_format=fmt), x, kept, inv_std, weight,
                                 ctx.lay, need_x, need_w and weight is not None,
                                 need_b and has_b, ctx.x_dtype, ctx.bias_dtype)
    if grad_x is not None:                         # torch's memory format
        grad_x = grad_x.contiguous(memory_format=output_format(ctx.lay, x))
    return grad_x, grad_w, grad_b, None, None
