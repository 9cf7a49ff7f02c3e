r"""The normalizations as pure functions, written from one formula.

.. math::

    y_i = \gamma\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta

Every function here is a thin wrapper that validates its arguments, asks
:func:`normcore.axes.layout` which elements share :math:`\mu_i, \sigma_i^2`, and calls the
one primitive :func:`normalize`.  The signatures are those of ``torch.nn.functional``.

Conventions, all as in PyTorch:

* the normalization divides by the **biased** variance (:math:`M_2 / n`);
* ``running_var`` is updated with the **unbiased** variance (:math:`M_2 / (n-1)`);
* the update is :math:`r \leftarrow (1-m)\,r + m\,s`, in place;
* float16 / bfloat16 inputs are normalized in float32 and the result cast back.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Sequence

import torch

from . import stats
from .axes import Layout, layout

__all__ = [
    "normalize", "batch_norm", "layer_norm", "instance_norm", "group_norm",
    "weight_standardize", "WS_CONVENTIONS", "rms_norm",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------
# argument checks (shared by every public function)
# ---------------------------------------------------------------------------------------
def check_float(x, name: str, fn: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{fn}: {name} has dtype {x.dtype}, but normalization needs a floating-point "
            f"tensor; convert it first, e.g. {name}.float()")


def check_eps(eps, fn: str) -> None:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{fn}: eps must be a positive number, got {eps!r}")
    if not eps > 0:
        raise ValueError(
            f"{fn}: eps={eps} must be > 0; it keeps 1/sqrt(var + eps) finite when a set has "
            f"zero variance (PyTorch's default is 1e-5)")


def _check_param(p, name: str, shape: tuple[int, ...], fn: str) -> None:
    if p is None:
        return
    check_float(p, name, fn)
    if tuple(p.shape) != tuple(shape):
        raise ValueError(
            f"{fn}: {name} has shape {tuple(p.shape)}, expected {tuple(shape)} "
            f"(one value per {'channel' if len(shape) == 1 else 'element of normalized_shape'})")


def _verify_batch_size(size: torch.Size, fn: str) -> None:
    # the same test and message as torch.nn.functional._verify_batch_size
    n = size[0]
    for s in size[2:]:
        n *= s
    if n == 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {size}. "
            f"({fn}: a batch statistic over one value is that value, so every output would be "
            f"beta; use a batch of at least 2, or eval mode)")


def _verify_spatial_size(size: torch.Size, fn: str) -> None:
    # the same test and message as torch.nn.functional._verify_spatial_size
    n = 1
    for s in size[2:]:
        n *= s
    if n == 1:
        raise ValueError(
            f"Expected more than 1 spatial element when training, got input size {size}. "
            f"({fn}: each instance statistic would be over one value)")


def _momentum_value(momentum, fn: str) -> float:
    if momentum is None:
        raise TypeError(
            f"{fn}: momentum=None (the cumulative average) needs the step count, which a "
            f"function does not keep; pass momentum=1/num_batches_tracked, or use the module "
            f"(normcore.nn), which does this bookkeeping")
    return float(momentum)


# ---------------------------------------------------------------------------------------
# the one primitive
# ---------------------------------------------------------------------------------------
def _sum_of_squares(c: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``(c * c).sum(dims, keepdim=True)``, several times faster on CPU than
    ``torch.var_mean``.

    When ``dims`` are the trailing dims (LN, IN, GN) it is a batch of dot products
    (``torch.bmm``), which never materializes ``c * c``.
    """
    nd, k = c.dim(), len(dims)
    if k == 0:
        return c * c
    if tuple(dims) == tuple(range(nd - k, nd)):
        lead = c.shape[:nd - k]
        flat = c.reshape(-1, 1, math.prod(c.shape[nd - k:]))
        return torch.bmm(flat, flat.transpose(1, 2)).reshape(lead + (1,) * k)
    # BN's dims (0, 2, 3, ...) are not contiguous; an einsum would permute and copy
    return (c * c).sum(dims, keepdim=True)


