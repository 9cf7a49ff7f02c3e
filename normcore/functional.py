r"""The normalizations as pure functions, written from one formula.

.. math::

    y_i = \gamma\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta

Every function here validates its arguments (:mod:`normcore._checks`, which asks
:func:`normcore.axes.layout` which elements share :math:`\mu_i, \sigma_i^2`), and computes
with the one primitive :func:`normalize`.  The signatures are those of
``torch.nn.functional``, and so are the defaults (:mod:`normcore.defaults`).

Conventions, all as in PyTorch:

* the normalization divides by the **biased** variance (:math:`M_2 / K`);
* ``running_var`` is updated with the **unbiased** variance (:math:`M_2 / (K-1)`);
* the update is :math:`\hat\theta \leftarrow (1-\alpha)\,\hat\theta + \alpha\,\theta`, in
  place, with :math:`\alpha` = ``momentum``;
* float16 / bfloat16 inputs are normalized in float32 and the result cast back.

Dispatch, and the one keyword-only argument ``backward`` that every op takes (PyTorch's
functions have no such argument):

* ``backward="derived"`` (the default): when autograd will need a gradient, the work goes to
  the hand-derived Functions of :mod:`normcore.grad` (:class:`~normcore.grad.Normalize`,
  :class:`~normcore.grad.WeightStandardize`) and :mod:`normcore.grad_dyt`
  (:class:`~normcore.grad_dyt.DyTFunction`), whose backward is the boxed formula;
* ``backward="autograd"``: autograd differentiates the formula of :mod:`normcore.core`
  (:func:`~normcore.core.normalize_formula`, :func:`~normcore.grad_dyt.dyt_formula`) step by
  step: the readable reference that the derived backward is held to.

The two give the same outputs and the same gradients (to rounding).  Without a gradient to
compute, both run the formula, which writes its output over its own temporaries.  (One op
per name: ``normcore.grad`` holds the Functions and the derivation, not a second
``layer_norm``.)

Bad arguments raise an error that is an instance of PyTorch's type for the same mistake and
also a ``ValueError`` or ``TypeError`` (:mod:`normcore.errors`), with a message that says
what was given and what to do.  The deliberate differences from PyTorch are listed, each
with its reason, on the book's page "Where normcore differs from PyTorch, on purpose".

:func:`dyt` (Dynamic Tanh) normalizes nothing: it is the element-wise layer that Zhu et al.
(2025) put where LayerNorm was, :math:`\gamma \tanh(\alpha_{\mathrm{DyT}} x) + \beta`.
:func:`~normcore.core.normalize_formula` and :class:`~normcore.core.Normalized` (what
:func:`normalize` returns) live in :mod:`normcore.core`; they can be imported from here too.

Examples:
    >>> import normcore.functional as F
    >>> x = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    >>> grads = [torch.autograd.grad(F.layer_norm(x, (5,), backward=b).pow(3).sum(), x)[0]
    ...          for b in ("derived", "autograd")]
    >>> torch.allclose(grads[0], grads[1], rtol=0, atol=1e-12)
    True
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch
from torch import Tensor

from . import _checks as checks
from . import axes, dispatch, frozen, kernels, stats
from ._checks import WS_CONVENTIONS
from ._functional_docs import documented  # the ops' docstrings, in torch's form, are there
from .axes import Layout
from .core import Normalized, compute_dtype, normalize_formula, output_format
from .defaults import EPS, MOMENTUM
from .frozen import FixedStatistics
from .grad import Normalize, WeightStandardize
from .grad_dyt import DyTFunction, dyt_formula

__all__ = [
    "normalize", "batch_norm", "layer_norm", "instance_norm", "group_norm", "rms_norm",
    "weight_standardize", "WS_CONVENTIONS",
]


def _derived(backward: str, *tensors: Tensor | None) -> bool:
    """Whether to run the hand-derived Function: ``backward="derived"`` and a gradient to
    compute.  Not while torch.jit.trace records: it would record a Function as one opaque
    call with the layout (the input's sizes) as constants; the formula's ops keep the sizes
    traced."""
    return (backward == "derived" and torch.is_grad_enabled() and not torch.jit.is_tracing()
            and any(t is not None and t.requires_grad for t in tensors))


@documented
def normalize(x: Tensor, lay: Layout, eps: float, weight: Tensor | None = None,
              bias: Tensor | None = None, *, mean: Tensor | None = None,
              var: Tensor | None = None, correction: int = 0, eps_mode: str = "inside",
              backward: str = "derived") -> Normalized:
    caller = "normalize"
    checks.check_float(x, "x", caller)
    checks.check_eps(eps, caller, allow_zero=True)
    checks.check_layout(lay, x, caller)
    checks.check_param(weight, "weight", lay.affine_shape, caller, x)
    checks.check_param(bias, "bias", lay.affine_shape, caller, x)
    checks.check_backward(backward, caller)
    return _normalize(x, lay, eps, weight, bias, mean=mean, var=var, correction=correction,
                      eps_mode=eps_mode, backward=backward)


def _normalize(x: Tensor, lay: Layout, eps: float, weight: Tensor | None = None,
               bias: Tensor | None = None, *, mean: Tensor | None = None,
               var: Tensor | None = None, correction: int = 0, eps_mode: str = "inside",
               backward: str = "derived") -> Normalized:
    """:func:`normalize` on checked arguments (the ops below check their own).  With a
    gradient to compute, the Function of :mod:`normcore.grad` (which
    :func:`normcore.dispatch.family` sends to the reference or the kernels); without, the
    kernels where the table has them, else the formula."""
    fmt = output_format(lay, x)
    if backward == "derived" and (mean is None or var is None) and correction == 0 \
            and eps_mode == "inside":
        if _derived(backward, x, weight, bias):
            return Normalized(*Normalize.apply(x, weight, bias, lay, eps)[:3])
        family = dispatch.family(lay, x)
        if family is not None:
            return Normalized(*kernels.forward(family, x, weight, bias, lay, eps)[:3])
    out = normalize_formula(x, lay, eps, weight, bias, mean=mean, var=var,
                            correction=correction, eps_mode=eps_mode)
    # the memory format of torch's output (the formula's is contiguous)
    return out._replace(output=out.output.contiguous(memory_format=fmt))


# ---------------------------------------------------------------------------------------
# batch norm and instance norm: batch statistics (and a buffer update), or the buffers'
# ---------------------------------------------------------------------------------------
def _update_buffers(running_mean: Tensor | None, running_var: Tensor | None, out: Normalized,
                    lay: Layout, momentum: float | None, caller: str) -> None:
    """In place: r <- (1 - m) r + m s with the batch mean and the *unbiased* batch variance,
    per channel; per-instance statistics (IN) are averaged over the batch first."""
    if running_mean is None or running_var is None:   # both or neither: checked in _checks
        return
    m = checks.momentum_value(momentum, caller)
    C = running_mean.shape[0]
    mean = out.mean.detach().reshape(-1, C).mean(0)
    var = stats.unbiased_from_biased(out.var.detach(), lay.set_size).reshape(-1, C).mean(0)
    stats.ema_update_(running_mean, mean, m)
    stats.ema_update_(running_var, var, m)


def _normalize_with_buffers(input: Tensor, lay: Layout, running_mean: Tensor | None,
                            running_var: Tensor | None, weight: Tensor | None,
                            bias: Tensor | None, use_batch_stats: bool, momentum: float | None,
                            eps: float, caller: str, verify: Callable[[torch.Size, str], None],
                            backward: str) -> Tensor:
    if not use_batch_stats:
        checks.check_running_stats_given(running_mean, running_var, caller)
        assert running_mean is not None and running_var is not None   # (checked just above)
        checks.check_running_stats_constant(running_mean, running_var, caller)
        shape = lay.affine_view_shape
        mean, var = running_mean.reshape(shape), running_var.reshape(shape)
        if backward == "derived" and frozen.applies(input):
            # an affine map per channel, with torch's two full-size tensors (normcore.frozen)
            return FixedStatistics.apply(input, mean, var, weight, bias, lay, eps)[0]
        return _normalize(input, lay, eps, weight, bias, mean=mean, var=var,
                          backward=backward).output
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


def _empty_output(input: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """The output for an empty input: empty, in the input's dtype, and connected to the
    inputs that carry gradients (whose gradients are then zeros, as torch's)."""
    out = input.clone()
    for p in (weight, bias):
        if p is not None and p.requires_grad:
            out = out + (p.sum() * 0).to(out.dtype)
    return out


# ---------------------------------------------------------------------------------------
# autocast: the dtypes torch's norms take and give under torch.autocast
# ---------------------------------------------------------------------------------------
#: The norms that torch's autocast runs in float32 (its "fp32" cast policy), per device type,
#: as torch 2.13 registers them (aten/src/ATen/autocast_mode.cpp; CUDA's and XPU's list is
#: AT_FORALL_FP32 in ATen/autocast_mode.h).  Autocast on CPU has none: torch's norms there
#: take the input as it comes, and return its dtype.
FP32_UNDER_AUTOCAST: dict[str, frozenset[str]] = {
    "cuda": frozenset({"layer_norm", "rms_norm", "group_norm"}),
    "xpu": frozenset({"layer_norm", "rms_norm", "group_norm"}),
    "mps": frozenset({"layer_norm", "group_norm", "batch_norm"}),
}

P = ParamSpec("P")
R = TypeVar("R")


def _autocast_like_torch(op: Callable[P, R]) -> Callable[P, R]:
    """Run ``op`` as autocast runs torch's op of the same name.  With autocast on for the
    input's device type, a norm of the fp32 policy there gets its floating-point tensors on
    that device, float64 aside, in float32 (and so returns float32); and every norm runs
    with autocast off, as torch's kernel does (autocast would otherwise cast the torch ops
    inside normcore's, such as a matrix product, to the lower precision)."""
    def cast(t: object, dev: str) -> object:
        if (isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64
                and t.device.type == dev):
            return t.float()
        return t

    @functools.wraps(op)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        x = args[0] if args else kwargs.get("input")
        dev = x.device.type if isinstance(x, Tensor) else None   # not a tensor: op says so
        if dev is None or not (torch.amp.is_autocast_available(dev)
                               and torch.is_autocast_enabled(dev)):
            return op(*args, **kwargs)
        if op.__name__ in FP32_UNDER_AUTOCAST.get(dev, ()):
            args = tuple(cast(a, dev) for a in args)  # type: ignore[assignment]
            kwargs = {k: cast(v, dev) for k, v in kwargs.items()}  # type: ignore[assignment]
        with torch.autocast(dev, enabled=False):
            return op(*args, **kwargs)
    return run


@documented
@_autocast_like_torch
def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None,
               training: bool = False, momentum: float = MOMENTUM, eps: float = EPS, *,
               backward: str = "derived") -> Tensor:
    caller = "batch_norm"
    lay = checks.batch_norm_layout(input, weight, bias, eps, caller, running_mean, running_var,
                                   momentum, backward)
    return _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                                   training, momentum, eps, caller, checks.verify_batch_size,
                                   backward)


