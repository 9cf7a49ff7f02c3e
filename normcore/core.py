r"""The numeric core: the one formula in named steps, the reference every other path is held to.

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

Every step is a plain torch op, out of place, with no branch on the data and no value read
back to the host: the same code runs on any device, on ``meta`` tensors, under
``torch.compile``, ``torch.func`` and ``torch.export``.  Nothing here validates arguments
(:mod:`normcore._checks` does) or knows about autograd Functions (:mod:`normcore.grad`).

Two choices make it at least as accurate as torch's fused kernels, and a sample's output
independent of the rest of the batch:

* a float32 input is computed in float64 (:func:`reference_dtype`), and each output rounded
  once, at the end; float16 / bfloat16 in float32, as PyTorch does;
* :func:`set_sum` sums each set on its own: its bits do not depend on the other sets, the
  batch size or the thread count.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from .axes import Layout

LOW_PRECISION = (torch.float16, torch.bfloat16)
#: a set is summed as rows of at most this many values, then the rows' sums (:func:`set_sum`)
ROW = 1024


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs, the input's own dtype otherwise: the dtype of the
    statistics the ops return."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def reference_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype the reference computes in: float64 for float32 (each output and gradient is
    then rounded once, at the end: never less accurate than torch's float32 kernels), float32
    for half precision (as torch), float64 for float64; float32 on MPS, which has no float64."""
    if t.dtype in LOW_PRECISION or (t.dtype == torch.float32 and t.device.type == "mps"):
        return torch.float32
    return torch.float64 if t.dtype == torch.float32 else t.dtype


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


class Standardized(NamedTuple):
    """Steps (1)-(4) of the formula, in the view and the compute dtype."""

    xhat: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor
    inv_std: torch.Tensor


# ---------------------------------------------------------------------------------------
# the sums
# ---------------------------------------------------------------------------------------
@functools.cache
def _row(n: int) -> int:
    """The largest divisor of ``n`` that is at most :data:`ROW` (1 for a prime above it)."""
    return next(k for k in range(min(max(n, 1), ROW), 0, -1) if n % k == 0)