class Normalized(NamedTuple):
    """What :func:`normalize` returns: the output and the statistics it used (in the view)."""

    output: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor


def normalize(x: torch.Tensor, lay: Layout, eps: float, weight=None, bias=None, *,
              mean=None, var=None, correction: int = 0, eps_mode: str = "inside") -> Normalized:
    r"""Normalize ``x`` over the sets :math:`S_i` of ``lay`` (see :func:`normalize_formula`).

    When autograd will need a gradient of the normalization itself (batch statistics, the
    biased variance, eps inside the sqrt: BN in training, LN, IN, GN), the work goes to
    :class:`normcore.grad.Normalize`, whose forward is :func:`normalize_formula` and whose
    backward is the hand-derived one: two reductions and one fused pass instead of autograd's
    walk back through every step.  It stays differentiable twice (``create_graph=True``).
    """
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias))
    if needs_grad and (mean is None or var is None) and correction == 0 and eps_mode == "inside":
        from .grad import Normalize  # grad imports this module
        return Normalized(*Normalize.apply(x, weight, bias, lay, eps))
    return normalize_formula(x, lay, eps, weight, bias, mean=mean, var=var,
                             correction=correction, eps_mode=eps_mode)


def normalize_formula(x: torch.Tensor, lay: Layout, eps: float, weight=None, bias=None, *,
                      mean=None, var=None, correction: int = 0,
                      eps_mode: str = "inside") -> Normalized:
    r"""Normalize ``x`` over the sets :math:`S_i` described by ``lay``.

    .. math::

        \mu_i = \frac{1}{|S_i|}\sum_{k\in S_i} x_k, \quad
        \sigma_i^2 = \frac{1}{|S_i| - c}\sum_{k\in S_i}(x_k-\mu_i)^2, \quad
        y_i = \gamma\,\frac{x_i-\mu_i}{\sqrt{\sigma_i^2+\epsilon}} + \beta

    with :math:`c` = ``correction`` (0: biased, the normalization layers' choice).
    ``eps_mode="outside"`` uses :math:`(x_i-\mu_i)/(\sigma_i+\epsilon)` instead (the original
    Weight Standardization code).  Given ``mean`` and ``var`` (broadcastable to the view),
    they are used instead of the statistics of ``x``: that is eval mode.

    Implementation: the mean, the centered ``x - mu``, and the variance as one contraction
    of the centered values with themselves (two-pass, so exact up to rounding); then,
    whenever gamma is constant on each set (BN, IN, GN), ``gamma / sqrt(var + eps)`` is
    folded into one small ``scale``
    and the output is ``(x - mu) * scale + beta`` (a subtraction and one fused multiply-add).
    The centering comes first on purpose: folding the mean into the shift as well
    (``x * scale + (beta - mu * scale)``, one pass fewer) loses accuracy when
    :math:`|\mu_i| \gg \sigma_i`, and a constant input would no longer give exactly beta.
    """
    out_dtype = x.dtype
    cdt = torch.float32 if out_dtype in _LOW_PRECISION else out_dtype
    xv = x.reshape(lay.view_shape)
    if xv.dtype != cdt:
        xv = xv.to(cdt)
    if mean is None or var is None:
        mean = xv.mean(lay.reduce_dims, keepdim=True)              # mu
        centered = xv - mean                                       # x - mu
        # sigma^2 = sum (x - mu)^2 / (n - correction): the two-pass variance, exact up to
        # rounding; the sum of squares is one contraction, never a full-size (x - mu)^2
        var = _sum_of_squares(centered, lay.reduce_dims) / (lay.set_size - correction)
    else:
        mean, var = mean.to(cdt), var.to(cdt)
        centered = xv - mean                                       # x - mu
    if eps_mode == "inside":
        inv_std = torch.rsqrt(var + eps)  # 1 / sqrt(var + eps)
    elif eps_mode == "outside":
        inv_std = 1.0 / (var.sqrt() + eps)  # 1 / (std + eps)
    else:
        raise ValueError(f"eps_mode must be 'inside' or 'outside', got {eps_mode!r}")

    w = None if weight is None else weight.to(cdt).reshape(lay.affine_view_shape)
    b = None if bias is None else bias.to(cdt).reshape(lay.affine_view_shape)
    # gamma is constant on every set iff it has size 1 along every reduced dim (BN, IN, GN):
    # then gamma / sqrt(var + eps) is one small tensor and the rest is one multiply-add
    foldable = all(lay.affine_view_shape[d] == 1 for d in lay.reduce_dims)
    # Without autograd, the output is written over `centered`, a fresh temporary: one
    # full-size allocation fewer (they cost page faults on CPU), the same arithmetic.
    recording = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, mean, var))
    out = None if recording else centered
    # (out-of-place torch.addcmul with a broadcast beta is several times slower on CPU than
    # a multiply followed by an in-place add, hence mul + add_)
    if foldable and w is not None:
        scale = inv_std * w                                     # gamma / sqrt(var + eps)
        y = torch.mul(centered, scale, out=out)                 # (x - mu) * scale
    else:
        y = torch.mul(centered, inv_std, out=out)               # x_hat
        if w is not None:                                       # LayerNorm: gamma per element
            y = torch.mul(y, w, out=out)                        # gamma * x_hat
    if b is not None:
        y = y.add_(b)                                           # + beta
    return Normalized(y.reshape(lay.shape).to(out_dtype), mean, var)


