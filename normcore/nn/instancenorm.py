"""InstanceNorm modules (torch's defaults: ``affine=False, track_running_stats=False``).

Each subclasses the ``torch.nn`` class it replaces (``torch.nn.InstanceNorm2d`` etc.); torch's
constructor, buffers and ``_load_from_state_dict`` are reused, the forward is normcore's."""
from __future__ import annotations

import warnings

from torch import Tensor
from torch.nn.modules import instancenorm as torch_in

from .. import _checks as checks
from .. import functional as F
from ._fx import traced_as_leaf
from .batchnorm import _NormBase

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


class _InstanceNorm(_NormBase, torch_in._InstanceNorm):
    """InstanceNorm: statistics per sample and channel over the spatial dims.

    Defaults differ from BatchNorm, as in torch: ``affine=False, track_running_stats=False``.
    An unbatched input ``(C, *spatial)`` is accepted.  As in torch, ``momentum=None`` does
    not mean a cumulative average here: the factor passed on is 0, so the buffers stay put,
    and ``num_batches_tracked`` is never incremented.
    """

    _no_batch_dim = 0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device=None, dtype=None,
                 *, bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype,
                         bias=bias)

    def _check_input_dim(self, input: Tensor) -> None:
        ok = (self._no_batch_dim, self._no_batch_dim + 1)
        if input.dim() not in ok:
            raise ValueError(
                f"expected {ok[0]}D or {ok[1]}D input (got {input.dim()}D input); "
                f"{type(self).__name__} takes {self._shape_hint}")

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        cls = type(self).__name__
        checks.check_float(input, "input", cls)
        self._check_input_dim(input)
        feature_dim = input.dim() - self._no_batch_dim
        if input.shape[feature_dim] != self.num_features:
            if self.affine or self.track_running_stats:
                raise ValueError(
                    f"expected input's size at dim={feature_dim} to match num_features "
                    f"({self.num_features}), but got: {input.shape[feature_dim]}.")
            warnings.warn(
                f"input's size at dim={feature_dim} does not match num_features "
                f"({self.num_features}); with affine=False and track_running_stats=False "
                f"num_features is not used", stacklevel=2)
        unbatched = input.dim() == self._no_batch_dim
        x = input.unsqueeze(0) if unbatched else input
        y = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats,
                            self.momentum if self.momentum is not None else 0.0, self.eps)
        return y.squeeze(0) if unbatched else y


class InstanceNorm1d(_InstanceNorm, torch_in.InstanceNorm1d):
    """InstanceNorm over ``(N, C, L)`` or ``(C, L)``."""

    _no_batch_dim = 2
    _shape_hint = "(N, C, L) or (C, L)"


class InstanceNorm2d(_InstanceNorm, torch_in.InstanceNorm2d):
    """InstanceNorm over ``(N, C, H, W)`` or ``(C, H, W)``."""

    _no_batch_dim = 3
    _shape_hint = "(N, C, H, W) or (C, H, W)"


class InstanceNorm3d(_InstanceNorm, torch_in.InstanceNorm3d):
    """InstanceNorm over ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""

    _no_batch_dim = 4
    _shape_hint = "(N, C, D, H, W) or (C, D, H, W)"
