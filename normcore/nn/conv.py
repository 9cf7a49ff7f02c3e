"""Convolutions with standardized weights: WSConv1d/2d/3d (Qiao et al. 2019) and
ScaledStdConv2d (Brock et al. 2021), and :func:`convert_to_ws`."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor
from torch.nn import Module
from torch.nn.common_types import _size_1_t, _size_2_t, _size_3_t
from torch.nn.modules.conv import _ConvNd

from .. import _checks as checks
from .. import functional as F
from ..defaults import _shown, fill_defaults
from . import _doc
from ._fx import traced_as_leaf

__all__ = ["WSConv1d", "WSConv2d", "WSConv3d", "ScaledStdConv2d", "convert_to_ws"]

PaddingMode = Literal["zeros", "reflect", "replicate", "circular"]

class _WSConvNd(_ConvNd):
    """What WSConv1d/2d/3d share: the convention, ``ws_eps``, and the standardized weight."""

    def _ws_init(self, convention: str, ws_eps: float | None) -> None:
        name = type(self).__name__
        checks.check_convention(convention, name)
        if ws_eps is not None:
            checks.check_eps(ws_eps, name)
        self.ws_eps = ws_eps
        self.convention = convention

    def standardized_weight(self) -> Tensor:
        """:math:`\\hat{\\mathbf{W}}`, the weight the convolution uses (it carries gradients
        to ``weight``)."""
        return F.weight_standardize(self.weight, self.ws_eps, convention=self.convention)

    def forward(self, input: Tensor) -> Tensor:
        """The convolution of ``input`` with the standardized weight."""
        if (leaf := traced_as_leaf(self, input)) is not None:   # a leaf under fx, as Conv is
            return leaf
        return self._conv_forward(input, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", convention={self.convention!r}, ws_eps={self.ws_eps}"


_WS = r"""A ``Conv<<D>>`` whose weight is standardized per output channel in every forward
(Weight Standardization, Qiao et al. 2019).

