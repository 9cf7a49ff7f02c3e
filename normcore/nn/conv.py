"""Convolutions with standardized weights."""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks as checks
from .. import functional as F
from ._fx import traced_as_leaf

__all__ = ["WSConv1d", "WSConv2d", "WSConv3d", "ScaledStdConv2d", "convert_to_ws"]


class _WSConvNd:
    """What WSConv1d/2d/3d share: the convention, ``ws_eps``, and the standardized weight."""

    def _ws_init(self, convention: str, ws_eps: float | None) -> None:
        name = type(self).__name__
        checks.check_convention(convention, name)
        if ws_eps is not None:
            checks.check_eps(ws_eps, name)
        self.ws_eps = ws_eps
        self.convention = convention

    def standardized_weight(self) -> Tensor:
        return F.weight_standardize(self.weight, self.ws_eps, convention=self.convention)

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:   # a leaf under fx, as Conv is
            return leaf
        return self._conv_forward(input, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", convention={self.convention!r}, ws_eps={self.ws_eps}"


class WSConv2d(_WSConvNd, torch.nn.Conv2d):
    """A ``Conv2d`` whose weight is standardized (per output channel) in every forward.

    Same arguments as ``torch.nn.Conv2d`` plus ``ws_eps`` (``None``: the convention's
    default) and ``convention`` (``"original"``, ``"bit"`` or ``"timm"``; see
    :func:`normcore.functional.weight_standardize`).  The stored ``weight`` is the raw one;
    the standardized weight is recomputed each call, so gradients flow through it.
    """

    def __init__(self, *args, ws_eps: float | None = None, convention: str = "original", **kwargs):
        super().__init__(*args, **kwargs)
        self._ws_init(convention, ws_eps)


class WSConv1d(_WSConvNd, torch.nn.Conv1d):
    """:class:`WSConv2d` for ``Conv1d``: each output channel's ``C_in * k`` weights standardized."""

    def __init__(self, *args, ws_eps: float | None = None, convention: str = "original", **kwargs):
        super().__init__(*args, **kwargs)
        self._ws_init(convention, ws_eps)


class WSConv3d(_WSConvNd, torch.nn.Conv3d):
    """:class:`WSConv2d` for ``Conv3d``: each output channel's ``C_in * k_d k_h k_w`` weights
    standardized."""

    def __init__(self, *args, ws_eps: float | None = None, convention: str = "original", **kwargs):
        super().__init__(*args, **kwargs)
        self._ws_init(convention, ws_eps)


_WS_OF = {torch.nn.Conv1d: WSConv1d, torch.nn.Conv2d: WSConv2d, torch.nn.Conv3d: WSConv3d}


def convert_to_ws(module: torch.nn.Module, convention: str = "original",
                  ws_eps: float | None = None) -> torch.nn.Module:
    """Replace every plain ``Conv1d/2d/3d`` in ``module`` by its WS twin, in place, keeping its
    arguments, parameters (the same tensors), device, dtype and train/eval mode; like
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``, return the converted module (a new
    object when ``module`` is itself a Conv).  Subclasses of Conv (already-WS layers,
    ``ScaledStdConv2d``, transposed convs) are left alone."""
    checks.check_convention(convention, "convert_to_ws")
    if ws_eps is not None:
        checks.check_eps(ws_eps, "convert_to_ws")
    cls = _WS_OF.get(type(module))
    if cls is not None:
        m = module
        if m.weight[0].numel() < 2:
            raise ValueError(
                f"convert_to_ws: {m} has a fan-in of 1 (one weight per output channel), which "
                f"weight standardization would set to 0 (or, unbiased, leave undefined); "
                f"convert the model's other layers one by one instead")
        new = cls(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride,
                  padding=m.padding, dilation=m.dilation, groups=m.groups,
                  bias=m.bias is not None, padding_mode=m.padding_mode, device="meta",
                  convention=convention, ws_eps=ws_eps)
        new.weight = m.weight
        new.bias = m.bias
        new.train(m.training)
        return new
    for name, child in module.named_children():
        converted = convert_to_ws(child, convention, ws_eps)
        if converted is not child:
            setattr(module, name, converted)
    return module


def _timm_padding(kernel_size, stride, dilation):
    """timm's ``get_padding``: symmetric padding ``((stride - 1) + dilation * (k - 1)) // 2``
    per spatial dim (so a stride-1 conv with an odd kernel keeps its size)."""
    if any(isinstance(v, (tuple, list)) for v in (kernel_size, stride, dilation)):
        pair = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)  # noqa: E731
        return [_timm_padding(*a) for a in zip(pair(kernel_size), pair(stride), pair(dilation))]
    return ((stride - 1) + dilation * (kernel_size - 1)) // 2


class ScaledStdConv2d(torch.nn.Conv2d):
    r"""A ``Conv2d`` with Scaled Weight Standardization (NF-Nets, Brock et al. 2021).

    In every forward the weight of output channel :math:`c` becomes

    .. math::

        \hat W_c = \mathrm{gain}_c\,\frac{\gamma}{\sqrt{F}}\,
                   \frac{W_c - \mu_c}{\sqrt{\sigma_c^2 + \epsilon}},

    with :math:`\mu_c, \sigma_c^2` the mean and biased variance of its :math:`F = C_{in}k_hk_w`
    weights (``F`` counts one group's input channels when ``groups > 1``).  The arguments,
    defaults and parameter names are those of timm's ``timm.layers.ScaledStdConv2d``:
    ``bias=True``, ``gamma=1.0``, ``eps=1e-6`` (inside the square root), ``gain_init=1.0``,
    ``padding=None`` (timm's symmetric ``((stride - 1) + dilation (k - 1)) // 2``), a learnable
    ``gain`` of shape ``(C_out, 1, 1, 1)``, and ``scale = gamma / sqrt(F)``; so a timm
    ``state_dict`` (``weight``, ``bias``, ``gain``) loads as is.  The standardization is
    :func:`normcore.functional.weight_standardize` with ``convention="timm"``.

    DeepMind's NF-Net code differs slightly: it uses ``eps`` as a floor,
    ``rsqrt(max(var * F, 1e-4))``, rather than adding it under the root.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=None,
                 dilation=1, groups: int = 1, bias: bool = True, gamma: float = 1.0,
                 eps: float = 1e-6, gain_init: float = 1.0, device=None, dtype=None):
        checks.check_eps(eps, "ScaledStdConv2d")
        for name, value in (("gamma", gamma), ("gain_init", gain_init)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"ScaledStdConv2d: {name} must be a number, got {value!r}")
        if padding is None:
            padding = _timm_padding(kernel_size, stride, dilation)
        dd = {"device": device, "dtype": dtype}
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups, bias=bias, **dd)
        self.gamma = float(gamma)
        self.scale = self.gamma * self.weight[0].numel() ** -0.5  # gamma / sqrt(fan-in)
        self.eps = float(eps)
        self.gain_init = float(gain_init)
        self.gain = torch.nn.Parameter(torch.full((self.out_channels, 1, 1, 1), self.gain_init,
                                                  **dd))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if hasattr(self, "gain"):  # not yet there when Conv2d.__init__ calls this
            torch.nn.init.constant_(self.gain, self.gain_init)

    def standardized_weight(self) -> Tensor:
        what = F.weight_standardize(self.weight, self.eps, convention="timm")
        return what * (self.gain * self.scale)

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:   # a leaf under fx, as Conv is
            return leaf
        return self._conv_forward(input, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", gamma={self.gamma}, eps={self.eps}, gain_init={self.gain_init}"