# ---------------------------------------------------------------------------------------
# validation: each public op's checks, once, returning its Layout (grad.py uses them too)
# ---------------------------------------------------------------------------------------
def _check_nc(input, fn: str, min_dim: int = 2) -> int:
    if input.dim() < min_dim:
        if min_dim == 2:
            raise ValueError(
                f"{fn}: expected an input of shape (N, C, *), got shape {tuple(input.shape)}")
        raise ValueError(
            f"{fn}: expected an input of shape (N, C, *spatial) with at least one spatial dim, "
            f"got shape {tuple(input.shape)}")
    return input.shape[1]


def _per_channel_layout(norm, input, weight, bias, eps, fn, running_mean, running_var,
                        momentum, min_dim) -> Layout:
    check_float(input, "input", fn)
    check_eps(eps, fn)
    stats.check_momentum(momentum)
    C = _check_nc(input, fn, min_dim)
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        _check_param(t, name, (C,), fn)
    return layout(norm, input.shape)


def batch_norm_layout(input, weight=None, bias=None, eps=1e-5, fn="batch_norm",
                      running_mean=None, running_var=None, momentum=0.1) -> Layout:
    """Check batch_norm's arguments; return its :class:`~normcore.axes.Layout`."""
    return _per_channel_layout("batch", input, weight, bias, eps, fn, running_mean,
                               running_var, momentum, 2)


def instance_norm_layout(input, weight=None, bias=None, eps=1e-5, fn="instance_norm",
                         running_mean=None, running_var=None, momentum=0.1) -> Layout:
    """Check instance_norm's arguments; return its :class:`~normcore.axes.Layout`."""
    return _per_channel_layout("instance", input, weight, bias, eps, fn, running_mean,
                               running_var, momentum, 3)


def layer_norm_layout(input, normalized_shape, weight=None, bias=None, eps=1e-5,
                      fn="layer_norm") -> Layout:
    """Check layer_norm's arguments; return its :class:`~normcore.axes.Layout`."""
    check_float(input, "input", fn)
    check_eps(eps, fn)
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    if k == 0 or input.dim() < k or tuple(input.shape[input.dim() - k:]) != normalized_shape:
        raise ValueError(
            f"{fn}: Given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size "
            f"{list(input.shape)}; normalized_shape must equal the input's last dims")
    _check_param(weight, "weight", normalized_shape, fn)
    _check_param(bias, "bias", normalized_shape, fn)
    return layout("layer", input.shape, normalized_ndim=k)