@documented
@_autocast_like_torch
def instance_norm(input: Tensor, running_mean: Tensor | None = None,
                  running_var: Tensor | None = None, weight: Tensor | None = None,
                  bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = MOMENTUM, eps: float = EPS, *,
                  backward: str = "derived") -> Tensor:
    caller = "instance_norm"
    lay = checks.instance_norm_layout(input, weight, bias, eps, caller, running_mean, running_var,
                                      momentum, backward)
    return _normalize_with_buffers(input, lay, running_mean, running_var, weight, bias,
                                   use_input_stats, momentum, eps, caller,
                                   checks.verify_spatial_size, backward)


# ---------------------------------------------------------------------------------------
# layer norm, RMS norm, group norm
# ---------------------------------------------------------------------------------------
@documented
@_autocast_like_torch
def layer_norm(input: Tensor, normalized_shape: int | list[int] | tuple[int, ...],
               weight: Tensor | None = None, bias: Tensor | None = None, eps: float = EPS, *,
               backward: str = "derived") -> Tensor:
    lay = checks.layer_norm_layout(input, normalized_shape, weight, bias, eps, "layer_norm",
                                   backward=backward)
    return _normalize(input, lay, eps, weight, bias, backward=backward).output


def rms_eps(eps: float | None, dtype: torch.dtype) -> float:
    r"""RMSNorm's :math:`\epsilon`: ``eps``, or for ``None`` the machine epsilon of the compute
    dtype (float32 for half-precision inputs), as ``torch.nn.functional.rms_norm`` does.

    Examples:
        >>> import normcore.functional as F
        >>> F.rms_eps(None, torch.float16) == torch.finfo(torch.float32).eps
        True
        >>> F.rms_eps(1e-6, torch.float64)
        1e-06
    """
    if eps is not None:
        return float(eps)
    return torch.finfo(compute_dtype(dtype)).eps


