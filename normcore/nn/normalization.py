"""LayerNorm, RMSNorm and GroupNorm modules: no running statistics, so train and eval
compute the same thing."""
from __future__ import annotations

from torch import Tensor
import torch
from torch.nn import Module, Parameter, init

from .. import _checks as checks
from .. import functional as F
from ._params import affine_parameters, reset_affine

__all__ = ["LayerNorm", "RMSNorm", "GroupNorm"]


class LayerNorm(Module):
    """LayerNorm over the trailing ``normalized_shape`` dims; gamma/beta of that shape."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        checks.check_eps(eps, "LayerNorm")
        self.normalized_shape = checks.normalized_shape_tuple(normalized_shape, "LayerNorm")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        affine_parameters(self, self.normalized_shape, elementwise_affine, bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return ("{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}, "
                "bias={use_bias}".format(**self.__dict__, use_bias=self.bias is not None))


class RMSNorm(Module):
    r"""LayerNorm without centering and without beta (Zhang & Sennrich 2019).

    .. math:: y = \gamma \, x / \sqrt{\operatorname{mean}_{S}(x^2) + \epsilon}

    Args:
        normalized_shape: the trailing dims that form S.
        eps: added to the mean square; ``None`` as in ``torch.nn.RMSNorm`` (the machine
            epsilon of the compute dtype, float32 for half inputs).
        elementwise_affine: learn ``weight`` (gamma), one per element of S.
    Shape:
        input ``(*, *normalized_shape)``; output the same.
    """

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if eps is not None:
            checks.check_eps(eps, "RMSNorm")
        self.normalized_shape = checks.normalized_shape_tuple(normalized_shape, "RMSNorm")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        # gamma only: torch's RMSNorm registers no "bias" at all
        if elementwise_affine:
            self.weight = Parameter(torch.empty(self.normalized_shape, **factory))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return ("{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}"
                .format(**self.__dict__))


class GroupNorm(Module):
    """GroupNorm: ``num_groups`` groups of contiguous channels; gamma/beta per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        checks.check_positive_int(num_channels, "num_channels", "GroupNorm")
        checks.check_num_groups(num_groups, num_channels, "GroupNorm")   # int, > 0, divides
        checks.check_eps(eps, "GroupNorm")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        factory = {"device": device, "dtype": dtype}
        affine_parameters(self, num_channels, affine, bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return ("{num_groups}, {num_channels}, eps={eps}, affine={affine}, "
                "bias={use_bias}".format(**self.__dict__, use_bias=self.bias is not None))