def group_norm_layout(input, num_groups, weight=None, bias=None, eps=1e-5,
                      fn="group_norm") -> Layout:
    """Check group_norm's arguments; return its :class:`~normcore.axes.Layout`."""
    check_float(input, "input", fn)
    check_eps(eps, fn)
    C = _check_nc(input, fn)
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral):
        raise TypeError(f"{fn}: num_groups must be an int, got {num_groups!r}")
    if num_groups <= 0 or C % num_groups:
        raise ValueError(
            f"{fn}: Expected number of channels in input to be divisible by num_groups, but got "
            f"input of shape {list(input.shape)} and num_groups={num_groups}; "
            f"choose num_groups among the divisors of {C}")
    _check_param(weight, "weight", (C,), fn)
    _check_param(bias, "bias", (C,), fn)
    return layout("group", input.shape, num_groups)


def weight_standardize_setup(weight, eps=None, convention="original", fn="weight_standardize"):
    """Check weight_standardize's arguments; return (layout, eps, convention settings)."""
    check_float(weight, "weight", fn)
    if convention not in WS_CONVENTIONS:
        raise ValueError(
            f"{fn}: unknown convention {convention!r}; choose one of {sorted(WS_CONVENTIONS)}")
    conv = WS_CONVENTIONS[convention]
    eps = conv["eps"] if eps is None else eps
    check_eps(eps, fn)
    if weight.dim() < 2:
        raise ValueError(
            f"{fn}: expected a weight of shape (C_out, C_in, *kernel), got shape {tuple(weight.shape)}")
    lay = layout("layer", weight.shape)
    if conv["correction"] and lay.set_size < 2:
        raise ValueError(
            f"{fn}: the unbiased std needs at least 2 weights per output channel, got {lay.set_size}")
    return lay, eps, conv


def _update_buffers(running_mean, running_var, out: Normalized, lay: Layout, momentum, fn) -> None:
    """In place: r <- (1 - m) r + m s with the batch mean and the *unbiased* batch variance,
    per channel; per-instance statistics (IN) are averaged over the batch first."""
    if running_mean is None and running_var is None:
        return
    if running_mean is None or running_var is None:
        raise ValueError(f"{fn}: give both running_mean and running_var, or neither")
    m = _momentum_value(momentum, fn)
    C = running_mean.shape[0]
    mean = out.mean.detach().reshape(-1, C).mean(0)
    var = stats.unbiased_from_biased(out.var.detach(), lay.set_size).reshape(-1, C).mean(0)
    stats.ema_update_(running_mean, mean, m)
    stats.ema_update_(running_var, var, m)


# ---------------------------------------------------------------------------------------
# batch norm
# ---------------------------------------------------------------------------------------
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    r"""Batch normalization (Ioffe & Szegedy 2015): one :math:`\mu, \sigma^2` per channel,
    over the batch and every spatial position.

    ``training=True``: normalize with the batch's biased variance, and if running buffers
    are given, update them in place: ``running_mean`` with the batch mean, ``running_var``
    with the batch's *unbiased* variance.  ``training=False``: normalize with the running
    buffers.
    """
    fn = "batch_norm"
    lay = batch_norm_layout(input, weight, bias, eps, fn, running_mean, running_var, momentum)
    return _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                                   training, momentum, eps, fn, _verify_batch_size)


def _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                            use_batch_stats, momentum, eps, fn, verify):
    """BN and IN: batch statistics (and a buffer update), or the buffers' statistics."""
    if not use_batch_stats:
        if running_mean is None or running_var is None:
            raise ValueError(
                f"{fn}: normalizing with the running statistics (training=False, or "
                f"use_input_stats=False) needs both running_mean and running_var")
        shape = lay.affine_view_shape
        return normalize(input, lay, eps, weight, bias, mean=running_mean.reshape(shape),
                         var=running_var.reshape(shape)).output
    verify(input.shape, fn)
    out = normalize(input, lay, eps, weight, bias)
    # IN, as in torch: the buffers get the per-instance statistics averaged over the batch
    _update_buffers(running_mean, running_var, out, lay, momentum, fn)
    return out.output


