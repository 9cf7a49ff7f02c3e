"""Argument validation: one check, and one message, per mistake.

Every public op of :mod:`normcore.functional`, the hand-derived Functions' wrappers in
:mod:`normcore.grad`, the modules of :mod:`normcore.nn` and the synchronized statistics of
:mod:`normcore.sync` validate their arguments here.  Each ``*_layout`` validator checks one
op's arguments and returns its :class:`~normcore.axes.Layout` (which elements share
statistics, from :mod:`normcore.axes`); nothing here computes.

Where torch raises for the same mistake, the error is an instance of torch's type (the
classes of :mod:`normcore.errors`: a shape mismatch is a ``ValueError`` *and* a
``RuntimeError``), the message starts with torch's wording where it has one (code that
matches torch's errors keeps working) and then says how to fix it.  One mistake, one type,
whichever op or module makes it.

Two checks live one layer lower, because the layers below this one need them and may not
import it: :func:`normcore.stats.check_momentum` and :func:`normcore.axes.check_num_groups`;
they are re-exported here, and everything above calls them from here.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from . import axes
from .axes import Layout, check_num_groups
from .defaults import EPS, MOMENTUM
from .errors import (ArgumentError, DimsError, DtypeError, EmptyBatchError, NotFloatError,
                     ShapeError)
from .stats import check_momentum

#: ``backward=``: which backward the ops of :mod:`normcore.functional` run.
BACKWARDS = {
    "derived": "the hand-derived Functions of normcore.grad (the default)",
    "autograd": "autograd through the formula of normcore.core (the readable reference)",
}

#: The three Weight Standardization conventions in use: the legal values of ``convention``
#: and what each means (variance correction, where eps goes, eps's default).
WS_CONVENTIONS = {
    # Qiao et al. 2019, reference code: w.std(dim=1) (unbiased) + 1e-5
    "original": dict(correction=1, eps_mode="outside", eps=1e-5),
    # Kolesnikov et al. 2020 (BiT): var_mean(unbiased=False), sqrt(v + 1e-10)
    "bit": dict(correction=0, eps_mode="inside", eps=1e-10),
    # timm StdConv2d: F.batch_norm over the weight (biased), eps=1e-6 inside the sqrt
    "timm": dict(correction=0, eps_mode="inside", eps=1e-6),
}


# ---------------------------------------------------------------------------------------
# single values
# ---------------------------------------------------------------------------------------
def check_float(x: object, name: str, caller: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{caller}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise NotFloatError(
            f"{caller}: {name} has dtype {x.dtype}, but normalization needs a floating-point "
            f"tensor; convert it first, e.g. {name}.float()")


def check_eps(eps: object, caller: str, allow_zero: bool = False) -> None:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{caller}: eps must be a positive number, got {eps!r}")
    if allow_zero and eps == 0:
        return
    if eps <= 0 or eps != eps:
        # torch's BatchNorm says "eps must be positive" (in training; its other norms take
        # any eps): normcore refuses eps <= 0 (and NaN: eps != eps) for every norm, in every
        # mode
        raise ValueError(
            f"{caller}: eps must be positive, got eps={eps} (eps=0 or below makes "
            f"1/sqrt(var + eps) infinite when a set has zero variance); pass eps > 0, e.g. "
            f"PyTorch's default {str(EPS).replace('e-0', 'e-')}")   # 1e-5, as torch writes it


def check_positive_int(value: object, name: str, caller: str) -> int:
    """A size: an int (else TypeError, as torch's), > 0 (else an ArgumentError: torch
    raises RuntimeError for a negative size, and accepts 0, which normcore refuses)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{caller}: {name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ArgumentError(f"{caller}: {name} must be a positive int, got {value!r}")
    return int(value)


def check_backward(backward: object, caller: str) -> None:
    if backward not in BACKWARDS:
        raise ValueError(
            f"{caller}: backward={backward!r}; choose 'derived' (the hand-derived backward, "
            f"the default) or 'autograd' (autograd through the formula)")


def check_layout(lay: object, x: torch.Tensor, caller: str) -> None:
    if not isinstance(lay, Layout):
        raise TypeError(f"{caller}: lay must be a normcore.axes.Layout, got {type(lay).__name__}")
    if tuple(x.shape) != tuple(lay.shape):
        raise ShapeError(
            f"{caller}: x has shape {tuple(x.shape)} but the layout was made for shape {lay.shape}; "
            f"build it with normcore.axes.layout(norm, x.shape, ...)")


def check_dtype(p: torch.Tensor, name: str, input: torch.Tensor, caller: str) -> None:
    """Parameters in the input's dtype, or float32 for a float16 / bfloat16 input: torch's
    rule (it raises "mixed dtype" otherwise).  A float64 module given a float32 input lands
    here."""
    if p.dtype == input.dtype or (p.dtype == torch.float32
                                  and input.dtype in (torch.float16, torch.bfloat16)):
        return
    raise DtypeError(
        f"{caller}: mixed dtype: {name} has dtype {p.dtype} but the input has dtype "
        f"{input.dtype}; parameters and buffers must have the input's dtype (or float32 for a "
        f"float16 / bfloat16 input). Convert one of them: input.to({p.dtype}), or "
        f"module.to({input.dtype})")


def check_running_stats_given(running_mean: torch.Tensor | None,
                              running_var: torch.Tensor | None, caller: str) -> None:
    """Normalizing with the running statistics needs both (torch: RuntimeError)."""
    if running_mean is None or running_var is None:
        raise ArgumentError(
            f"{caller}: normalizing with the running statistics (training=False, or "
            f"use_input_stats=False) needs both running_mean and running_var")


def check_running_stats_constant(running_mean: torch.Tensor, running_var: torch.Tensor,
                                 caller: str) -> None:
    """The running statistics are constants of the map, not inputs to differentiate (torch:
    RuntimeError, 'native_batch_norm is not differentiable with respect to running_mean')."""
    if torch.is_grad_enabled() and (running_mean.requires_grad or running_var.requires_grad):
        raise ArgumentError(
            f"{caller}: running_mean and running_var are buffers, and no gradient reaches "
            f"them; they require grad here: pass running_mean.detach() and "
            f"running_var.detach()")


def check_both_or_neither(running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                          caller: str) -> None:
    """Running buffers come in pairs (torch: ValueError)."""
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{caller}: give both running_mean and running_var, or neither")


def check_empty_batch(input: torch.Tensor, lay: Layout, running_mean: torch.Tensor | None,
                      caller: str) -> None:
    """An empty batch is fine (an empty output) unless running buffers would take a mean
    over its instances (InstanceNorm in training): no value to write."""
    if lay.norm == "instance" and running_mean is not None:
        raise EmptyBatchError(
            f"{caller}: the input {tuple(input.shape)} has no instance, so the running "
            f"statistics (the mean over the batch's instances) have no value to take (torch "
            f"writes NaN into them, or raises IndexError with affine=True). Skip empty "
            f"batches, or call with running_mean=None (track_running_stats=False) or in "
            f"eval mode")


def momentum_value(momentum: float | None, caller: str) -> float:
    """A function (unlike a module) keeps no step count, so it cannot do ``momentum=None``."""
    if momentum is None:
        raise TypeError(
            f"{caller}: momentum=None (the cumulative average) needs the step count, which a "
            f"function does not keep; pass momentum=1/num_batches_tracked, or use the module "
            f"(normcore.nn), which does this bookkeeping")
    return float(momentum)


def check_param(p: torch.Tensor | None, name: str, shape: tuple[int, ...], caller: str,
                input: torch.Tensor | None = None) -> None:
    """A parameter or buffer: floating, of ``shape``, and (``input`` given) of a dtype that
    goes with the input's (:func:`check_dtype`)."""
    if p is None:
        return
    check_float(p, name, caller)
    if tuple(p.shape) != tuple(shape):
        per = "channel of the input" if len(shape) == 1 else "element of normalized_shape"
        raise ShapeError(
            f"{caller}: {name} has shape {tuple(p.shape)}, expected {tuple(shape)} (one value "
            f"per {per}); give {name} that shape, or an input that matches it")
    if input is not None:
        check_dtype(p, name, input, caller)


def verify_batch_size(size: torch.Size, caller: str) -> None:
    # the same test and message as torch.nn.functional._verify_batch_size
    if size[0] * math.prod(size[2:]) == 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got input size {size}. "
            f"({caller}: a batch statistic over one value is that value, so every output would be "
            f"beta; use a batch of at least 2, or eval mode)")


