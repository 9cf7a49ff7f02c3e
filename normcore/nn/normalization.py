r"""LayerNorm, RMSNorm and GroupNorm modules: no running statistics, so train and eval
compute the same thing.

Each subclasses the ``torch.nn`` class it replaces: torch's constructor (parameters,
``reset_parameters``, ``extra_repr``) is reused after normcore's checks of the arguments
(torch accepts ``eps <= 0``); the forward is normcore's."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .. import _checks as checks
from .. import functional as F
from ..defaults import EPS, fill_defaults
from . import _doc
from ._fx import traced_as_leaf

__all__ = ["LayerNorm", "RMSNorm", "GroupNorm"]

_DIFFERS = _doc.differs(_doc.EPS, _doc.SIZES, _doc.ERRORS, _doc.SCRIPT, _doc.FX, _doc.PAGE)

# the Shape section of LayerNorm and RMSNorm
_LAST_DIMS = r"""    - Input: :math:`(*, \text{normalized\_shape}[0], \ldots)`, whose last dims are
      ``normalized_shape``
    - Output: same shape as input"""

_SAME_IN_EVAL = """\
There are no running statistics: train and eval mode compute the same thing."""


@fill_defaults
class LayerNorm(torch.nn.LayerNorm):
    __doc__ = _doc.fill(r"""Layer normalization over the last dims of the input (Ba et al. 2016).

The elements that share statistics with an element :math:`x_i` are those with the same
leading indices: :math:`S_i` is the slice of the trailing ``normalized_shape`` dims that
holds :math:`x_i` (a token's :math:`C` features for an input :math:`(N, T, C)` and
``normalized_shape=C``), :math:`K` = the product of ``normalized_shape``.  With
:math:`\mu_i` the mean and :math:`\sigma_i^2` the **biased** variance (divided by
:math:`K`) of :math:`S_i`,

.. math::

    y_i = \frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} \, \gamma_j + \beta_j

where :math:`j` is :math:`x_i`'s position within ``normalized_shape``: :math:`\gamma` and
:math:`\beta` (``weight``, ``bias``) have the shape ``normalized_shape``, one per element,
and start at 1 and 0.  <<SAME>>

Args:
    normalized_shape (int or sequence of int): the trailing dims that form :math:`S_i`
        (an int ``C`` for the last dim alone).
    eps (float): :math:`\epsilon`, added to the variance under the square root; must be
        positive. Default: {default}
    elementwise_affine (bool): learn :math:`\gamma` (``weight``) and :math:`\beta`
        (``bias``); without, both are ``None``. Default: {default}
    bias (bool): with ``elementwise_affine``, also learn :math:`\beta`. Default: {default}
<<DEVICE_ARGS>>

Shape:
<<LAST_DIMS>>

Differs from torch:
<<DIFFERS>>

Examples:
    >>> import normcore.nn as nnc
    >>> m, ref = nnc.LayerNorm(16), torch.nn.LayerNorm(16)
    >>> x = torch.randn(2, 5, 16)                   # (N, T, C): one set per token
    >>> torch.allclose(m(x), ref(x), atol=1e-5)
    True
    >>> nnc.LayerNorm([5, 16])(x).shape             # one set per sample
    torch.Size([2, 5, 16])