def set_sum(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    r"""``t.sum(dims, keepdim=True)`` in :func:`reference_dtype`, each set on its own.

    The dims that close the shape (all of :math:`S` for LN, RMSNorm, IN, GN, WS; the
    positions for BN) are summed as rows of at most :data:`ROW` values in ``t``'s dtype
    (torch's vectorized sum), then those rows' sums in the reference's dtype, then any other
    dim (BN's batch).  Why not one ``t.sum``: with a single set (a batch of one) torch splits that one
    sum among its threads, and the sample's bits would depend on the batch size; with one row
    sum per output there is always one output per row, which torch computes whole.  And
    ``t.sum(dtype=torch.float64)`` of a float32 tensor converts it first (100x slower)."""
    wide = reference_dtype(t)
    if not dims:
        return t.to(wide)
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return t.sum(dims, keepdim=True).to(wide)          # the compiler orders its own sums
    nd = t.dim()
    k = 0
    while k < len(dims) and nd - 1 - k in dims:
        k += 1                                              # the trailing dims in dims
    rest = tuple(d for d in dims if d < nd - k)
    if not k:
        return t.sum(rest, keepdim=True).to(wide)
    lead, n = t.shape[:nd - k], math.prod(t.shape[nd - k:])
    row = _row(n)
    s = t.reshape(*lead, n // row, row).sum(-1).to(wide).sum(-1)        # rows, then theirs
    s = s.reshape(*lead, *(1,) * k)
    return s.sum(rest, keepdim=True) if rest else s


# ---------------------------------------------------------------------------------------
# the steps of the formula
# ---------------------------------------------------------------------------------------
def moments(xv: torch.Tensor, lay: Layout, correction: int = 0):
    r"""Steps (1)-(2) on the view ``xv``: ``(mu, sigma^2, x - mu)``, two passes (the mean, then
    the squared deviations from it: :math:`E[x^2]-E[x]^2` would cancel catastrophically when
    :math:`|\mu| \gg \sigma`).  Uncentered (RMSNorm): :math:`\mu = 0`, the mean square, and
    ``x`` itself."""
    n, dims = lay.set_size, lay.reduce_dims
    if not lay.centered:
        var = set_sum(xv * xv, dims) / (n - correction)                  # mean square
        return torch.zeros(lay.stat_shape, dtype=xv.dtype, device=xv.device), var, xv
    mean = set_sum(xv, dims) / n                                         # (1)
    centered = xv - mean
    return mean, set_sum(centered * centered, dims) / (n - correction), centered   # (2)


def inverse_std(var: torch.Tensor, eps: float, eps_mode: str = "inside",
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """Step (3): ``r = 1 / sqrt(var + eps)``, or ``1 / (sqrt(var) + eps)`` outside, from
    ``var`` in :func:`reference_dtype` (one value per set: cheap) and rounded once to ``dtype``
    (``var``'s by default), as torch's BatchNorm does."""
    v = var.to(reference_dtype(var))
    if eps_mode == "inside":
        r = torch.rsqrt(v + eps)
    elif eps_mode == "outside":
        r = 1.0 / (v.sqrt() + eps)
    else:
        raise ValueError(f"eps_mode must be 'inside' or 'outside', got {eps_mode!r}")
    return r.to(dtype or var.dtype)


def standardize(x: torch.Tensor, lay: Layout, eps: float, correction: int = 0,
                eps_mode: str = "inside", mean=None, var=None) -> Standardized:
    r"""Steps (1)-(4): :math:`\hat x = (x - \mu)\,r` on the view, with the statistics it used.
    Given ``mean`` and ``var`` (broadcastable to the view: the running statistics), they are
    used instead of those of ``x``: that is eval mode."""
    # contiguous: a reduction over strided memory (channels_last) orders its sums by the
    # strides, and then by the batch size
    xv = x.to(reference_dtype(x), memory_format=torch.contiguous_format).reshape(lay.view_shape)
    if mean is None or var is None:
        mean, var, centered = moments(xv, lay, correction)                # (1)-(2)
    else:
        mean, var = mean.to(xv.dtype), var.to(xv.dtype)
        centered = xv - mean if lay.centered else xv
    inv_std = inverse_std(var, eps, eps_mode, xv.dtype)                   # (3)
    return Standardized(centered * inv_std, mean.to(xv.dtype), var.to(xv.dtype), inv_std)  # (4)


def affine(xhat: torch.Tensor, lay: Layout, weight, bias) -> torch.Tensor:
    r"""Step (5), :math:`\gamma\,\hat x + \beta` on the view, out of place."""
    y = xhat if weight is None else xhat * weight.to(xhat.dtype).reshape(lay.affine_view_shape)
    return y if bias is None else y + bias.to(xhat.dtype).reshape(lay.affine_view_shape)


def normalize_formula(x: torch.Tensor, lay: Layout, eps: float, weight=None, bias=None, *,
                      mean=None, var=None, correction: int = 0,
                      eps_mode: str = "inside") -> Normalized:
    r"""The formula over the sets of ``lay``, differentiable by autograd step by step: steps
    (1)-(4) by :func:`standardize`, step (5) by :func:`affine`.  Given ``mean`` and ``var``
    (broadcastable to the view), they are used instead of the statistics of ``x``: that is
    eval mode.  The output is in the input's dtype, contiguous; the statistics in
    :func:`compute_dtype`."""
    st = standardize(x, lay, eps, correction, eps_mode, mean, var)
    y = affine(st.xhat, lay, weight, bias)
    cdt = compute_dtype(x.dtype)
    return Normalized(y.reshape(lay.shape).to(x.dtype), st.mean.to(cdt), st.var.to(cdt))


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
