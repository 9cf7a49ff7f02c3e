r"""Which elements share statistics: the one place the book states it.

Every normalization in this package computes, for each element :math:`x_i`,

.. math::

    y_i = \gamma \, \frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta,
    \qquad
    \mu_i = \frac{1}{|S_i|}\sum_{k \in S_i} x_k,
    \qquad
    \sigma_i^2 = \frac{1}{|S_i|}\sum_{k \in S_i} (x_k - \mu_i)^2 ,

and the norms differ only in the set :math:`S_i` of elements that share one mean and one
variance (Wu & He 2018, Sec. 3.1) and in where :math:`\gamma, \beta` live.  For an input of
shape ``(N, C, *spatial)``:

============  ==========================================  ===========================
norm          :math:`S_i` for :math:`i = (n, c, s)`        :math:`\gamma, \beta`
============  ==========================================  ===========================
``batch``     every ``(n', c, s')``: all samples and       one per channel ``C``
              positions of channel ``c``
``layer``     every ``(n, c', s')``: everything in         one per element of
              sample ``n``                                 ``normalized_shape``
``instance``  every ``(n, c, s')``: one sample, one        one per channel ``C``
              channel
``group``     every ``(n, c', s')`` with ``c'`` in the     one per channel ``C``
              group of ``c`` (``C // G`` contiguous
              channels)
============  ==========================================  ===========================

:func:`layout` turns this table into something code can use: a *view* of the input in
which the statistics are a plain reduction over some dims.  The implementations
(:mod:`normcore.functional`), the pictures (:mod:`normcore.viz`), the label arrays
(:func:`stat_groups`) and the exercise checkers all read from it, so the fact "GN reduces
over the group's channels and H*W" is written down here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

NORMS = ("batch", "layer", "instance", "group")

#: Human-readable names used in pictures and tables.
TITLES = {
    "batch": "BatchNorm",
    "layer": "LayerNorm",
    "instance": "InstanceNorm",
    "group": "GroupNorm",
}

#: Where gamma and beta live, per norm.
AFFINE = {
    "batch": "channel",
    "layer": "normalized_shape",
    "instance": "channel",
    "group": "channel",
}


@dataclass(frozen=True)
class Layout:
    """How to compute one norm's statistics on an input of a given shape.

    ``x.reshape(view_shape)`` followed by a reduction over ``reduce_dims`` (with
    ``keepdim=True``) gives one mean / variance per set :math:`S_i`; the result broadcasts
    back against the view.  ``affine_shape`` is the shape of gamma and beta themselves
    (``(C,)`` or ``normalized_shape``); ``affine_view_shape`` is the shape they are reshaped
    to so that they broadcast against the view.
    """

    norm: str
    shape: tuple[int, ...]
    view_shape: tuple[int, ...]
    reduce_dims: tuple[int, ...]
    affine_shape: tuple[int, ...]
    affine_view_shape: tuple[int, ...]
    num_groups: int | None = None

    @property
    def set_size(self) -> int:
        """:math:`|S_i|`, the number of elements that share one mean and variance."""
        n = 1
        for d in self.reduce_dims:
            n *= self.view_shape[d]
        return n

    @property
    def num_sets(self) -> int:
        """How many distinct sets (means, variances) the input has."""
        total = 1
        for s in self.shape:
            total *= s
        return total // self.set_size if self.set_size else 0

    @property
    def stat_shape(self) -> tuple[int, ...]:
        """Shape of the (keepdim) statistics in the view."""
        return tuple(1 if d in self.reduce_dims else s for d, s in enumerate(self.view_shape))


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; expected one of {', '.join(map(repr, NORMS))}")


def _as_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, torch.Tensor):
        return tuple(shape.shape)
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)


def layout(norm: str, shape, num_groups: int | None = None,
           normalized_ndim: int | None = None) -> Layout:
    """The :class:`Layout` of ``norm`` for an input of ``shape``.

    Parameters
    ----------
    norm:
        ``"batch"``, ``"layer"``, ``"instance"`` or ``"group"``.
    shape:
        The input's shape ``(N, C, *spatial)`` (or a tensor).
    num_groups:
        Required for ``"group"``; must divide ``C``.
    normalized_ndim:
        For ``"layer"`` only: how many trailing dims are normalized (``len(normalized_shape)``).
        Default: every dim but the first.
    """
    _check_norm(norm)
    shape = _as_shape(shape)
    ndim = len(shape)
    if norm == "layer":
        k = ndim - 1 if normalized_ndim is None else int(normalized_ndim)
        if not 1 <= k <= ndim:
            raise ValueError(
                f"layer norm over {k} trailing dims is impossible for an input of shape {shape}")
        dims = tuple(range(ndim - k, ndim))
        return Layout(norm, shape, shape, dims, shape[ndim - k:], (1,) * (ndim - k) + shape[ndim - k:])
    if ndim < 2:
        raise ValueError(
            f"{TITLES[norm]} needs an input of shape (N, C, ...) with at least 2 dims, got shape {shape}")
    C = shape[1]
    per_channel = (1, C) + (1,) * (ndim - 2)
    if norm == "batch":
        return Layout(norm, shape, shape, (0,) + tuple(range(2, ndim)), (C,), per_channel)
    if norm == "instance":
        return Layout(norm, shape, shape, tuple(range(2, ndim)), (C,), per_channel)
    # group
    if num_groups is None:
        raise ValueError("GroupNorm needs num_groups")
    G = int(num_groups)
    if G <= 0 or C % G != 0:
        raise ValueError(
            f"num_groups={num_groups} must be a positive divisor of num_channels={C} "
            f"(C // G channels go in each group); divisors of {C}: {divisors(C)}")
    view = (shape[0], G, C // G) + shape[2:]
    return Layout(norm, shape, view, tuple(range(2, len(view))), (C,),
                  (1, G, C // G) + (1,) * (ndim - 2), G)


def reduce_dims(norm: str, shape, num_groups: int | None = None) -> tuple[int, ...]:
    """The dims of the input that are reduced to get one mean/variance.

    For ``"group"`` the channel dim is only partly reduced (within a group), so the answer
    refers to the grouped view ``(N, G, C // G, *spatial)``; see :func:`layout`.
    """
    return layout(norm, shape, num_groups).reduce_dims


def stat_groups(norm: str, shape, num_groups: int | None = None,
                normalized_ndim: int | None = None) -> torch.Tensor:
    """A label array with the input's shape: equal labels share one mean and one variance.

    Labels run from 0 to ``num_sets - 1``.  They are computed from :func:`layout` (not
    from a second description of the norms), by numbering the positions of the view's
    non-reduced dims.
    """
    lay = layout(norm, shape, num_groups, normalized_ndim)
    stat = lay.stat_shape
    n_sets = 1
    for s in stat:
        n_sets *= s
    labels = torch.arange(n_sets).reshape(stat).expand(lay.view_shape)
    return labels.reshape(lay.shape).clone()


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (the legal GroupNorm group counts)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def describe(norm: str, shape: Sequence[int], num_groups: int | None = None) -> str:
    """One line in words: which elements share statistics, and the set size."""
    lay = layout(norm, shape, num_groups)
    words = {
        "batch": "all samples and positions of one channel",
        "layer": "all channels and positions of one sample",
        "instance": "all positions of one channel of one sample",
        "group": f"all positions of the {lay.view_shape[2] if lay.num_groups else '?'} channels "
                 f"of one group of one sample",
    }[norm]
    return f"{TITLES[norm]}: S_i = {words}; |S_i| = {lay.set_size}, {lay.num_sets} sets"