""", SAME=_SAME_IN_EVAL, DEVICE_ARGS=_doc.DEVICE_ARGS, DIFFERS=_DIFFERS,
        LAST_DIMS=_LAST_DIMS, SIZE_ARGS="``normalized_shape``", EPS_TORCH="torch accepts it")

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = EPS,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        checks.check_eps(eps, "LayerNorm")
        shape = checks.normalized_shape_tuple(normalized_shape, "LayerNorm")
        super().__init__(shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        """Normalize ``input`` (see the class's docstring)."""
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


@fill_defaults
class RMSNorm(torch.nn.RMSNorm):
    __doc__ = _doc.fill(r"""Root-mean-square normalization over the last dims of the input
(Zhang & Sennrich 2019): LayerNorm without centering and without :math:`\beta`.

:math:`S_i` is LayerNorm's set, the slice of the trailing ``normalized_shape`` dims that
holds :math:`x_i` (:math:`K` elements), and the input is divided by its root mean square:

.. math::

    y_i = \frac{x_i}{\sqrt{\frac1K \sum_{k \in S_i} x_k^2 + \epsilon}} \, \gamma_j

with :math:`\gamma` (``weight``) of the shape ``normalized_shape``, starting at 1; there is
no ``bias`` (as in torch's RMSNorm).  <<SAME>>

Args:
    normalized_shape (int or sequence of int): the trailing dims that form :math:`S_i`.
    eps (float or None): :math:`\epsilon`, added to the mean square; must be positive.
        ``None``, as in ``torch.nn.RMSNorm``, is the machine epsilon
        (``torch.finfo(dtype).eps``) of the computation's dtype (float32 for float16 and
        bfloat16 inputs). Default: {default}
    elementwise_affine (bool): learn :math:`\gamma` (``weight``); without, it is ``None``.
        Default: {default}
<<DEVICE_ARGS>>

Shape:
<<LAST_DIMS>>

Differs from torch:
<<DIFFERS>>

Examples:
    >>> import normcore.nn as nnc
    >>> m, ref = nnc.RMSNorm(16), torch.nn.RMSNorm(16)
    >>> x = torch.randn(2, 5, 16)
    >>> torch.allclose(m(x), ref(x), atol=1e-5)
    True
    >>> rms = m(x).pow(2).mean(-1).sqrt()           # each token's output has RMS 1
    >>> torch.allclose(rms, torch.ones(2, 5), atol=1e-4)
    True
""", SAME=_SAME_IN_EVAL, DEVICE_ARGS=_doc.DEVICE_ARGS, DIFFERS=_DIFFERS,
        LAST_DIMS=_LAST_DIMS, SIZE_ARGS="``normalized_shape``",
        EPS_TORCH="torch accepts it, even below 0")

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None,
                 elementwise_affine: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        if eps is not None:
            checks.check_eps(eps, "RMSNorm")
        shape = checks.normalized_shape_tuple(normalized_shape, "RMSNorm")
        # gamma only: torch's RMSNorm registers no "bias" at all
        super().__init__(shape, eps, elementwise_affine, device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        """Normalize ``input`` (see the class's docstring)."""
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)


@fill_defaults
class GroupNorm(torch.nn.GroupNorm):
    __doc__ = _doc.fill(r"""Group normalization over an input :math:`(N, C, *)` (Wu & He 2018).

The :math:`C` channels form :math:`G` = ``num_groups`` groups of :math:`C/G` contiguous
channels.  The elements that share statistics with an element :math:`x_i` of sample
:math:`n` and channel :math:`c` are that sample's values of every channel of :math:`c`'s
group: :math:`S_i = \{(n, c', s)\}` over the channels :math:`c'` of the group and every
position :math:`s`, :math:`K = (C/G)` times the spatial size.  With :math:`\mu_i` the mean
and :math:`\sigma_i^2` the **biased** variance (divided by :math:`K`) of :math:`S_i`,

.. math::

    y_i = \frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} \, \gamma_c + \beta_c

with :math:`\gamma, \beta` (``weight``, ``bias``) per *channel*, shape :math:`(C,)`,
starting at 1 and 0.  :math:`G = 1` gives LayerNorm's set over :math:`(C, *)`,
:math:`G = C` InstanceNorm's.  <<SAME>>

Args:
    num_groups (int): :math:`G`, which must divide ``num_channels``.
    num_channels (int): :math:`C`, the number of channels (dim 1 of the input).
    eps (float): :math:`\epsilon`, added to the variance under the square root; must be
        positive. Default: {default}
    affine (bool): learn :math:`\gamma` (``weight``) and :math:`\beta` (``bias``); without,
        both are ``None``. Default: {default}
<<DEVICE_ARGS>>
    bias (bool): with ``affine``, also learn :math:`\beta`. Default: {default}

Shape:
    - Input: :math:`(N, C, *)`
    - Output: same shape as input

Differs from torch:
<<DIFFERS>>

Examples:
    >>> import normcore.nn as nnc
    >>> m, ref = nnc.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6)   # 2 groups of 3 channels
    >>> x = torch.randn(4, 6, 8, 8)
    >>> torch.allclose(m(x), ref(x), atol=1e-5)
    True
    >>> x1 = x[:1]                                  # statistics per sample: N = 1 is fine
    >>> torch.allclose(m(x1), ref(x1), atol=1e-5)
    True
""", SAME=_SAME_IN_EVAL, DEVICE_ARGS=_doc.DEVICE_ARGS, DIFFERS=_DIFFERS,
        SIZE_ARGS="``num_groups``, ``num_channels``; ``num_groups`` must divide "
                  "``num_channels``", EPS_TORCH="torch accepts it")

    def __init__(self, num_groups: int, num_channels: int, eps: float = EPS,
                 affine: bool = True, device: Any = None, dtype: torch.dtype | None = None, *,
                 bias: bool = True) -> None:
        checks.check_positive_int(num_channels, "num_channels", "GroupNorm")
        checks.check_num_groups(num_groups, num_channels, "GroupNorm")   # int, > 0, divides
        checks.check_eps(eps, "GroupNorm")
        super().__init__(num_groups, num_channels, eps, affine, device, dtype, bias=bias)

    def forward(self, input: Tensor) -> Tensor:
        """Normalize ``input`` (see the class's docstring)."""
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)
