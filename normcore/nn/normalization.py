"""LayerNorm, RMSNorm and GroupNorm modules: no running statistics, so train and eval
compute the same thing.

Each subclasses the ``torch.nn`` class it replaces: torch's constructor (parameters,
``reset_parameters``, ``extra_repr``) is reused after normcore's checks of the arguments
(torch accepts ``eps <= 0``); the forward is normcore's."""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks as checks
from .. import functional as F
from ._fx import traced_as_leaf

__all__ = ["LayerNorm", "RMSNorm", "GroupNorm"]


class LayerNorm(torch.nn.LayerNorm):
    """LayerNorm over the trailing ``normalized_shape`` dims; gamma/beta of that shape."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        checks.check_eps(eps, "LayerNorm")
        shape = checks.normalized_shape_tuple(normalized_shape, "LayerNorm")
        super().__init__(shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
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
        if eps is not None:
            checks.check_eps(eps, "RMSNorm")
        shape = checks.normalized_shape_tuple(normalized_shape, "RMSNorm")
        # gamma only: torch's RMSNorm registers no "bias" at all
        super().__init__(shape, eps, elementwise_affine, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


class GroupNorm(torch.nn.GroupNorm):
    """GroupNorm: ``num_groups`` groups of contiguous channels; gamma/beta per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None, *, bias: bool = True):
        checks.check_positive_int(num_channels, "num_channels", "GroupNorm")
        checks.check_num_groups(num_groups, num_channels, "GroupNorm")   # int, > 0, divides
        checks.check_eps(eps, "GroupNorm")
        super().__init__(num_groups, num_channels, eps, affine, device, dtype, bias=bias)

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)
