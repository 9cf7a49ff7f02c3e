r"""The normalizations as pure functions, written from one formula.

.. math::

    y_i = \gamma\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta

Every function here validates its arguments (:mod:`normcore._checks`, which asks
:func:`normcore.axes.layout` which elements share :math:`\mu_i, \sigma_i^2`), and computes
with the one primitive :func:`normalize`.  The signatures are those of
``torch.nn.functional``.

Conventions, all as in PyTorch:

* the normalization divides by the **biased** variance (:math:`M_2 / n`);
* ``running_var`` is updated with the **unbiased** variance (:math:`M_2 / (n-1)`);
* the update is :math:`r \leftarrow (1-m)\,r + m\,s`, in place;
* float16 / bfloat16 inputs are normalized in float32 and the result cast back.

Dispatch, and the one keyword-only argument ``backward`` that every op takes:

* ``backward="derived"`` (the default): when autograd will need a gradient, the work goes to
  the hand-derived Functions of :mod:`normcore.grad` (:class:`~normcore.grad.Normalize`,
  :class:`~normcore.grad.WeightStandardize`) and :mod:`normcore.grad_dyt`
  (:class:`~normcore.grad_dyt.DyTFunction`), whose backward is the boxed formula;
* ``backward="autograd"``: autograd differentiates the formula of :mod:`normcore.core`
  (:func:`~normcore.core.normalize_formula`, :func:`~normcore.grad_dyt.dyt_formula`) step by
  step: the readable reference that the derived backward is held to.

Without a gradient to compute, both run the formula, which writes its output over its own
temporaries.  (One op per name: ``normcore.grad`` holds the Functions and the derivation,
not a second ``layer_norm``.)

:func:`dyt` (Dynamic Tanh) normalizes nothing: it is the element-wise layer that Zhu et al.
(2025) put where LayerNorm was, :math:`\gamma \tanh(\alpha x) + \beta`.
"""
from __future__ import annotations

import torch

from . import _checks as checks
from . import axes, rows, stats
from ._checks import WS_CONVENTIONS
from .axes import Layout
from .core import (Normalized, compute_dtype, group_norm_channels_last, normalize_formula,
                   output_format, writes_in_place)
from .grad import Normalize, WeightStandardize
from .grad_dyt import DyTFunction, dyt_formula

__all__ = [
    "normalize", "normalize_formula", "Normalized", "batch_norm", "layer_norm",
    "instance_norm", "group_norm", "rms_norm", "weight_standardize", "WS_CONVENTIONS",
]


def _derived(backward: str, *tensors) -> bool:
    """Whether to run the hand-derived Function: ``backward="derived"`` and a gradient to
    compute.  Not while torch.jit.trace records: it would record a Function as one opaque
    call with the layout (the input's sizes) as constants; the formula's ops keep the sizes
    traced."""
    return (backward == "derived" and torch.is_grad_enabled() and not torch.jit.is_tracing()
            and any(t is not None and t.requires_grad for t in tensors))


def normalize(x: torch.Tensor, lay: Layout, eps: float, weight=None, bias=None, *,
              mean=None, var=None, correction: int = 0, eps_mode: str = "inside",
              backward: str = "derived") -> Normalized:
    r"""Normalize ``x`` over the sets :math:`S_i` of ``lay`` (see
    :func:`normcore.core.normalize_formula`); returns ``Normalized(output, mean, var)``.

    With ``backward="derived"`` (the default), when autograd will need a gradient of the
    normalization itself (batch statistics, the biased variance, eps inside the sqrt: BN in
    training, LN, IN, GN, RMSNorm), the work goes to :class:`normcore.grad.Normalize`, whose
    backward is the hand-derived one: two reductions and one fused pass instead of
    autograd's walk back through every step.  It stays differentiable twice
    (``create_graph=True``).  ``backward="autograd"`` differentiates the formula instead.
    A large LayerNorm or RMSNorm goes to the Function without gradients too: it computes a
    block of rows at a time (:mod:`normcore.rows`).  GroupNorm on a ``channels_last`` input
    without gradients runs :func:`normcore.core.group_norm_channels_last`.  Outputs take
    torch's memory format (:func:`normcore.core.output_format`).

    The primitive takes ``eps = 0`` (the ops refuse it): the book uses it to show what eps
    is for, and an exercise's "left eps out" variant is this formula with ``eps = 0``.
    """
    caller = "normalize"
    checks.check_float(x, "x", caller)
    checks.check_eps(eps, caller, allow_zero=True)
    checks.check_layout(lay, x, caller)
    checks.check_param(weight, "weight", lay.affine_shape, caller, x)
    checks.check_param(bias, "bias", lay.affine_shape, caller, x)
    checks.check_backward(backward, caller)
    return _normalize(x, lay, eps, weight, bias, mean=mean, var=var, correction=correction,
                      eps_mode=eps_mode, backward=backward)


