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
with the same steps: :func:`moments`, :func:`inverse_std`, :func:`apply_affine`; the
sums they take come from :mod:`normcore.passes`.

float16 / bfloat16 inputs are computed in float32 (:func:`compute_dtype`) and the results
cast back, as PyTorch does.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .axes import Layout
from .passes import sum_keep, sum_of_products

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


def scale_and_shift(r: torch.Tensor, mean: torch.Tensor, affine_shape, weight, bias,
                    dtype: torch.dtype):
    r"""``(s, t)`` of :math:`y = x\,s + t`, :math:`s = \mathrm{fl}(\gamma r)` and :math:`t =
    \mathrm{fl}(\beta - \mu s)` each rounded once to ``dtype`` from float64 (``r`` and
    ``mean`` float64; gamma and beta reshaped to ``affine_shape``): :func:`affine_terms`'
    first form, in fewer small steps where every set's mean is known to be near 0."""
    # a float32 factor times a float64 one is taken in float64 (type promotion, exact
    # conversion): the same bits as converting it first, one small op fewer each
    s = (r if weight is None else r * weight.reshape(affine_shape)).to(dtype)
    t = mean * s
    t = -t if bias is None else bias.reshape(affine_shape) - t
    return s, t.to(dtype)


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


#: whether torch's CPU kernels fuse a multiply and an add (``addcmul``) into one rounding: every
#: capability but the generic kernels (``ATEN_CPU_CAPABILITY=default``)
FUSED_MULTIPLY_ADD = torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def ws_grad_input(d, w_hat, inv_std, sum_d, sum_dwhat, n: int, m, out=None) -> torch.Tensor:
    r"""Weight Standardization's input gradient (:class:`normcore.grad.WeightStandardize`),
    :math:`r\,(d - \bar d - \hat w \sum d\hat w / m)`.  At a zero-initialised weight
    (:math:`\hat w = 0`, :math:`r = 1/\sqrt\epsilon`) the gradient is :math:`r (d - \bar
    d)`, where the :math:`r d - r\bar d` of the activations' fast path was 2.3x less accurate
    than torch's BatchNorm backward (timm's StdConv2d).

    A float32 ``w_hat`` with float64 sums (:data:`FUSED_MULTIPLY_ADD`): :math:`\hat w\,k + c`
    with :math:`k = -r\sum d\hat w / m` and :math:`c = -r\bar d` each rounded once from
    float64, then :math:`+\,d\,r` fused, the largest term last and rounded once: 0.35-0.62x
    torch's error on ordinary weights, 0.42-0.89x on zero ones (AVX-512, seeds 0-4), where the
    whole backward in float64 took 1.5 ms of a 1.9 ms forward and backward.  Otherwise
    :math:`(d - \bar d)\,r + \hat w\,k` in ``w_hat``'s dtype: rounding :math:`d - \bar d`
    once, then the product.  ``out``: a spare tensor of ``w_hat``'s shape and dtype."""
    if w_hat.dtype == torch.float32 and sum_d.dtype == torch.float64:
        r = inv_std.double()
        k = (-(r * sum_dwhat) / m).to(torch.float32)
        c = (-(sum_d / n) * r).to(torch.float32)
        return torch.mul(w_hat, k, out=out).add_(c).addcmul_(d, r.to(torch.float32))
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
