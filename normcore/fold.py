r"""Folding an eval-mode BatchNorm into the convolution or linear layer before it.

In eval mode BatchNorm uses stored statistics, so per output channel :math:`c` it is an
affine map of its input :math:`z_c`:

.. math::

    \mathrm{BN}(z)_c = \gamma_c\,\frac{z_c - \hat\mu_c}{\sqrt{\hat\sigma^2_c + \epsilon}} + \beta_c
                    = s_c\, z_c + (\beta_c - s_c\,\hat\mu_c),
    \qquad s_c = \frac{\gamma_c}{\sqrt{\hat\sigma^2_c + \epsilon}} .

If :math:`z = W * x + b` (a convolution or a linear layer), then
:math:`\mathrm{BN}(z)_c = (s_c W_c) * x + s_c (b_c - \hat\mu_c) + \beta_c`: one layer with

.. math::

    W'_c = s_c\, W_c, \qquad b'_c = s_c\,(b_c - \hat\mu_c) + \beta_c .

:func:`fold_bn` builds that layer.  The BN's memory traffic and its per-element
multiply-add disappear at inference.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

__all__ = ["fold_bn", "bn_scale_shift", "fold_ws"]

_FOLDABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def bn_scale_shift(bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The per-channel :math:`s_c` and :math:`\beta_c - s_c\hat\mu_c` of an eval-mode BN."""
    if getattr(bn, "running_mean", None) is None or getattr(bn, "running_var", None) is None:
        raise ValueError(
            f"fold_bn: {type(bn).__name__} has no running statistics "
            f"(track_running_stats=False), so in eval mode it still normalizes with batch "
            f"statistics and is not an affine map; it cannot be folded")
    # (a Module's attributes are typed Tensor | Module: these are a BatchNorm's tensors)
    running_mean, running_var = cast(Tensor, bn.running_mean), cast(Tensor, bn.running_var)
    weight, bias = cast("Tensor | None", bn.weight), cast("Tensor | None", bn.bias)
    with torch.no_grad():
        inv_std = torch.rsqrt(running_var + cast(float, bn.eps))
        scale = inv_std if weight is None else weight * inv_std
        shift = -running_mean * scale
        if bias is not None:
            shift = shift + bias
    return scale, shift


def fold_bn(layer: nn.Module, bn: nn.Module) -> nn.Module:
    """A new layer of ``layer``'s type equal to ``bn(layer(x))`` with ``bn`` in eval mode.

    ``layer`` is a ``Conv1d/2d/3d`` or ``Linear`` (torch's or a subclass, e.g.
    :class:`normcore.nn.WSConv2d` is *not* accepted since its weight is re-standardized
    every call); ``bn`` is a BatchNorm (torch's or normcore's) with running statistics over
    ``layer``'s output channels.  Neither argument is modified.
    """
    if not isinstance(layer, _FOLDABLE) or hasattr(layer, "standardized_weight"):
        raise TypeError(
            f"fold_bn: can fold into Conv1d/Conv2d/Conv3d or Linear, got {type(layer).__name__}")
    out_channels = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    num_features = getattr(bn, "num_features", None)
    if num_features != out_channels:
        raise ValueError(
            f"fold_bn: the BN has num_features={num_features} but the layer has "
            f"{out_channels} output channels; the BN must directly follow this layer")
    scale, shift = bn_scale_shift(bn)
    fused = copy.deepcopy(layer)
    with torch.no_grad():
        w = layer.weight
        # W'_c = s_c W_c: scale along the output-channel dim (dim 0 for Conv and Linear)
        fused.weight.copy_(w * scale.to(w.dtype).reshape((-1,) + (1,) * (w.dim() - 1)))
        b = layer.bias if layer.bias is not None else torch.zeros(out_channels, dtype=w.dtype,
                                                                  device=w.device)
        # b'_c = s_c b_c + (beta_c - s_c mu_c)
        new_bias = (b * scale + shift).to(w.dtype)
        if fused.bias is None:
            fused.bias = nn.Parameter(new_bias)
        else:
            fused.bias.copy_(new_bias)
    return fused


def fold_ws(layer: nn.Module) -> nn.Conv2d:
    """A plain ``torch.nn.Conv2d`` equal to a weight-standardized convolution at inference.

    ``layer`` is a :class:`normcore.nn.WSConv2d` or :class:`normcore.nn.ScaledStdConv2d`
    (anything with ``standardized_weight()`` on top of a ``Conv2d``).  Its standardized
    weight, a constant once training is over, becomes the new layer's ``weight``; stride,
    padding, dilation, groups, padding mode, bias, dtype and device are kept.  The result
    computes the same convolution on the same numbers, and an eval-mode BatchNorm after it
    folds in with :func:`fold_bn`.  ``layer`` is not modified.
    """
    if not isinstance(layer, nn.Conv2d) or not hasattr(layer, "standardized_weight"):
        raise TypeError(
            f"fold_ws: expected a weight-standardized Conv2d (normcore.nn.WSConv2d or "
            f"ScaledStdConv2d), got {type(layer).__name__}")
    w = layer.weight
    # layer's settings, as they are (dict[str, Any]: torch types a Conv2d's sizes as tuples
    # of any length, its constructor wants pairs)
    settings: dict[str, Any] = dict(
        kernel_size=layer.kernel_size, stride=layer.stride, padding=layer.padding,
        dilation=layer.dilation, groups=layer.groups, bias=layer.bias is not None,
        padding_mode=layer.padding_mode, dtype=w.dtype, device=w.device)
    plain = nn.Conv2d(layer.in_channels, layer.out_channels, **settings)
    standardized_weight = cast(Callable[[], Tensor], layer.standardized_weight)
    with torch.no_grad():
        plain.weight.copy_(standardized_weight())
        if layer.bias is not None:
            cast(Tensor, plain.bias).copy_(layer.bias)
    plain.train(layer.training)
    return plain