def _normalize(x, lay, eps, weight=None, bias=None, *, mean=None, var=None, correction=0,
               eps_mode="inside", backward="derived") -> Normalized:
    """:func:`normalize` on checked arguments (the ops below check their own)."""
    derived = _derived(backward, x, weight, bias)
    fmt = output_format(lay, x)
    # a large LN or RMSNorm goes to Normalize without gradients too (normcore.rows), and so
    # does GN, IN, BN on channels_last memory; contiguous GN and IN keep the formula's
    # in-place path, which measured as fast
    by_rows = (backward == "derived" and rows.applies(lay, x)
               and (lay.norm in ("layer", "rms") or not x.is_contiguous()))
    if (lay.norm == "group" and fmt != torch.contiguous_format and mean is None
            and not derived and not by_rows and backward == "derived" and writes_in_place()):
        return group_norm_channels_last(x, lay, eps, weight, bias)
    if ((derived or by_rows) and (mean is None or var is None)
            and correction == 0 and eps_mode == "inside"):
        return Normalized(*Normalize.apply(x, weight, bias, lay, eps)[:3])
    out = normalize_formula(x, lay, eps, weight, bias, mean=mean, var=var,
                            correction=correction, eps_mode=eps_mode)
    # the memory format of torch's output (the formula's follows the input's)
    return out._replace(output=out.output.contiguous(memory_format=fmt))


# ---------------------------------------------------------------------------------------
# batch norm and instance norm: batch statistics (and a buffer update), or the buffers'
# ---------------------------------------------------------------------------------------
def _update_buffers(running_mean, running_var, out: Normalized, lay: Layout, momentum, caller) -> None:
    """In place: r <- (1 - m) r + m s with the batch mean and the *unbiased* batch variance,
    per channel; per-instance statistics (IN) are averaged over the batch first."""
    if running_mean is None:           # both or neither: checked in normcore._checks
        return
    m = checks.momentum_value(momentum, caller)
    C = running_mean.shape[0]
    mean = out.mean.detach().reshape(-1, C).mean(0)
    var = stats.unbiased_from_biased(out.var.detach(), lay.set_size).reshape(-1, C).mean(0)
    stats.ema_update_(running_mean, mean, m)
    stats.ema_update_(running_var, var, m)


def _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                            use_batch_stats, momentum, eps, caller, verify, backward):
    if not use_batch_stats:
        checks.check_running_stats_given(running_mean, running_var, caller)
        shape = lay.affine_view_shape
        return _normalize(input, lay, eps, weight, bias, mean=running_mean.reshape(shape),
                          var=running_var.reshape(shape), backward=backward).output
    verify(input.shape, caller)
    if input.numel() == 0:
        # An empty batch, as torch: an empty output, and the buffers are left as they are
        # (a statistic over no value would write NaN into them).  IN's buffers would take
        # the mean over no instance: that raises (below), as torch's affine IN does.
        checks.check_empty_batch(input, lay, running_mean, caller)
        return _empty_output(input, weight, bias)
    out = _normalize(input, lay, eps, weight, bias, backward=backward)
    # IN, as in torch: the buffers get the per-instance statistics averaged over the batch
    _update_buffers(running_mean, running_var, out, lay, momentum, caller)
    return out.output