def verify_spatial_size(size: torch.Size, caller: str) -> None:
    # the same test and message as torch.nn.functional._verify_spatial_size
    if math.prod(size[2:]) == 1:
        raise ValueError(
            f"Expected more than 1 spatial element when training, got input size {size}. "
            f"({caller}: each instance statistic would be over one value)")


def check_nc(input: torch.Tensor, caller: str, min_dim: int = 2) -> int:
    """The channel count of an ``(N, C, *)`` input (``min_dim=3``: at least one spatial dim)."""
    if input.dim() < min_dim:
        if min_dim == 2:
            raise DimsError(
                f"{caller}: expected an input of shape (N, C, *), got shape {tuple(input.shape)}")
        raise DimsError(
            f"{caller}: expected an input of shape (N, C, *spatial) with at least one spatial dim, "
            f"got shape {tuple(input.shape)}")
    return input.shape[1]


def normalized_shape_tuple(normalized_shape: int | Sequence[int], caller: str) -> tuple[int, ...]:
    """``normalized_shape`` (an int, a list or a ``torch.Size``) as a non-empty tuple."""
    # (int for the type checker, which does not know that int is a numbers.Integral)
    if isinstance(normalized_shape, (int, numbers.Integral)):
        normalized_shape = (int(normalized_shape),)
    if (isinstance(normalized_shape, (str, bytes)) or not hasattr(normalized_shape, "__iter__")
            or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool)
                       for s in normalized_shape)):
        raise TypeError(f"{caller}: normalized_shape must be an int or a sequence of ints "
                        f"(the input's last dims), got {normalized_shape!r}")
    shape = tuple(int(s) for s in normalized_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ArgumentError(f"{caller}: normalized_shape must be non-empty and positive, "
                         f"got {normalized_shape!r}")
    return shape


# ---------------------------------------------------------------------------------------
# each op's arguments -> its Layout
# ---------------------------------------------------------------------------------------
def _per_channel_layout(norm: str, input: torch.Tensor, weight: torch.Tensor | None,
                        bias: torch.Tensor | None, eps: float, caller: str,
                        running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                        momentum: float | None, min_dim: int, backward: str) -> Layout:
    check_float(input, "input", caller)
    check_eps(eps, caller)
    check_momentum(momentum)
    check_backward(backward, caller)
    check_both_or_neither(running_mean, running_var, caller)
    C = check_nc(input, caller, min_dim)
    # torch holds BN's running buffers to the input's dtype, not IN's
    buffers_input = input if norm == "batch" else None
    for name, t, like in (("running_mean", running_mean, buffers_input),
                          ("running_var", running_var, buffers_input),
                          ("weight", weight, input), ("bias", bias, input)):
        check_param(t, name, (C,), caller, like)
    return axes.layout(norm, input.shape)


def batch_norm_layout(input: torch.Tensor, weight: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None, eps: float = EPS,
                      caller: str = "batch_norm", running_mean: torch.Tensor | None = None,
                      running_var: torch.Tensor | None = None, momentum: float | None = MOMENTUM,
                      backward: str = "derived") -> Layout:
    """Check batch_norm's arguments; return its :class:`~normcore.axes.Layout`."""
    return _per_channel_layout("batch", input, weight, bias, eps, caller, running_mean,
                               running_var, momentum, 2, backward)


def instance_norm_layout(input: torch.Tensor, weight: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None, eps: float = EPS,
                         caller: str = "instance_norm", running_mean: torch.Tensor | None = None,
                         running_var: torch.Tensor | None = None, momentum: float | None = MOMENTUM,
                         backward: str = "derived") -> Layout:
    """Check instance_norm's arguments; return its :class:`~normcore.axes.Layout`."""
    return _per_channel_layout("instance", input, weight, bias, eps, caller, running_mean,
                               running_var, momentum, 3, backward)


def layer_norm_layout(input: torch.Tensor, normalized_shape: int | Sequence[int],
                      weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                      eps: float | None = EPS, caller: str = "layer_norm", norm: str = "layer",
                      backward: str = "derived") -> Layout:
    """Check layer_norm's (or rms_norm's, ``norm="rms"``) arguments; return the Layout.

    torch's rms_norm takes a weight of another dtype than the input (it falls back to the
    composite formula); its layer_norm does not."""
    check_float(input, "input", caller)
    if eps is not None or norm != "rms":
        check_eps(eps, caller)
    check_backward(backward, caller)
    if isinstance(normalized_shape, (int, numbers.Integral)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    if k == 0 or input.dim() < k or tuple(input.shape[input.dim() - k:]) != normalized_shape:
        raise ShapeError(
            f"{caller}: Given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size "
            f"{list(input.shape)}; normalized_shape must equal the input's last dims")
    like = None if norm == "rms" else input
    check_param(weight, "weight", normalized_shape, caller, like)
    check_param(bias, "bias", normalized_shape, caller, like)
    return axes.layout(norm, input.shape, normalized_ndim=k)


def group_norm_layout(input: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None, eps: float = EPS,
                      caller: str = "group_norm", backward: str = "derived") -> Layout:
    """Check group_norm's arguments; return its :class:`~normcore.axes.Layout`."""
    check_float(input, "input", caller)
    check_eps(eps, caller)
    check_backward(backward, caller)
    C = check_nc(input, caller)
    check_num_groups(num_groups, C, caller, input.shape)
    check_param(weight, "weight", (C,), caller, input)
    check_param(bias, "bias", (C,), caller, input)
    return axes.layout("group", input.shape, int(num_groups))


def adaptive_instance_norm_layout(input: torch.Tensor, style: torch.Tensor, alpha: float,
                                  eps: float, caller: str = "adaptive_instance_norm") -> Layout:
    """Check adaptive_instance_norm's arguments; return the content's InstanceNorm Layout."""
    lay = instance_norm_layout(input, eps=eps, caller=caller)
    check_float(style, "style", caller)
    if style.dim() < 3:
        raise DimsError(
            f"{caller}: expected a style of shape (N, C, *spatial) with at least one spatial dim, "
            f"got shape {tuple(style.shape)}")
    if tuple(style.shape[:2]) != tuple(input.shape[:2]):
        raise ShapeError(
            f"{caller}: content has (N, C) = {tuple(input.shape[:2])} but style has "
            f"{tuple(style.shape[:2])}; each sample's channel c takes the statistics of the "
            f"style's channel c of the same sample, so N and C must agree (the spatial sizes "
            f"may differ). For one style image, use style.expand(N, -1, ...)")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 <= alpha <= 1:
        raise ValueError(f"{caller}: alpha must be a number in [0, 1], got {alpha!r}")
    verify_spatial_size(input.shape, caller)
    verify_spatial_size(style.shape, caller)
    return lay


def check_convention(convention: str, caller: str) -> dict[str, Any]:
    if convention not in WS_CONVENTIONS:
        raise ValueError(
            f"{caller}: unknown convention {convention!r}; choose one of {sorted(WS_CONVENTIONS)}")
    return WS_CONVENTIONS[convention]


def weight_standardize_setup(weight: torch.Tensor, eps: float | None = None,
                             convention: str = "original", caller: str = "weight_standardize",
                             ) -> tuple[Layout, float, dict[str, Any]]:
    """Check weight_standardize's arguments; return (layout, eps, convention settings).

    The set of one output channel's weights is LayerNorm's set over ``(C_in, *kernel)``."""
    check_float(weight, "weight", caller)
    conv = check_convention(convention, caller)
    eps = conv["eps"] if eps is None else eps
    check_eps(eps, caller)
    if weight.dim() < 2:
        raise DimsError(
            f"{caller}: expected a weight of shape (C_out, C_in, *kernel), got shape {tuple(weight.shape)}")
    lay = axes.layout("layer", weight.shape)
    if conv["correction"] and lay.set_size < 2:
        raise ValueError(
            f"{caller}: the unbiased std needs at least 2 weights per output channel, got {lay.set_size}")
    return lay, float(eps), conv


# ---------------------------------------------------------------------------------------
# Dynamic Tanh: no statistics, only where gamma lives
# ---------------------------------------------------------------------------------------
def check_alpha(alpha: torch.Tensor, caller: str) -> None:
    """DyT's alpha: one learned scalar, a floating tensor of shape ``(1,)`` (the paper's
    code) or ``()``."""
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool):
        raise TypeError(
            f"{caller}: alpha must be a torch.Tensor (a learned parameter), got the number "
            f"{alpha!r}; pass torch.tensor([{alpha!r}])")
    check_float(alpha, "alpha", caller)
    if alpha.dim() > 1 or alpha.numel() != 1:
        raise ShapeError(
            f"{caller}: alpha has shape {tuple(alpha.shape)}, expected one scalar of shape (1,) "
            f"(or ()): DyT's alpha is a single number shared by every element; a per-channel "
            f"scale is gamma (weight)")


def check_alpha_init(value: object, caller: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{caller}: alpha_init_value must be a finite number, got {value!r}")
    return float(value)


def dyt_layout(input: torch.Tensor, alpha: torch.Tensor, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, channels_last: bool = True,
               normalized_shape: int | Sequence[int] | None = None,
               caller: str = "dyt") -> Layout | None:
    """Check dyt's arguments; return the :class:`~normcore.axes.Layout` that says where
    gamma and beta live, or None when there are none (and no ``normalized_shape``).

    DyT has no sets :math:`S_i`; it borrows where gamma lives: LayerNorm's (the trailing
    dims, ``channels_last=True``) or BatchNorm's (one per channel of dim 1 of an
    ``(N, C, *)`` input, ``channels_last=False``).  The shape of gamma is
    ``normalized_shape`` when given (the module passes it), else ``weight``'s or ``bias``'s.
    """
    check_float(input, "input", caller)
    check_alpha(alpha, caller)
    if not isinstance(channels_last, bool):
        raise TypeError(f"{caller}: channels_last must be True or False, got {channels_last!r}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            check_float(p, name, caller)
    if normalized_shape is not None:          # (what names gamma's shape, that shape)
        given = ("normalized_shape", normalized_shape_tuple(normalized_shape, caller))
    elif weight is not None:
        given = ("weight", tuple(weight.shape))
    elif bias is not None:
        given = ("bias", tuple(bias.shape))
    else:
        given = None
    if not channels_last:
        C = check_nc(input, caller)
        if given is not None and given[1] != (C,):
            raise ShapeError(
                f"{caller}: {given[0]} has shape {given[1]}, but with channels_last=False gamma "
                f"and beta have one value per channel of dim 1: expected ({C},) for an input of "
                f"shape {tuple(input.shape)}")
        lay = axes.layout("batch", input.shape)
    elif given is None:
        return None
    else:
        name, shape = given
        k = len(shape)
        if k == 0 or input.dim() < k or tuple(input.shape[input.dim() - k:]) != shape:
            hint = (" (an (N, C, *) input with one gamma per channel needs channels_last=False)"
                    if k == 1 and input.dim() >= 2 and input.shape[1] == shape[0] else "")
            raise ShapeError(
                f"{caller}: {name} has shape {shape}, expected input with shape "
                f"[*, {', '.join(map(str, shape))}], but got input of size {list(input.shape)}; "
                f"with channels_last=True gamma and beta match the input's last dims{hint}")
        lay = axes.layout("layer", input.shape, normalized_ndim=k)
    check_param(weight, "weight", lay.affine_shape, caller)
    check_param(bias, "bias", lay.affine_shape, caller)
    return lay