The filter :math:`\mathbf{W}_c` of output channel :math:`c` holds :math:`F = <<FAN>>`
weights (:math:`C_{\text{in}}` counts one group's input channels when ``groups > 1``); with
:math:`\mu_c` their mean, the convolution uses

.. math::

    \hat{\mathbf{W}}_c = \frac{\mathbf{W}_c - \mu_c}{\sigma_c + \epsilon}
    \quad \text{(original)},

.. math::

    \hat{\mathbf{W}}_c = \frac{\mathbf{W}_c - \mu_c}{\sqrt{\sigma_c^2 + \epsilon}}
    \quad \text{(bit, timm)},

with :math:`\sigma_c` the **unbiased** standard deviation of the filter for the paper's
reference code (``"original"``, :math:`\epsilon` = <<EPS_original>> outside the root) and
:math:`\sigma_c^2` the **biased** variance for BiT (``"bit"``, :math:`\epsilon` =
<<EPS_bit>>) and timm's ``StdConv2d`` (``"timm"``, :math:`\epsilon` = <<EPS_timm>>); see
:func:`normcore.functional.weight_standardize`.  The stored ``weight`` is the raw
:math:`\mathbf{W}`, and :math:`\hat{\mathbf{W}}` is recomputed at each call (in train and
eval mode alike), so the gradient reaches :math:`\mathbf{W}` through the standardization.
``torch.nn`` has no such layer: the arguments before ``ws_eps`` are those of
``torch.nn.Conv<<D>>``, with its defaults, parameters and ``state_dict``.

Args:
    in_channels (int): :math:`C_{\text{in}}`, the input's channels.
    out_channels (int): :math:`C_{\text{out}}`, the output's channels (one filter each).
    kernel_size (int or tuple): the size of the kernel.
    stride (int or tuple): the stride of the convolution. Default: {default}
    padding (int, tuple or str): padding added to every side of the input, or ``"valid"``
        / ``"same"``. Default: {default}
    dilation (int or tuple): the spacing between kernel elements. Default: {default}
    groups (int): the number of blocked connections from input to output channels.
        Default: {default}
    bias (bool): add a learnable bias :math:`b` to the output. Default: {default}
    padding_mode (str): ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``.
        Default: {default}
<<DEVICE_ARGS>>
    ws_eps (float or None): :math:`\epsilon`; ``None`` takes the convention's (above); must
        be positive. Default: {default}
    convention (str): ``"original"``, ``"bit"`` or ``"timm"``, as above. Default: {default}

Shape:
    - Input: <<SHAPE_IN>>
    - Output: <<SHAPE_OUT>>, as for ``torch.nn.Conv<<D>>``

Differs from torch:
<<SCRIPT>>
<<PAGE>>

Examples:
<<EXAMPLES>>
"""
# each convention's default eps, read from its table (normcore._checks.WS_CONVENTIONS)
for _name, _conv in checks.WS_CONVENTIONS.items():
    _WS = _WS.replace(f"<<EPS_{_name}>>", _shown(_conv["eps"]))
del _name, _conv


_WS_PIECES = {"SCRIPT": _doc.SCRIPT, "PAGE": _doc.PAGE,
              "DEVICE_ARGS": _doc.DEVICE_ARGS.replace("and buffers ", "")}


@fill_defaults
class WSConv2d(_WSConvNd, torch.nn.Conv2d):
    __doc__ = _doc.fill(
        _WS, D="2d", FAN=r"C_{\text{in}}\, k_h\, k_w",
        SHAPE_IN=r":math:`(N, C_{\text{in}}, H, W)`",
        SHAPE_OUT=r":math:`(N, C_{\text{out}}, H', W')`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m = nnc.WSConv2d(3, 8, 3, padding=1)
    >>> y = m(torch.randn(2, 3, 16, 16))
    >>> y.shape
    torch.Size([2, 8, 16, 16])
    >>> w = m.standardized_weight().flatten(1)        # per filter: mean 0, unbiased std ~1
    >>> bool(w.mean(1).abs().max() < 1e-5), bool((w.std(1) - 1).abs().max() < 1e-3)
    (True, True)""", **_WS_PIECES)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _size_2_t,
                 stride: _size_2_t = 1, padding: str | _size_2_t = 0, dilation: _size_2_t = 1,
                 groups: int = 1, bias: bool = True, padding_mode: PaddingMode = "zeros",
                 device: Any = None, dtype: torch.dtype | None = None, *,
                 ws_eps: float | None = None, convention: str = "original") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)
        self._ws_init(convention, ws_eps)


@fill_defaults
class WSConv1d(_WSConvNd, torch.nn.Conv1d):
    __doc__ = _doc.fill(
        _WS, D="1d", FAN=r"C_{\text{in}}\, k", SHAPE_IN=r":math:`(N, C_{\text{in}}, L)`",
        SHAPE_OUT=r":math:`(N, C_{\text{out}}, L')`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m = nnc.WSConv1d(4, 6, 5, convention="bit")
    >>> m(torch.randn(2, 4, 32)).shape
    torch.Size([2, 6, 28])
    >>> w = m.standardized_weight().flatten(1)        # "bit": the biased variance is 1
    >>> bool((w.var(1, correction=0) - 1).abs().max() < 1e-3)
    True""", **_WS_PIECES)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _size_1_t,
                 stride: _size_1_t = 1, padding: str | _size_1_t = 0, dilation: _size_1_t = 1,
                 groups: int = 1, bias: bool = True, padding_mode: PaddingMode = "zeros",
                 device: Any = None, dtype: torch.dtype | None = None, *,
                 ws_eps: float | None = None, convention: str = "original") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)
        self._ws_init(convention, ws_eps)


@fill_defaults
class WSConv3d(_WSConvNd, torch.nn.Conv3d):
    __doc__ = _doc.fill(
        _WS, D="3d", FAN=r"C_{\text{in}}\, k_d\, k_h\, k_w",
        SHAPE_IN=r":math:`(N, C_{\text{in}}, D, H, W)`",
        SHAPE_OUT=r":math:`(N, C_{\text{out}}, D', H', W')`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m = nnc.WSConv3d(2, 4, 3, padding=1, ws_eps=1e-4)
    >>> m(torch.randn(1, 2, 6, 8, 8)).shape
    torch.Size([1, 4, 6, 8, 8])""", **_WS_PIECES)

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _size_3_t,
                 stride: _size_3_t = 1, padding: str | _size_3_t = 0, dilation: _size_3_t = 1,
                 groups: int = 1, bias: bool = True, padding_mode: PaddingMode = "zeros",
                 device: Any = None, dtype: torch.dtype | None = None, *,
                 ws_eps: float | None = None, convention: str = "original") -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)
        self._ws_init(convention, ws_eps)