# ---------------------------------------------------------------------------------------
# instance norm
# ---------------------------------------------------------------------------------------
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5):
    r"""Instance normalization (Ulyanov et al. 2016): one :math:`\mu, \sigma^2` per sample
    and channel, over the spatial positions.

    With ``use_input_stats`` and running buffers, the buffers are updated with the
    per-instance statistics averaged over the batch (as PyTorch does).  With
    ``use_input_stats=False`` the running buffers are used, as in BatchNorm's eval mode.
    """
    fn = "instance_norm"
    lay = instance_norm_layout(input, weight, bias, eps, fn, running_mean, running_var, momentum)
    return _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                                   use_input_stats, momentum, eps, fn, _verify_spatial_size)


# ---------------------------------------------------------------------------------------
# layer norm
# ---------------------------------------------------------------------------------------
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    r"""Layer normalization (Ba et al. 2016): one :math:`\mu, \sigma^2` per leading index,
    over the trailing ``normalized_shape`` dims; gamma and beta have ``normalized_shape``."""
    lay = layer_norm_layout(input, normalized_shape, weight, bias, eps, "layer_norm")
    return normalize(input, lay, eps, weight, bias).output


# ---------------------------------------------------------------------------------------
# group norm
# ---------------------------------------------------------------------------------------
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    r"""Group normalization (Wu & He 2018): one :math:`\mu, \sigma^2` per sample and group of
    ``C // num_groups`` contiguous channels, over those channels and every spatial position;
    gamma and beta are per channel."""
    lay = group_norm_layout(input, num_groups, weight, bias, eps, "group_norm")
    return normalize(input, lay, eps, weight, bias).output


# ---------------------------------------------------------------------------------------
# weight standardization
# ---------------------------------------------------------------------------------------
#: The three conventions in use: (correction, eps_mode, default eps).
WS_CONVENTIONS = {
    # Qiao et al. 2019, reference code: w.std(dim=1) (unbiased) + 1e-5
    "original": dict(correction=1, eps_mode="outside", eps=1e-5),
    # Kolesnikov et al. 2020 (BiT): var_mean(unbiased=False), sqrt(v + 1e-10)
    "bit": dict(correction=0, eps_mode="inside", eps=1e-10),
    # timm StdConv2d: F.batch_norm over the weight (biased), eps=1e-6 inside the sqrt
    "timm": dict(correction=0, eps_mode="inside", eps=1e-6),
}


def weight_standardize(weight, eps=None, *, convention="original"):
    r"""Weight Standardization (Qiao et al. 2019): standardize each output channel of a
    weight ``(C_out, C_in, *kernel)`` over ``(C_in, *kernel)``.

    Three conventions exist, and they differ:

    =============  ====================================  =============================
    convention     formula                               default ``eps``
    =============  ====================================  =============================
    ``original``   :math:`(w-\mu)/(\sigma_{n-1}+\epsilon)`  ``1e-5`` (the default here)
    ``bit``        :math:`(w-\mu)/\sqrt{\sigma_n^2+\epsilon}`  ``1e-10``
    ``timm``       :math:`(w-\mu)/\sqrt{\sigma_n^2+\epsilon}`  ``1e-6``
    =============  ====================================  =============================

    where :math:`\sigma_{n-1}` is the unbiased std and :math:`\sigma_n^2` the biased
    variance.  ``eps=None`` takes the convention's default.  It is a LayerNorm of the weight
    over every dim but the first, without affine parameters; :func:`normalize` does it.
    """
    lay, eps, conv = weight_standardize_setup(weight, eps, convention, "weight_standardize")
    return normalize(weight, lay, eps, correction=conv["correction"], eps_mode=conv["eps_mode"]).output