def _empty_output(input, weight, bias):
    """The output for an empty input: empty, in the input's dtype, and connected to the
    inputs that carry gradients (whose gradients are then zeros, as torch's)."""
    out = input.clone()
    for p in (weight, bias):
        if p is not None and p.requires_grad:
            out = out + (p.sum() * 0).to(out.dtype)
    return out


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, *, backward="derived"):
    r"""Batch normalization (Ioffe & Szegedy 2015): one :math:`\mu, \sigma^2` per channel,
    over the batch and every spatial position.

    ``training=True``: normalize with the batch's biased variance, and if running buffers
    are given, update them in place: ``running_mean`` with the batch mean, ``running_var``
    with the batch's *unbiased* variance.  ``training=False``: normalize with the running
    buffers.  An empty batch (``N = 0``) gives an empty output and leaves the buffers as
    they are, as torch does.  ``backward``: see the module docstring.
    """
    caller = "batch_norm"
    lay = checks.batch_norm_layout(input, weight, bias, eps, caller, running_mean, running_var,
                                   momentum, backward)
    return _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                                   training, momentum, eps, caller, checks.verify_batch_size,
                                   backward)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5, *, backward="derived"):
    r"""Instance normalization (Ulyanov et al. 2016): one :math:`\mu, \sigma^2` per sample
    and channel, over the spatial positions.

    With ``use_input_stats`` and running buffers, the buffers are updated with the
    per-instance statistics averaged over the batch (as PyTorch does).  With
    ``use_input_stats=False`` the running buffers are used, as in BatchNorm's eval mode.
    An empty batch gives an empty output, except when it would update running buffers
    (their new value would be a mean over no instance): that raises.
    """
    caller = "instance_norm"
    lay = checks.instance_norm_layout(input, weight, bias, eps, caller, running_mean, running_var,
                                      momentum, backward)
    return _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                                   use_input_stats, momentum, eps, caller,
                                   checks.verify_spatial_size, backward)


# ---------------------------------------------------------------------------------------
# layer norm, RMS norm, group norm
# ---------------------------------------------------------------------------------------
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, *,
               backward="derived"):
    r"""Layer normalization (Ba et al. 2016): one :math:`\mu, \sigma^2` per leading index,
    over the trailing ``normalized_shape`` dims; gamma and beta have ``normalized_shape``."""
    lay = checks.layer_norm_layout(input, normalized_shape, weight, bias, eps, "layer_norm",
                                   backward=backward)
    return _normalize(input, lay, eps, weight, bias, backward=backward).output


def rms_eps(eps, dtype: torch.dtype) -> float:
    """RMSNorm's eps: ``eps``, or for ``None`` the machine epsilon of the compute dtype
    (float32 for half-precision inputs), as ``torch.nn.functional.rms_norm`` does."""
    if eps is not None:
        return float(eps)
    return torch.finfo(compute_dtype(dtype)).eps


def rms_norm(input, normalized_shape, weight=None, eps=None, *, backward="derived"):
    r"""RMS normalization (Zhang & Sennrich 2019): LayerNorm's set, no centering, no beta.

    .. math:: y = \gamma\,\frac{x}{\sqrt{\operatorname{mean}_{S}(x^2) + \epsilon}}

    ``eps=None`` takes ``torch.finfo`` of the compute dtype (float32 for half inputs).
    """
    lay = checks.layer_norm_layout(input, normalized_shape, weight, None, eps, "rms_norm",
                                   norm="rms", backward=backward)
    return _normalize(input, lay, rms_eps(eps, input.dtype), weight, backward=backward).output


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, *, backward="derived"):
    r"""Group normalization (Wu & He 2018): one :math:`\mu, \sigma^2` per sample and group of
    ``C // num_groups`` contiguous channels, over those channels and every spatial position;
    gamma and beta are per channel."""
    lay = checks.group_norm_layout(input, num_groups, weight, bias, eps, "group_norm", backward)
    return _normalize(input, lay, eps, weight, bias, backward=backward).output


