"""InstanceNorm modules (torch's defaults: ``affine=False, track_running_stats=False``).

Each subclasses the ``torch.nn`` class it replaces (``torch.nn.InstanceNorm2d`` etc.); torch's
constructor, buffers and ``_load_from_state_dict`` are reused, the forward is normcore's."""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules import instancenorm as torch_in

from .. import _checks as checks
from .. import functional as F
from ..defaults import EPS, MOMENTUM, fill_defaults
from . import _doc
from ._fx import traced_as_leaf
from .batchnorm import _NormBase

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]

_IN = r"""Instance normalization over <<INPUT>>.

The elements that share statistics with an element :math:`x_i` of sample :math:`n` and
channel :math:`c` are that sample's values of that channel: :math:`S_i = \{(n, c, s)\}`
over every position :math:`s`, :math:`K = <<K>>` values.  With :math:`\mu_i` the mean and
:math:`\sigma_i^2` the **biased** variance (divided by :math:`K`) of :math:`S_i`,

.. math::

    y_i = \frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} \, \gamma_c + \beta_c

with :math:`\gamma, \beta` (``weight``, ``bias``, shape :math:`(C,)`, 1 and 0 at the
start) only if ``affine=True``.  The defaults differ from BatchNorm's, as in torch:
``affine=False`` and ``track_running_stats=False``, and then each instance's own statistics
are used in train and eval mode alike.  With ``track_running_stats=True``:

- ``train()``: each instance's :math:`\mu_i, \sigma_i^2`; the buffers are updated with the
  average over the batch's instances of their means and of their **unbiased** variances
  (:math:`\frac{K}{K - 1}\,\sigma_i^2`), :math:`\hat\mu \leftarrow (1 - \alpha)\,\hat\mu +
  \alpha\,\overline{\mu}` and alike for :math:`\hat\sigma^2`, with :math:`\alpha` =
  ``momentum``.  As in torch, ``momentum=None`` is no cumulative average here: the buffers
  stay as they are, and ``num_batches_tracked`` is never incremented.
- ``eval()``: the buffers :math:`\hat\mu, \hat\sigma^2` (one per channel) for every
  instance.

An unbatched input <<UNBATCHED>> is read as a batch of one.  If ``num_features`` is not the
input's channel count, ``affine=False`` and ``track_running_stats=False`` only warn (the
argument is not used), as torch does; otherwise that is a ``ValueError``.

Args:
    num_features (int): :math:`C`, the number of channels.
    eps (float): :math:`\epsilon`, added to the variance under the square root; must be
        positive. Default: {default}
    momentum (float or None): :math:`\alpha`, the weight of the new batch in the running
        statistics, in [0, 1] (``None``: the buffers are not updated). Default: {default}
    affine (bool): learn :math:`\gamma` (``weight``) and :math:`\beta` (``bias``), one per
        channel. Default: {default}
    track_running_stats (bool): keep the buffers ``running_mean`` and ``running_var``, and
        normalize with them in eval mode. Default: {default}
<<DEVICE_ARGS>>
    bias (bool): with ``affine``, also learn :math:`\beta`. Default: {default}

Shape:
    - Input: <<SHAPE>>
    - Output: same shape as input

Differs from torch:
<<DIFFERS>>
<<PAGE>>

Examples:
<<EXAMPLES>>
"""

_EMPTY = """\
    - In training with ``track_running_stats=True``, an empty batch (:math:`N = 0`) raises
      ``normcore.errors.EmptyBatchError`` (a ``ValueError`` and an ``IndexError``) and leaves
      the buffers as they were (torch writes NaN into them, or raises an ``IndexError`` from
      its kernel); an empty batch that updates nothing gives an empty output."""

_IN_PIECES = {
    "DIFFERS": _doc.differs(_doc.EPS, _doc.MOMENTUM, _doc.SIZES, _EMPTY, _doc.ERRORS,
                            _doc.SCRIPT, _doc.FX),
    "PAGE": _doc.PAGE, "DEVICE_ARGS": _doc.DEVICE_ARGS, "SIZE_ARGS": "``num_features``",
    "EPS_TORCH": "torch accepts it"}