# ---------------------------------------------------------------------------------------
# RMSNorm (Zhang & Sennrich 2019): BEGIN rms_norm block (check, eps, formula, public op)
# ---------------------------------------------------------------------------------------
def rms_norm_eps(dtype: torch.dtype, eps=None) -> float:
    """The eps RMSNorm adds to the mean square.  ``None`` means the machine epsilon of the
    *compute* dtype, as in torch 2.13 (found by experiment, and so documented there):
    ``finfo(float32).eps`` for float32, float16 and bfloat16 inputs (half inputs are
    computed in float32), ``finfo(float64).eps`` for float64.  Not the eps of a half
    dtype itself (``finfo(float16).eps`` is 8192 times larger)."""
    if eps is None:
        return float(torch.finfo(torch.float32 if dtype in _LOW_PRECISION else dtype).eps)
    return float(eps)


def rms_norm_layout(input, normalized_shape, weight=None, eps=None,
                    fn="rms_norm") -> tuple[Layout, float]:
    """Check rms_norm's arguments; return its :class:`~normcore.axes.Layout` (the sets of
    LayerNorm: the trailing ``normalized_shape`` dims) and the eps to use."""
    check_float(input, "input", fn)
    if eps is not None:
        check_eps(eps, fn)
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    if k == 0:
        raise ValueError(
            f"{fn}: normalized_shape is empty; give the trailing dims to normalize over, "
            f"e.g. normalized_shape={list(input.shape[-1:])} for the last dim")
    if input.dim() < k or tuple(input.shape[input.dim() - k:]) != normalized_shape:
        raise ValueError(
            f"{fn}: Given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size "
            f"{list(input.shape)}; normalized_shape must equal the input's last dims")
    _check_param(weight, "weight", normalized_shape, fn)
    return layout("layer", input.shape, normalized_ndim=k), rms_norm_eps(input.dtype, eps)


def rms_norm_formula(x: torch.Tensor, lay: Layout, eps: float, weight=None):
    r""":math:`y_i = \gamma_i\, x_i\, r_i`, :math:`r_i = 1/\sqrt{\frac{1}{|S_i|}\sum_{k\in S_i}
    x_k^2 + \epsilon}`: returns ``(y, r)`` (``r`` in the view's keepdim shape, compute dtype).

    As torch does it, bit for bit: half inputs are computed in float32, gamma is cast to
    the compute dtype and multiplied before the single rounding back to the input's dtype.
    """
    out_dtype = x.dtype
    cdt = torch.float32 if out_dtype in _LOW_PRECISION else out_dtype
    xv = x.reshape(lay.view_shape)
    if xv.dtype != cdt:
        xv = xv.to(cdt)
    # mean of squares over S_i: one contraction (never a full-size x * x)
    inv_rms = torch.rsqrt(_sum_of_squares(xv, lay.reduce_dims) / lay.set_size + eps)  # r
    y = xv * inv_rms                                                # x r
    if weight is not None:
        y = y.mul_(weight.to(cdt).reshape(lay.affine_view_shape))  # gamma x r
    return y.reshape(lay.shape).to(out_dtype), inv_rms


def rms_norm(input, normalized_shape, weight=None, eps=None):
    r"""Root-mean-square normalization (Zhang & Sennrich 2019): LayerNorm without the mean
    and without beta, over the trailing ``normalized_shape`` dims.

    .. math:: y = \gamma \, x / \sqrt{\operatorname{mean}_{S}(x^2) + \epsilon}

    The signature and results of ``torch.nn.functional.rms_norm``; ``eps=None`` is the
    machine epsilon of the compute dtype (:func:`rms_norm_eps`).  Unlike torch, ``eps``
    must be > 0 when given.  With gradients, the backward is the hand-derived one of
    :class:`normcore.grad.RMSNormalize`.
    """
    lay, eps = rms_norm_layout(input, normalized_shape, weight, eps, "rms_norm")
    if torch.is_grad_enabled() and (input.requires_grad
                                    or (weight is not None and weight.requires_grad)):
        from .grad import RMSNormalize  # grad imports this module
        return RMSNormalize.apply(input, weight, lay, eps)
    return rms_norm_formula(input, lay, eps, weight)[0]
# ---------------------------------------------------------------------------------------
# END rms_norm block
# ---------------------------------------------------------------------------------------