@documented
@_autocast_like_torch
def rms_norm(input: Tensor, normalized_shape: int | list[int] | tuple[int, ...],
             weight: Tensor | None = None, eps: float | None = None, *,
             backward: str = "derived") -> Tensor:
    lay = checks.layer_norm_layout(input, normalized_shape, weight, None, eps, "rms_norm",
                                   norm="rms", backward=backward)
    return _normalize(input, lay, rms_eps(eps, input.dtype), weight, backward=backward).output


@documented
@_autocast_like_torch
def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = EPS, *,
               backward: str = "derived") -> Tensor:
    lay = checks.group_norm_layout(input, num_groups, weight, bias, eps, "group_norm", backward)
    return _normalize(input, lay, eps, weight, bias, backward=backward).output


# ---------------------------------------------------------------------------------------
# weight standardization
# ---------------------------------------------------------------------------------------
@documented
def weight_standardize(weight: Tensor, eps: float | None = None, *,
                       convention: str = "original", backward: str = "derived") -> Tensor:
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


@documented
def instance_stats(input: Tensor, eps: float = 0.0,
                   caller: str = "instance_stats") -> tuple[Tensor, Tensor]:
    checks.check_float(input, "input", caller)
    checks.check_nc(input, caller, 3)
    if eps:
        checks.check_eps(eps, caller)
    out = normalize_formula(input, axes.layout("instance", input.shape), 1.0)
    return out.mean, (out.var + eps).sqrt()


@documented
def adaptive_instance_norm(input: Tensor, style: Tensor, alpha: float = 1.0,
                           eps: float = EPS) -> Tensor:
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


@documented
def dyt(input: Tensor, alpha: Tensor, weight: Tensor | None = None,
        bias: Tensor | None = None, *, channels_last: bool = True,
        normalized_shape: int | list[int] | tuple[int, ...] | None = None,
        backward: str = "derived") -> Tensor:
    lay = checks.dyt_layout(input, alpha, weight, bias, channels_last, normalized_shape)
    checks.check_backward(backward, "dyt")
    if _derived(backward, input, alpha, weight, bias):
        return DyTFunction.apply(input, alpha, weight, bias, lay)[0]
    return dyt_formula(input, alpha, weight, bias, lay)