class _InstanceNorm(_NormBase, torch_in._InstanceNorm):
    """InstanceNorm: statistics per sample and channel over the spatial dims (the public
    classes' docstrings, built from ``_IN``, say it in full)."""

    _no_batch_dim = 0
    _shape_hint = "(N, C, *) or (C, *)"

    def __init__(self, num_features: int, eps: float = EPS, momentum: float | None = MOMENTUM,
                 affine: bool = False, track_running_stats: bool = False, device: Any = None,
                 dtype: torch.dtype | None = None, *, bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype,
                         bias=bias)

    def _check_input_dim(self, input: Tensor) -> None:
        ok = (self._no_batch_dim, self._no_batch_dim + 1)
        if input.dim() not in ok:
            raise ValueError(
                f"expected {ok[0]}D or {ok[1]}D input (got {input.dim()}D input); "
                f"{type(self).__name__} takes {self._shape_hint}")

    def forward(self, input: Tensor) -> Tensor:
        """Normalize ``input`` (see the class's docstring)."""
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


@fill_defaults
class InstanceNorm1d(_InstanceNorm, torch_in.InstanceNorm1d):
    __doc__ = _doc.fill(
        _IN, INPUT=r"a 3-D input :math:`(N, C, L)` (or an unbatched :math:`(C, L)`)", K="L",
        UNBATCHED=r":math:`(C, L)`", SHAPE=r":math:`(N, C, L)` or :math:`(C, L)`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m = nnc.InstanceNorm1d(4, affine=True, track_running_stats=True)
    >>> ref = torch.nn.InstanceNorm1d(4, affine=True, track_running_stats=True)
    >>> x = torch.randn(8, 4, 16)
    >>> torch.allclose(m(x), ref(x), atol=1e-5)
    True
    >>> torch.allclose(m.running_var, ref.running_var, atol=1e-6)  # mean unbiased variance
    True
    >>> torch.allclose(m.eval()(x), ref.eval()(x), atol=1e-5)      # eval: the buffers
    True""", **_IN_PIECES)

    _no_batch_dim = 2
    _shape_hint = "(N, C, L) or (C, L)"


@fill_defaults
class InstanceNorm2d(_InstanceNorm, torch_in.InstanceNorm2d):
    __doc__ = _doc.fill(
        _IN, INPUT=r"a 4-D input :math:`(N, C, H, W)` (or an unbatched :math:`(C, H, W)`)",
        K="H W", UNBATCHED=r":math:`(C, H, W)`",
        SHAPE=r":math:`(N, C, H, W)` or :math:`(C, H, W)`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m, ref = nnc.InstanceNorm2d(3), torch.nn.InstanceNorm2d(3)
    >>> x = torch.randn(4, 3, 8, 8)
    >>> torch.allclose(m(x), ref(x), atol=1e-5)     # each image's own statistics
    True
    >>> m(x[0]).shape                               # unbatched (C, H, W)
    torch.Size([3, 8, 8])""", **_IN_PIECES)

    _no_batch_dim = 3
    _shape_hint = "(N, C, H, W) or (C, H, W)"


@fill_defaults
class InstanceNorm3d(_InstanceNorm, torch_in.InstanceNorm3d):
    __doc__ = _doc.fill(
        _IN, INPUT=r"a 5-D input :math:`(N, C, D, H, W)` (or an unbatched :math:`(C, D, H, W)`)",
        K="D H W", UNBATCHED=r":math:`(C, D, H, W)`",
        SHAPE=r":math:`(N, C, D, H, W)` or :math:`(C, D, H, W)`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m = nnc.InstanceNorm3d(2, affine=True)
    >>> x = torch.randn(2, 2, 4, 6, 6)
    >>> y = m(x)
    >>> mean, var = y[0, 0].mean(), y[0, 0].var(correction=0)   # one sample, one channel
    >>> bool(mean.abs() < 1e-5), bool((var - 1).abs() < 1e-3)
    (True, True)""", **_IN_PIECES)

    _no_batch_dim = 4
    _shape_hint = "(N, C, D, H, W) or (C, D, H, W)"
