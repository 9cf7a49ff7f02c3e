"""Convolutions with standardized weights."""
from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks as checks
from .. import functional as F

__all__ = ["WSConv2d"]


class WSConv2d(torch.nn.Conv2d):
    """A ``Conv2d`` whose weight is standardized (per output channel) in every forward.

    Same arguments as ``torch.nn.Conv2d`` plus ``ws_eps`` (``None``: the convention's
    default) and ``convention`` (``"original"``, ``"bit"`` or ``"timm"``; see
    :func:`normcore.functional.weight_standardize`).  The stored ``weight`` is the raw one;
    the standardized weight is recomputed each call, so gradients flow through it.
    """

    def __init__(self, *args, ws_eps: float | None = None, convention: str = "original", **kwargs):
        super().__init__(*args, **kwargs)
        checks.check_convention(convention, "WSConv2d")
        if ws_eps is not None:
            checks.check_eps(ws_eps, "WSConv2d")
        self.ws_eps = ws_eps
        self.convention = convention

    def standardized_weight(self) -> Tensor:
        return F.weight_standardize(self.weight, self.ws_eps, convention=self.convention)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", convention={self.convention!r}, ws_eps={self.ws_eps}"