# the constructor of each plain Conv's WS twin, called with the Conv's own arguments
_WS_OF: dict[type[Module], Callable[..., _ConvNd]] = {
    torch.nn.Conv1d: WSConv1d, torch.nn.Conv2d: WSConv2d, torch.nn.Conv3d: WSConv3d}


@fill_defaults
def convert_to_ws(module: Module, convention: str = "original",
                  ws_eps: float | None = None) -> Module:
    r"""Replace every plain ``Conv1d/2d/3d`` of ``module`` by its WS twin, in place.

    Each new :class:`WSConv2d` (or 1d, 3d) keeps the conv's arguments, its parameters (the
    same tensors: an optimizer built before still holds them), device, dtype and train/eval
    mode.  Subclasses of a conv (layers already WS, :class:`ScaledStdConv2d`, transposed
    convolutions) are left alone.  Like ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``,
    it returns the converted module: ``module`` itself, or a new object when ``module`` is a
    conv.

    Args:
        module (nn.Module): the model (or a single conv) to convert.
        convention (str): ``"original"``, ``"bit"`` or ``"timm"`` (see :class:`WSConv2d`).
            Default: {default}
        ws_eps (float or None): :math:`\epsilon` of the standardization; ``None`` takes the
            convention's. Default: {default}

    Returns:
        nn.Module: ``module``, converted (or the new WS conv if ``module`` is a conv).

    Raises:
        ValueError: an unknown ``convention``, ``ws_eps <= 0``, or a conv with one weight
            per output channel (a fan-in of 1), which standardization would set to 0.

    Examples:
        >>> import normcore.nn as nnc
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
        ...                             torch.nn.Conv2d(8, 8, 3))
        >>> weight = model[0].weight
        >>> model = nnc.convert_to_ws(model)
        >>> type(model[0]).__name__, model[0].weight is weight
        ('WSConv2d', True)
    """
    checks.check_convention(convention, "convert_to_ws")
    if ws_eps is not None:
        checks.check_eps(ws_eps, "convert_to_ws")
    cls = _WS_OF.get(type(module))
    if cls is not None and isinstance(module, _ConvNd):
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
        return new.train(m.training)
    for name, child in module.named_children():
        converted = convert_to_ws(child, convention, ws_eps)
        if converted is not child:
            setattr(module, name, converted)
    return module