# ---------------------------------------------------------------------------------------
# weight standardization
# ---------------------------------------------------------------------------------------
def weight_standardize(weight, eps=None, *, convention="original", backward="derived"):
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
    over every dim but the first, without affine parameters.  With a gradient to compute
    (and ``backward="derived"``) it runs :class:`normcore.grad.WeightStandardize` (every
    convention); otherwise the formula.
    """
    lay, eps, conv = checks.weight_standardize_setup(weight, eps, convention)
    checks.check_backward(backward, "weight_standardize")
    if _derived(backward, weight):
        return WeightStandardize.apply(weight, eps, conv["correction"], conv["eps_mode"])[0]
    return normalize_formula(weight, lay, eps, correction=conv["correction"],
                             eps_mode=conv["eps_mode"]).output


# ---------------------------------------------------------------------------------------
# adaptive instance norm (the InstanceNorm chapter)
# ---------------------------------------------------------------------------------------
__all__ += ["adaptive_instance_norm", "instance_stats"]


def instance_stats(input, eps: float = 0.0, caller: str = "instance_stats"):
    r"""Per ``(n, c)`` mean and standard deviation over the spatial dims, shape
    ``(N, C, 1, ...)``: :math:`\mu_{nc}` and :math:`\sqrt{\sigma_{nc}^2 + \epsilon}` with the
    biased variance, from :func:`normalize_formula` over InstanceNorm's sets (so they carry
    gradients).  ``eps=0`` gives the plain standard deviation."""
    checks.check_float(input, "input", caller)
    checks.check_nc(input, caller, 3)
    if eps:
        checks.check_eps(eps, caller)
    out = normalize_formula(input, axes.layout("instance", input.shape), 1.0)
    return out.mean, (out.var + eps).sqrt()


def adaptive_instance_norm(input, style, alpha: float = 1.0, eps: float = 1e-5):
    r"""Adaptive Instance Normalization (Huang & Belongie 2017): give each channel of each
    sample of ``input`` the mean and standard deviation of that channel of ``style``.

    .. math::

        \operatorname{AdaIN}(x, v)_{nc} = s_{nc}(v)\,
            \frac{x_{nc} - \mu_{nc}(x)}{\sqrt{\sigma_{nc}^2(x) + \epsilon}} + \mu_{nc}(v),
        \qquad s_{nc}(v) = \sqrt{\sigma_{nc}^2(v) + \epsilon},

    for content :math:`x` and style :math:`v`, with InstanceNorm's statistics (biased variance,
    over the spatial dims).  :math:`\epsilon` on both sides makes ``AdaIN(x, x) == x``.  With
    ``alpha`` < 1 the output is ``alpha * AdaIN(x, v) + (1 - alpha) * x``, the paper's
    content-style trade-off; for this formula it is the same as interpolating the statistics
    themselves.

    Args:
        input: the content, ``(N, C, *spatial)`` with at least one spatial dim.
        style: ``(N, C, *spatial')``: the same ``N`` and ``C``; its spatial size may differ.
        alpha: in ``[0, 1]``; 1 is full stylization, 0 returns ``input``.
        eps: added to both variances.
    Shape:
        the output has the shape of ``input``.
    """
    caller = "adaptive_instance_norm"
    lay = checks.adaptive_instance_norm_layout(input, style, alpha, eps, caller)
    # float16 / bfloat16 are computed in float32 and cast back, as in normalize
    cdt = compute_dtype(input.dtype)
    xhat = _normalize(input, lay, eps).output.to(cdt)            # (x - mu(x)) / sqrt(var(x) + eps)
    mu_y, s_y = (t.to(cdt) for t in instance_stats(style, eps, caller))     # (N, C, 1, ...)
    y = xhat * s_y + mu_y                                       # s(y) x_hat + mu(y)
    if alpha != 1:
        y = alpha * y + (1 - alpha) * input.to(cdt)
    return y.to(input.dtype)


# ---------------------------------------------------------------------------------------
# Dynamic Tanh (the "do we need normalization at all" chapter)
# ---------------------------------------------------------------------------------------
__all__ += ["dyt"]


def dyt(input, alpha, weight=None, bias=None, *, channels_last: bool = True,
        normalized_shape=None, backward="derived"):
    r"""Dynamic Tanh (Zhu, Chen, He, LeCun & Liu 2025): an element-wise stand-in for
    LayerNorm, with no statistics.

    .. math:: \operatorname{DyT}(x) = \gamma \odot \tanh(\alpha x) + \beta

    Args:
        input: any shape with ``channels_last=True``; ``(N, C, *)`` otherwise.
        alpha: the learned scalar, a tensor of shape ``(1,)`` (as the paper's code keeps it)
            or ``()``.
        weight, bias: gamma and beta, or None.  ``channels_last=True``: the shape of the
            input's trailing dims (LayerNorm's ``normalized_shape``); ``channels_last=False``:
            ``(C,)``, one per channel of dim 1 (the paper's code for ``(N, C, H, W)``
            ConvNeXt inputs, here for any number of spatial dims).
        channels_last: where gamma and beta live (keyword only).
        normalized_shape: optional (keyword only); if given, the input's trailing dims (or
            ``(C,)``) must equal it even without weight and bias.
    Shape:
        the output has the shape and dtype of ``input``; float16 / bfloat16 are computed in
        float32 and cast back.

    With a gradient to compute it runs :class:`normcore.grad_dyt.DyTFunction`, the
    hand-derived backward (``backward="autograd"``: autograd through the formula);
    otherwise the formula, in place on one temporary.
    """
    lay = checks.dyt_layout(input, alpha, weight, bias, channels_last, normalized_shape)
    checks.check_backward(backward, "dyt")
    if _derived(backward, input, alpha, weight, bias):
        return DyTFunction.apply(input, alpha, weight, bias, lay)[0]
    return dyt_formula(input, alpha, weight, bias, lay)
