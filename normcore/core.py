r"""The numeric core: the one formula, its compute dtype, and the sums it needs.

.. math::

    \mu_i = \frac{1}{|S_i|}\sum_{k\in S_i} x_k, \quad
    \sigma_i^2 = \frac{1}{|S_i| - c}\sum_{k\in S_i}(x_k-\mu_i)^2, \quad
    r_i = \frac{1}{\sqrt{\sigma_i^2+\epsilon}}, \quad
    \hat x_i = (x_i-\mu_i)\, r_i, \quad
    y_i = \gamma\,\hat x_i + \beta

over the sets :math:`S_i` of a :class:`~normcore.axes.Layout`, with :math:`c` =
``correction`` (0, the biased variance, for every normalization layer; 1 for the original
Weight Standardization code).  ``eps_mode="outside"`` uses :math:`r = 1/(\sigma+\epsilon)`
(the original WS code).  An uncentered layout (RMSNorm) takes :math:`\mu = 0` and
:math:`\sigma^2 = \frac{1}{|S_i|}\sum x_k^2`, the mean square.

Nothing here validates arguments (:mod:`normcore._checks` does) or knows about autograd
Functions (:mod:`normcore.grad`); both :func:`normalize_formula` and the Functions compute
with the same steps: :func:`moments`, :func:`inverse_std`, :func:`apply_affine`.

float16 / bfloat16 inputs are computed in float32 (:func:`compute_dtype`) and the results
cast back, as PyTorch does.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .axes import Layout

LOW_PRECISION = (torch.float16, torch.bfloat16)


def writes_in_place() -> bool:
    """Whether the fast paths may write into fresh tensors (``out=``, in place).

    Not under a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``), where those
    tensors would receive batched or wrapped values, nor while ``torch.export`` or
    ``torch.jit.trace`` records a graph: it keeps the ``out=`` ops, which autograd refuses
    when the graph is run on inputs that require grad.  ``torch.compile`` functionalizes
    them: it keeps the in-place code, as eager does."""
    return not (torch._C._are_functorch_transforms_active() or torch.compiler.is_exporting()
                or torch.jit.is_tracing())


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs, the input's own dtype otherwise."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def output_format(lay: Layout, x: torch.Tensor) -> torch.memory_format:
    """The memory format of torch's output for this norm and input: the input's
    ``channels_last`` (4-d) or ``channels_last_3d`` (5-d) for BN, GN and RMSNorm, as
    torch's kernels keep it; contiguous for IN and LN, whose torch kernels make the input
    contiguous first; contiguous for any other input."""
    if lay.norm in ("batch", "group", "rms") and not x.is_contiguous():
        for nd, fmt in ((4, torch.channels_last), (5, torch.channels_last_3d)):
            if x.dim() == nd and x.is_contiguous(memory_format=fmt):
                return fmt
    return torch.contiguous_format


class Normalized(NamedTuple):
    """What :func:`normalize_formula` returns: the output and the statistics it used, in the
    layout's view (``keepdim`` shape); ``var`` is the mean square for an uncentered layout."""

    output: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor


# ---------------------------------------------------------------------------------------
# sums
# ---------------------------------------------------------------------------------------
def _known(cond) -> bool:
    """``cond``, or under torch.export's symbolic sizes whether it is known true (no guard)."""
    if isinstance(cond, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true
        return statically_known_true(cond)
    return bool(cond)


def sum_keep(t: torch.Tensor, dims: tuple[int, ...], double: bool = False) -> torch.Tensor:
    """``t.sum(dims, keepdim=True)``, and ``t`` itself when there is nothing to sum;
    ``double``: a float32 ``t``'s sums in float64, not rounded back to float32.

    Over the trailing dims of a large contiguous tensor (LN, IN, GN, WS) the sum is taken
    over the rows of the ``(sets, |S|)`` view: one long row per set is 1.5-2x faster on CPU
    than the same reduction over several dims of a view (measured at (32, 32, 2, 32, 32),
    GroupNorm's view; on small tensors the few extra Python steps cost more than they save).
    """
    if not dims:
        return t.double() if double else t
    nd, k = t.dim(), len(dims)
    if t.dtype == torch.float32:
        # float32 sums as torch's BatchNorm takes them: each row of trailing dims in float32,
        # the rest (BN's batch dim, or a small tensor) in float64
        back = torch.float64 if double else t.dtype
        trailing = _trailing(dims, nd)
        rest = tuple(d for d in sorted(dims) if d not in trailing)
        if rest and trailing:
            return sum_keep(t, trailing).sum(rest, keepdim=True, dtype=torch.float64).to(back)
        if _known(t.numel() <= 1 << 16):
            return t.sum(dims, keepdim=True, dtype=torch.float64).to(back)
    if (_known(t.numel() >= 1 << 15) and tuple(dims) == tuple(range(nd - k, nd))
            and t.is_contiguous()):
        lead = t.shape[:nd - k]                 # the sets as rows of a (sets, |S|) view
        sums = t.reshape(math.prod(lead), -1).sum(1).reshape(lead + (1,) * k)
    else:
        sums = t.sum(dims, keepdim=True)
    return sums.double() if double else sums


def sum_of_products(a: torch.Tensor, b: torch.Tensor, dims: tuple[int, ...],
                    out: torch.Tensor | None = None, double: bool = False) -> torch.Tensor:
    """``(a * b).sum(dims, keepdim=True)``; the product, where it is formed, goes into ``out``
    (a spare tensor of ``a``'s shape) when given.  ``double`` (with ``out`` only): float32
    sums returned in float64 (:func:`sum_keep`).

    When ``dims`` are the trailing dims (LN, IN, GN, WS) each set is one row of a
    ``(sets, |S|)`` matrix, and the sum is a row reduction: ``torch.linalg.vecdot`` of the
    rows, or for ``a is b`` (a sum of squares) squared 2-norms (:func:`sum_of_squares`),
    fused reductions that never write the product (measured 13x faster than a batch of
    ``bmm`` dot products and 2x faster than ``(a * a).sum``, at (2048, 512) on one thread).
    ``vecdot`` writes the product to a
    temporary on CPU, so with ``out`` the product goes there instead (a fresh full-size
    temporary costs page faults).  BN's dims ``(0, 2, 3, ...)`` are not contiguous (a row
    view would need a permuted copy), so there the product is formed and summed.
    """
    nd, k = a.dim(), len(dims)
    if out is not None:
        return sum_keep(torch.mul(a, b, out=out), dims, double)
    if k == 0:
        return torch.mul(a, b)
    if tuple(dims) == tuple(range(nd - k, nd)) and a.shape == b.shape:
        lead, n = a.shape[:nd - k], math.prod(a.shape[nd - k:])
        rows = a.reshape(-1, n)
        if a is b:
            sums = sum_of_squares(rows)
        else:
            sums = torch.linalg.vecdot(rows, b.reshape(-1, n), dim=-1)
        return sums.reshape(lead + (1,) * k)
    trail = _trailing(dims, nd)
    if a is b and a.dtype == torch.float32 and trail and a.is_contiguous() \
            and _known(a.numel() >= 1 << 15):
        # BN: the squares of each row of trailing dims by chunks, the rest summed in float64
        # (the float32 sum over (0, 2, 3) was off by 3.4 roundings, the output by as much)
        lead = a.shape[:nd - len(trail)]
        sums = sum_of_squares(a.reshape(-1, math.prod(a.shape[nd - len(trail):])))
        rest = tuple(d for d in dims if d not in trail)
        return sums.reshape(lead + (1,) * len(trail)).sum(
            rest, keepdim=True, dtype=torch.float64).to(a.dtype)
    return (a * b).sum(dims, keepdim=True)


def _trailing(dims: tuple[int, ...], nd: int) -> tuple[int, ...]:
    """The dims of ``dims`` that end the shape without a gap: ``(2, 3)`` of ``(0, 2, 3)``."""
    sd, j = sorted(dims), len(dims)
    while j > 0 and sd[j - 1] == nd - (len(dims) - j) - 1:
        j -= 1
    return tuple(sd[j:])


def sum_of_squares(rows: torch.Tensor, precise: bool = False,
                   exact: bool = False, double: bool = False) -> torch.Tensor:
    """The sum of squares of each row of a contiguous ``(R, n)``: ``vector_norm(...) ** 2``
    over chunks of at most 256 values, whose squares are then summed (for float32 in float64:
    squaring the rounded norms and summing them in float32 was 2-3 roundings of the sum).
    ``vector_norm`` accumulates sequentially in float32 (no pairwise summation): over one long
    set (a LayerNorm over (C, H, W), 65536 values) its error was 4x torch's, over an
    InstanceNorm set of 1024 values 2x.  A long row that cannot be cut into equal chunks is
    summed by ``vecdot`` (pairwise; writes the squares).

    For float32 rows, ``precise`` takes chunks of 64 values and returns the sums in float64
    (about the time of chunks of 256; measured at (2048, 1024) and (256, 8192): 1.2 and 0.3
    roundings of the sum, where chunks of 256 were 2.3 and 0.8); ``exact`` sums each row in
    float64 (exact to a rounding of the sum, about 4x the time) and returns float64;
    ``double`` returns the sums of chunks of 256 in float64 (not rounded to float32).  The
    variance is then good enough that r, and every output of its set, carries about one
    rounding."""
    n = rows.shape[-1]
    single = rows.dtype == torch.float32
    if exact and single:
        return torch.linalg.vector_norm(rows, dim=-1, dtype=torch.float64).square()
    precise = precise and single
    back = torch.float64 if (precise or double) and single else rows.dtype
    size = 64 if precise else 256
    if n <= size:
        norms = torch.linalg.vector_norm(rows, dim=-1)
        return norms.double().square().to(back) if single else norms.square()
    chunk = next((c for c in (size, 128, 64) if n % c == 0 and c <= size), None)
    if chunk is None:
        return torch.linalg.vecdot(rows, rows, dim=-1).to(back)
    parts = torch.linalg.vector_norm(rows.reshape(rows.shape[0], n // chunk, chunk), dim=-1)
    if single:
        return parts.double().square().sum(-1).to(back)
    return parts.square().sum(-1)



def row_sums(rows: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """The sum of each row of a float32 ``(R, n)`` in float64, ``(R, 1)``: by chunks of 256 in
    float32 (or of 128, 64), then in float64 (``exact``, or a row not cut so: the whole row in
    float64, 8x the time; chunks of 64 took twice as long, for no gain in the outputs)."""
    n = rows.shape[1]
    chunk = next((c for c in (256, 128, 64) if n % c == 0), None)
    if exact or chunk is None:
        return torch.sum(rows, 1, keepdim=True, dtype=torch.float64)
    return rows.view(rows.shape[0], n // chunk, chunk).sum(-1).sum(-1, keepdim=True,
                                                                    dtype=torch.float64)


def column_sums(t: torch.Tensor, out: torch.Tensor) -> None:
    """The sums of the columns of ``t`` into ``out`` (float64 for float32 ``t``): by 32 rows
    in float32, then in ``out``'s dtype (measured at (1024, 512): a float32 sum down 1024 rows
    was 2.3 roundings of the largest sum, by 32 rows 0.7, for 1.5x its time; a float64 sum
    down the whole column, 6x)."""
    rows = t.shape[0]
    if out.dtype != t.dtype and rows % 32 == 0 and rows > 32:
        t = t.view(rows // 32, 32, -1).sum(1)
    torch.sum(t, 0, dtype=out.dtype, out=out)

# ---------------------------------------------------------------------------------------
# the steps of the formula
# ---------------------------------------------------------------------------------------
def moments(xv: torch.Tensor, lay: Layout, correction: int = 0,
            out: torch.Tensor | None = None):
    r"""Steps (1)-(2) on the view ``xv``: ``(mu, sigma^2, x - mu)``, the centered values
    written into ``out`` when given (a view of the same shape).

    Two-pass: the mean, then the centered values, then the sum of their squares as one
    contraction (exact up to rounding; :math:`E[x^2]-E[x]^2` would cancel catastrophically
    when :math:`|\mu| \gg \sigma`).  Uncentered layouts (RMSNorm): :math:`\mu = 0`, the
    mean square, and ``x`` itself.

    The mean is corrected once (the corrected two-pass algorithm): the rounded mean
    :math:`\tilde\mu` is off by about one rounding of :math:`|\mu|`, which shifts every
    :math:`\hat x` by :math:`u|\mu|/\sigma`: when :math:`|\mu| \gg \sigma` that is the
    whole float32 error (3-5x torch's, whose mean is summed in float64).  The centered values
    :math:`x - \tilde\mu` are nearly exact (the two are close), so their mean
    :math:`\delta` is the error of :math:`\tilde\mu`, found to a rounding of
    :math:`\delta` itself; subtracting it leaves the centered values good to a rounding of
    :math:`x - \mu`.  (:func:`moment_parts` returns :math:`\tilde\mu` and :math:`\delta`
    apart.)
    """
    mean, delta, var, centered = moment_parts(xv, lay, correction, out)
    return (mean if delta is None else mean + delta), var, centered


def moment_parts(xv: torch.Tensor, lay: Layout, correction: int = 0,
                 out: torch.Tensor | None = None):
    """:func:`moments` as ``(mu~, delta, sigma^2, x - mu)``: the rounded mean and its
    correction apart (``delta`` None when uncentered), so that :func:`affine_terms` can
    add them in float64."""
    n = lay.set_size - correction
    if not lay.centered:
        mean = xv.new_zeros(lay.stat_shape)
        return mean, None, sum_of_products(xv, xv, lay.reduce_dims) / n, xv
    mean = sum_keep(xv, lay.reduce_dims) / lay.set_size           # mu, rounded
    centered = torch.sub(xv, mean, out=out)                       # x - mu
    delta = sum_keep(centered, lay.reduce_dims) / lay.set_size    # the rounding error of mu
    centered = centered.sub_(delta) if writes_in_place() else centered - delta
    var = sum_of_products(centered, centered, lay.reduce_dims) / n  # sum (x - mu)^2 / (n - c)
    return mean, delta, var, centered


def inverse_std(var: torch.Tensor, eps: float, eps_mode: str = "inside") -> torch.Tensor:
    """Step (3): ``r = 1 / sqrt(var + eps)``, or ``1 / (sqrt(var) + eps)`` outside.

    A float32 ``var`` is taken through float64 (one value per set: cheap) and ``r`` rounded
    once, as torch's BatchNorm does; float32 ``rsqrt`` is off by one or two roundings, and
    every output of the set carries that relative error."""
    dtype = var.dtype
    if dtype == torch.float32:
        var = var.double()
    if eps_mode == "inside":
        return torch.rsqrt(var + eps).to(dtype)
    if eps_mode == "outside":
        return (1.0 / (var.sqrt() + eps)).to(dtype)
    raise ValueError(f"eps_mode must be 'inside' or 'outside', got {eps_mode!r}")


def scale_is_small(lay: Layout) -> bool:
    r"""True when :math:`\gamma r` (one value per set and per value of gamma) is smaller than
    the input: gamma is constant along a dim of :math:`S` of size > 1 (BN, IN, GN; not LN,
    whose gamma varies along all of :math:`S`).  Then steps (4)-(5) are
    :math:`y = (x-\mu)\,(\gamma r) + \beta`, and :math:`\hat x` is never formed."""
    return any(lay.view_shape[d] > 1 and lay.affine_view_shape[d] == 1 for d in lay.reduce_dims)


def apply_affine(centered: torch.Tensor, inv_std, lay: Layout, weight, bias,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    r"""Steps (4)-(5): ``gamma * (x - mu) * r + beta`` on the view, written into ``out``
    (which may be ``centered`` itself, or a view of a fresh tensor).  ``inv_std=None``:
    ``centered`` is :math:`\hat x` already, and only step (5) is left.

    Where gamma is constant along part of every set (BN, IN, GN: :func:`scale_is_small`),
    ``gamma * r`` is one small ``scale`` per set and channel and the rest is one multiply and
    one add; LayerNorm's gamma (per element) multiplies :math:`\hat x`.  (Out-of-place
    ``addcmul`` with a broadcast beta is several times slower on CPU than a multiply followed
    by an in-place add.)
    """
    cdt = centered.dtype
    w = None if weight is None else weight.to(cdt).reshape(lay.affine_view_shape)
    b = None if bias is None else bias.to(cdt).reshape(lay.affine_view_shape)
    if inv_std is None:
        scale = w                                               # gamma x_hat
    elif w is None or scale_is_small(lay):
        scale = inv_std if w is None else inv_std * w           # (x - mu) * (gamma r)
    else:
        centered = torch.mul(centered, inv_std, out=out)        # x_hat
        scale = w                                               # gamma x_hat (per element)
    if scale is not None and b is not None and out is not None and out is not centered:
        # into a free output: beta, then + (x - mu) * scale as one fused multiply-add (one
        # rounding where multiply-then-add rounds twice: torch's BatchNorm rounds once)
        return out.copy_(b.expand_as(out)).addcmul_(centered, scale)
    if scale is not None:
        y = torch.mul(centered, scale, out=out)
    elif b is not None:
        return torch.add(centered, b, out=out)                  # x_hat + beta
    else:
        y = centered if out is None else out.copy_(centered)    # x_hat
    if b is not None:
        y = y.add_(b)                                           # + beta
    return y


#: a set whose mean is within this many standard deviations of 0 is normalized from x itself
#: (:func:`affine_terms`)
NEAR_ZERO = 2.0


def affine_terms(mean, delta, var, eps: float, affine_shape, weight, bias,
                 uncorrected: bool = False):
    r"""Steps (3)-(5) as per-set factors for :func:`apply_affine_terms`: ``(s_x, s_c, t)``
    with

    .. math::

        y = x\,s_x + \big((x-\mu)\,s_c + t\big), \qquad
        s = \mathrm{fl}(\gamma r), \quad
        (s_x, s_c, t) = \begin{cases} (s, 0, \beta - \mu s) & |\mu| \le 2\sigma \\
                                        (0, s, \beta) & \text{otherwise,}\end{cases}

    each rounded once from float64 (``mean + delta`` is :math:`\mu`, :func:`moment_parts`).
    Gamma and beta are reshaped to ``affine_shape``; gamma must be constant along part of
    every set (:func:`scale_is_small`).  ``uncorrected``: the centered values will be
    :math:`x - \tilde\mu` (the rounded mean, not corrected by ``delta``), and
    :math:`-\delta s` goes into :math:`t` instead.

    Why two forms: the output's error is the sum of the roundings on the way.  From the
    centered values (:math:`(x-\mu) s + \beta`) one of them is the rounding of
    :math:`x - \mu`, which torch's form :math:`x s + (\beta - \mu s)` (x itself, exact)
    does not have; with a fused multiply-add that form rounds :math:`s`, the shift and the
    result only, fewer than torch (which rounds :math:`r` and :math:`\gamma r` apart, and on
    CPUs without FMA the product as well).  But the shift :math:`\mu s` is rounded to
    :math:`u|\mu| s`, which is the whole error when :math:`|\mu| \gg \sigma` (torch's 30-1000x
    ours there); near 0 it is below the other terms.  Measured at (32, 64, 32, 32) on
    N(mu_c, s_c) inputs (BN, IN, GN, 3 seeds) with exact statistics: from the centered
    values 1.27-1.53 roundings of the largest output, beside torch's 1.34-2.34; with the
    split at 2 sigma 1.00-1.44."""
    sdt = mean.dtype
    r = torch.rsqrt(var.double() + eps)
    s = r if weight is None else r * weight.double().reshape(affine_shape)
    s = s.to(sdt).double()                                          # gamma r, rounded once
    b = 0.0 if bias is None else bias.double().reshape(affine_shape)
    if delta is None:                                                # uncentered: x itself
        return s.to(sdt), torch.zeros_like(s, dtype=sdt), (b + torch.zeros_like(s)).to(sdt)
    mu = mean.double() + delta.double()
    near = mu.abs() <= NEAR_ZERO * var.double().sqrt()
    zero = torch.zeros_like(s)
    s_x, s_c = torch.where(near, s, zero), torch.where(near, zero, s)
    t = b - torch.where(near, mu, delta.double() if uncorrected else torch.zeros_like(mu)) * s
    return s_x.to(sdt), s_c.to(sdt), t.to(sdt)


def apply_affine_terms(x: torch.Tensor, centered: torch.Tensor, terms,
                       out: torch.Tensor) -> torch.Tensor:
    """``x s_x + ((x - mu) s_c + t)`` (:func:`affine_terms`) into ``out`` (not ``x``), two
    fused multiply-adds; in eager mode a term whose factor is 0 in every set is skipped (the
    usual case: every set on one side).  ``out`` may be ``centered`` itself: then the
    centered term is a multiply and an add (no free tensor for the fused form)."""
    s_x, s_c, t = terms
    eager = not torch.compiler.is_compiling() and writes_in_place()
    use_c = not eager or bool(s_c.any())
    if out is centered and use_c:
        out.mul_(s_c).add_(t)
    else:
        out.copy_(t.expand_as(out))
        if use_c:
            out.addcmul_(centered, s_c)
    if not eager or bool(s_x.any()):
        out.addcmul_(x, s_x)
    return out


def affine_out_of_place(xhat: torch.Tensor, lay: Layout, weight, bias) -> torch.Tensor:
    """Step (5), ``gamma x_hat + beta`` on the view, in fresh tensors only (for
    ``torch.func``, where :func:`apply_affine`'s in-place add could not take a batched beta)."""
    y = xhat if weight is None else xhat * weight.to(xhat.dtype).reshape(lay.affine_view_shape)
    return y if bias is None else y + bias.to(xhat.dtype).reshape(lay.affine_view_shape)


def normalize_formula(x: torch.Tensor, lay: Layout, eps: float, weight=None, bias=None, *,
                      mean=None, var=None, correction: int = 0,
                      eps_mode: str = "inside") -> Normalized:
    r"""The formula over the sets of ``lay``, differentiable by autograd step by step.

    Given ``mean`` and ``var`` (broadcastable to the view), they are used instead of the
    statistics of ``x``: that is eval mode.  The centering comes first on purpose: folding
    the mean into the shift (``x * scale + (beta - mu * scale)``, one pass fewer) loses
    accuracy when :math:`|\mu_i| \gg \sigma_i`, and a constant input would no longer give
    exactly beta.
    """
    out_dtype = x.dtype
    xv = x.reshape(lay.view_shape).to(compute_dtype(out_dtype))
    delta = None
    if mean is None or var is None:
        mean, delta, var, centered = moment_parts(xv, lay, correction)  # (1)-(2)
    else:
        mean, var = mean.to(xv.dtype), var.to(xv.dtype)
        centered = xv - mean if lay.centered else xv
    inv_std = inverse_std(var, eps, eps_mode)                          # (3)
    # Without autograd, the output is written over `centered` when it is a fresh temporary:
    # one full-size allocation fewer (they cost page faults on CPU), the same arithmetic.
    recording = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, mean, var))
    reuse = not recording and centered is not xv and writes_in_place()
    if reuse and delta is not None and correction == 0 and eps_mode == "inside" \
            and xv.dtype == torch.float32 and x.is_contiguous() and scale_is_small(lay):
        terms = affine_terms(mean, delta, var, eps, lay.affine_view_shape, weight, bias)
        y = apply_affine_terms(xv, centered, terms, out=centered)
        mean = mean + delta
    else:
        if delta is not None:
            mean = mean + delta
        y = apply_affine(centered, inv_std, lay, weight, bias,
                         out=centered if reuse else None)                # (4)-(5)
    return Normalized(y.reshape(lay.shape).to(out_dtype), mean, var)


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


class Standardized(NamedTuple):
    """Steps (1)-(4) of the formula, in the view and the compute dtype."""

    xhat: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor
    inv_std: torch.Tensor


def standardize(x: torch.Tensor, lay: Layout, eps: float, correction: int = 0,
                eps_mode: str = "inside") -> Standardized:
    r""":math:`\hat x = (x - \mu)\,r` (no gamma, no beta), with the statistics it used; the
    forward pass of the hand-derived Functions."""
    xv = x.reshape(lay.view_shape).to(compute_dtype(x.dtype))
    mean, var, centered = moments(xv, lay, correction)
    inv_std = inverse_std(var, eps, eps_mode)
    reuse = centered is not xv and writes_in_place()
    xhat = torch.mul(centered, inv_std, out=centered if reuse else None)
    return Standardized(xhat, mean, var, inv_std)


def ws_grad_input(d, w_hat, inv_std, sum_d, sum_dwhat, n: int, m) -> torch.Tensor:
    r"""Weight Standardization's input gradient (:class:`normcore.grad.WeightStandardize`),
    :math:`r\,(d - \bar d - \hat w \sum d\hat w / m)`, as
    :math:`(d - \bar d)\,r + \hat w\,(-r \sum d\hat w / m)`.  At a zero-initialised
    weight (:math:`\hat w = 0`, :math:`r = 1/\sqrt\epsilon`) the gradient is
    :math:`r (d - \bar d)`: rounding :math:`d - \bar d` once and then the product is as
    accurate as torch's BatchNorm backward (timm's StdConv2d), where the
    :math:`r d - r\bar d` of the activations' fast path was 2.3x less accurate."""
    grad = torch.sub(d, sum_d / n).mul_(inv_std)                # (d - mean d) r
    return grad.addcmul_(w_hat, sum_dwhat * inv_std / (-m))     #   - r w_hat sum(d w_hat) / m


class PositionalApply:
    """``apply`` for an autograd Function called with every argument positional: torch's
    ``Function.apply`` binds the arguments to ``forward``'s signature (``inspect``) on every
    call when ``setup_context`` is defined, about 20 us, a tenth of an eval BatchNorm on a
    small batch.  Under ``torch.compile``, ``torch.func`` transforms, with keyword arguments
    and with fewer arguments than ``forward`` takes (its defaults need the binding), torch's
    ``apply`` runs as it is."""

    @classmethod
    def apply(cls, *args, **kwargs):
        if (kwargs or len(args) != cls.forward.__code__.co_argcount
                or torch.compiler.is_compiling()
                or torch._C._are_functorch_transforms_active()):
            return super().apply(*args, **kwargs)  # type: ignore[misc]
        args = torch._functorch.utils.unwrap_dead_wrappers(args)
        return super(torch.autograd.Function, cls).apply(*args)  # type: ignore[misc]