def _timm_padding(kernel_size: _size_2_t, stride: _size_2_t,
                  dilation: _size_2_t) -> int | tuple[int, int]:
    """timm's ``get_padding``: symmetric padding ``((stride - 1) + dilation * (k - 1)) // 2``
    per spatial dim (so a stride-1 conv with an odd kernel keeps its size)."""
    if isinstance(kernel_size, int) and isinstance(stride, int) and isinstance(dilation, int):
        return ((stride - 1) + dilation * (kernel_size - 1)) // 2
    k, s, d = (v if isinstance(v, tuple) else (v, v) for v in (kernel_size, stride, dilation))
    return (((s[0] - 1) + d[0] * (k[0] - 1)) // 2, ((s[1] - 1) + d[1] * (k[1] - 1)) // 2)


@fill_defaults
class ScaledStdConv2d(torch.nn.Conv2d):
    r"""A ``Conv2d`` with Scaled Weight Standardization (NF-Nets, Brock et al. 2021).

    In every forward the filter :math:`\mathbf{W}_c` of output channel :math:`c`, of
    :math:`F = C_{\text{in}}\, k_h\, k_w` weights (:math:`C_{\text{in}}` counts one group's
    input channels when ``groups > 1``), becomes

    .. math::

        \hat{\mathbf{W}}_c = \mathrm{gain}_c\,\frac{\gamma}{\sqrt{F}}\,
                   \frac{\mathbf{W}_c - \mu_c}{\sqrt{\sigma_c^2 + \epsilon}},

    with :math:`\mu_c` the mean and :math:`\sigma_c^2` the **biased** variance of the filter
    (:func:`normcore.functional.weight_standardize` with ``convention="timm"``), a learnable
    ``gain`` of shape :math:`(C_{\text{out}}, 1, 1, 1)` and the constant
    ``scale`` :math:`= \gamma / \sqrt{F}`.  Train and eval mode compute the same thing.  The
    arguments, defaults and parameter names are those of timm's
    ``timm.layers.ScaledStdConv2d``, so a timm ``state_dict`` (``weight``, ``bias``,
    ``gain``) loads as is; ``torch.nn`` has no such layer.  DeepMind's NF-Net code differs
    slightly: it uses :math:`\epsilon` as a floor, ``rsqrt(max(var * F, 1e-4))``, rather
    than adding it under the root.

    Args:
        in_channels (int): :math:`C_{\text{in}}`, the input's channels.
        out_channels (int): :math:`C_{\text{out}}`, the output's channels.
        kernel_size (int or tuple): the size of the kernel.
        stride (int or tuple): the stride of the convolution. Default: {default}
        padding (int, tuple, str or None): as in ``torch.nn.Conv2d``; ``None`` for timm's
            symmetric ``((stride - 1) + dilation * (k - 1)) // 2`` per dim (a stride-1 conv
            with an odd kernel keeps the input's size). Default: {default}
        dilation (int or tuple): the spacing between kernel elements. Default: {default}
        groups (int): the number of blocked connections from input to output channels.
            Default: {default}
        bias (bool): add a learnable bias to the output. Default: {default}
        gamma (float): :math:`\gamma`, the gain of the activation function that follows
            (NF-Nets' :math:`1/\mathrm{std}` of the nonlinearity). Default: {default}
        eps (float): :math:`\epsilon`, added to the variance under the square root; must be
            positive. Default: {default}
        gain_init (float): the initial value of every ``gain``. Default: {default}
        device (torch.device or None): where the parameters are made. Default: {default}
        dtype (torch.dtype or None): their dtype. Default: {default}

    Shape:
        - Input: :math:`(N, C_{\text{in}}, H, W)`
        - Output: :math:`(N, C_{\text{out}}, H', W')`, as for ``torch.nn.Conv2d``

    Differs from torch:
        - ``torch.jit.script`` raises a ``TypeError`` that names what works instead:
          ``torch.compile``, ``torch.export.export`` and ``torch.jit.trace``.

        See the book's page "Where normcore differs from PyTorch, on purpose".

    Examples:
        >>> import normcore.nn as nnc
        >>> m = nnc.ScaledStdConv2d(16, 32, 3)          # padding None: the size is kept
        >>> m(torch.randn(2, 16, 8, 8)).shape
        torch.Size([2, 32, 8, 8])
        >>> sorted(m.state_dict())                      # timm's names
        ['bias', 'gain', 'weight']
        >>> w = m.standardized_weight().flatten(1)      # gain 1: each filter's norm is gamma
        >>> bool((w.norm(dim=1) - m.gamma).abs().max() < 1e-3)
        True
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _size_2_t,
                 stride: _size_2_t = 1, padding: str | _size_2_t | None = None,
                 dilation: _size_2_t = 1, groups: int = 1, bias: bool = True,
                 gamma: float = 1.0, eps: float = 1e-6, gain_init: float = 1.0,
                 device: Any = None, dtype: torch.dtype | None = None) -> None:
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
        """:math:`\\hat{\\mathbf{W}}`, the weight the convolution uses (it carries gradients
        to ``weight`` and ``gain``)."""
        what = F.weight_standardize(self.weight, self.eps, convention="timm")
        return what * (self.gain * self.scale)

    def forward(self, input: Tensor) -> Tensor:
        """The convolution of ``input`` with the scaled standardized weight."""
        if (leaf := traced_as_leaf(self, input)) is not None:   # a leaf under fx, as Conv is
            return leaf
        return self._conv_forward(input, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return (super().extra_repr()
                + f", gamma={self.gamma}, eps={self.eps}, gain_init={self.gain_init}")
