r"""Which elements share statistics: the one place the book states it.

Every normalization in this package computes, for each element :math:`x_i`,

.. math::

    y_i = \gamma \, \frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta,
    \qquad
    \mu_i = \frac{1}{|S_i|}\sum_{k \in S_i} x_k,
    \qquad
    \sigma_i^2 = \frac{1}{|S_i|}\sum_{k \in S_i} (x_k - \mu_i)^2 ,

and the norms differ only in the set :math:`S_i` of elements that share one mean and one
variance (Wu & He 2018, Sec. 3.1), in where :math:`\gamma, \beta` live, and (RMSNorm) in
whether :math:`\mu_i` is subtracted at all.

The table
---------
Look at an input ``(N, C, *spatial)`` through the view ``(N, G, C/G, *spatial)``.  A set
:math:`S_i` is named by the *roles* of that view it runs over, with :math:`i` fixed on the
others:

======  =================================================
role    :math:`S_i` runs over
======  =================================================
``N``   every sample of the batch
``C``   every channel (both ``G`` and ``C/G`` of the view)
``G``   the ``C/G`` channels of :math:`i`'s group
``S``   every spatial position
======  =================================================

:data:`TABLE` gives each norm its roles; everything else in the package derives from it:
:func:`layout` (a view of the input in which the statistics are a plain reduction, used by
every computation), :func:`stat_groups` (label arrays, used by the pictures and the
checkers), :func:`describe` and :func:`roles_words` (the words), :func:`check_num_groups`
(the one ``num_groups`` check).  :func:`roles_layout` gives the layout of *any* set of
roles, which is how the exercise checkers build the wrong sets that students reduce over.

LayerNorm and RMSNorm over an arbitrary ``normalized_shape`` fit the same table: the leading
dims fold into ``N`` and the normalized dims play ``C, *spatial``.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch

from .errors import NumGroupsError

#: What the functions below take as a shape: a tuple, a list or a ``torch.Size`` of ints, one
#: int (a 1-d shape), or a tensor (its shape).
ShapeLike: TypeAlias = "Sequence[int] | int | torch.Tensor"


@dataclass(frozen=True)
class Norm:
    """One row of :data:`TABLE`."""

    key: str                  # "batch", "layer", ...
    title: str                # "BatchNorm"
    roles: tuple[str, ...]    # the roles of the view that S_i spans
    affine: str               # "channel" or "normalized_shape": where gamma, beta live
    centered: bool = True     # False: no mean is subtracted (RMSNorm)


#: THE table: which elements share statistics, for every norm.
TABLE: dict[str, Norm] = {
    "batch":    Norm("batch", "BatchNorm", ("N", "S"), "channel"),       # every sample and position of c
    "layer":    Norm("layer", "LayerNorm", ("C", "S"), "normalized_shape"),   # everything in sample n
    "instance": Norm("instance", "InstanceNorm", ("S",), "channel"),     # every position of (n, c)
    "group":    Norm("group", "GroupNorm", ("G", "S"), "channel"),       # c's group of channels in n
    "rms":      Norm("rms", "RMSNorm", ("C", "S"), "normalized_shape", centered=False),  # LN's set
}

#: The four norms that center (the GN paper's Figure 2); :data:`TABLE` also has RMSNorm.
NORMS = ("batch", "layer", "instance", "group")

#: Human-readable names used in pictures and tables.
TITLES = {key: row.title for key, row in TABLE.items()}

#: Where gamma and beta live, per norm.
AFFINE = {key: row.affine for key, row in TABLE.items()}

#: The roles, in the order of the view, and a few words for each (for :func:`roles_words`).
ROLES = ("N", "C", "G", "S")
ROLE_WORDS = {"N": "samples", "C": "channels", "G": "channels of one group", "S": "positions",
              "last": "last dim"}
#: A set a checker may try that is no norm's: only the input's last dim.
EXTRA_ROLES = ("last",)


@dataclass(frozen=True)
class Layout:
    """How to compute one norm's statistics on an input of a given shape.

    ``x.reshape(view_shape)`` followed by a reduction over ``reduce_dims`` (with
    ``keepdim=True``) gives one mean / variance per set :math:`S_i`; the result broadcasts
    back against the view.  ``affine_shape`` is the shape of gamma and beta themselves
    (``(C,)`` or ``normalized_shape``); ``affine_view_shape`` is the shape they are reshaped
    to so that they broadcast against the view.  ``centered`` is False for RMSNorm.
    """

    norm: str
    shape: tuple[int, ...]
    view_shape: tuple[int, ...]
    reduce_dims: tuple[int, ...]
    affine_shape: tuple[int, ...]
    affine_view_shape: tuple[int, ...]
    num_groups: int | None = None
    centered: bool = True

    @property
    def set_size(self) -> int:
        """:math:`|S_i|`, the number of elements that share one mean and variance."""
        return math.prod([self.view_shape[d] for d in self.reduce_dims])  # a list: dynamo traces no generator here

    @property
    def num_sets(self) -> int:
        """How many distinct sets (means, variances) the input has."""
        return math.prod(self.shape) // self.set_size if self.set_size else 0

    @property
    def stat_shape(self) -> tuple[int, ...]:
        """Shape of the (keepdim) statistics in the view."""
        return tuple(1 if d in self.reduce_dims else s for d, s in enumerate(self.view_shape))


# ---------------------------------------------------------------------------------------
# checks (one message per mistake)
# ---------------------------------------------------------------------------------------
def check_norm(norm: str) -> Norm:
    """The row of ``norm``, or a ValueError that lists the known norms."""
    if norm not in TABLE:
        raise ValueError(f"unknown norm {norm!r}; expected one of {', '.join(map(repr, TABLE))}")
    return TABLE[norm]


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (the legal GroupNorm group counts)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_num_groups(num_groups: object, num_channels: int, where: str = "GroupNorm",
                     input_shape: Sequence[int] | None = None) -> int:
    """``num_groups`` as an int, or the error that says which values are legal.

    The one place that knows the rule "G must be a positive divisor of C".  The message
    carries torch's wording, so that code matching torch's errors keeps working: for a
    module (``num_channels`` given to a constructor) "num_channels must be divisible by
    num_groups"; for a function called on an input (``input_shape`` given) "Expected number
    of channels in input to be divisible by num_groups".
    """
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral):
        raise TypeError(f"{where}: num_groups must be an int, got {num_groups!r}")
    G = int(num_groups)
    if G > 0 and num_channels % G == 0:
        return G
    if input_shape is not None:
        raise NumGroupsError(
            f"{where}: Expected number of channels in input to be divisible by num_groups, but "
            f"got input of shape {list(input_shape)} and num_groups={num_groups}; choose "
            f"num_groups among the divisors of {num_channels}")
    raise NumGroupsError(
        f"{where}: num_channels ({num_channels}) must be divisible by num_groups "
        f"({num_groups}) (C // G contiguous channels go in each group); choose num_groups among the divisors of "
        f"{num_channels}: {divisors(num_channels)}")


def _as_shape(shape: ShapeLike) -> tuple[int, ...]:
    if isinstance(shape, torch.Tensor):
        return tuple(shape.shape)
    if isinstance(shape, (int, numbers.Integral)):  # (int: for the type checker)
        return (int(shape),)
    # a size that torch.export / torch.compile keeps symbolic (SymInt), or that
    # torch.jit.trace records (a Tensor), stays as it is: int() would bake in its value
    return tuple(s if isinstance(s, (torch.SymInt, torch.Tensor)) else int(s) for s in shape)


# ---------------------------------------------------------------------------------------
# the layout: the table, made into reduce dims
# ---------------------------------------------------------------------------------------
def _base_shape(shape: tuple[int, ...], normalized_ndim: int | None) -> tuple[int, ...]:
    """``(N, C, *spatial)`` as the roles see it.  With ``normalized_ndim = k`` (LayerNorm,
    RMSNorm) the leading dims fold into ``N`` and the ``k`` trailing dims are ``C, *S``."""
    ndim = len(shape)
    if normalized_ndim is None:
        return shape
    k = int(normalized_ndim)
    if not 1 <= k <= ndim:
        raise ValueError(
            f"normalizing over {k} trailing dims is impossible for an input of shape {shape}")
    if k == ndim - 1:
        return shape
    return (math.prod(shape[:ndim - k]),) + shape[ndim - k:]


def roles_layout(shape: ShapeLike, roles: Sequence[str], num_groups: int | None = None, *,
                 norm: str = "", affine: str = "channel", centered: bool = True,
                 normalized_ndim: int | None = None) -> Layout:
    """The :class:`Layout` of the set that runs over ``roles`` (see the module docstring),
    for an input of ``shape``.

    ``num_groups`` splits the channels into the view ``(N, G, C/G, *S)`` (needed for the
    role ``G``); ``affine`` says where gamma lives (``"channel"`` or ``"normalized_shape"``,
    the trailing ``normalized_ndim`` dims).  The role ``"last"`` (only the last dim) is there
    for the exercise checkers.  Raises ValueError for roles that name no dim of this input.
    """
    shape = _as_shape(shape)
    if affine == "normalized_shape" and normalized_ndim is None:
        normalized_ndim = len(shape) - 1
    base = _base_shape(shape, normalized_ndim)
    if len(base) < 2:
        raise ValueError(
            f"{TITLES.get(norm, 'this norm')} needs an input of shape (N, C, ...) with at "
            f"least 2 dims, got shape {shape}")
    unknown = set(roles) - set(ROLES) - set(EXTRA_ROLES)
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}; roles are {ROLES + EXTRA_ROLES}")
    N, C, spatial = base[0], base[1], base[2:]
    channel_dims: tuple[int, ...]
    group_dims: tuple[int, ...]
    if num_groups is not None:
        G = check_num_groups(num_groups, C, TITLES.get(norm, "num_groups"))
        view = (N, G, C // G) + spatial
        channel_dims, group_dims, s0 = (1, 2), (2,), 3
    else:
        if "G" in roles:
            raise ValueError("the role 'G' (the channels of one group) needs num_groups")
        view = base
        channel_dims, group_dims, s0 = (1,), (), 2
    spatial_dims = tuple(range(s0, len(view)))
    dims: set[int] = set()
    for role in roles:
        dims.update({"N": (0,), "C": channel_dims, "G": group_dims, "S": spatial_dims,
                     "last": spatial_dims[-1:] or channel_dims[-1:]}[role])
    if not dims:
        raise ValueError(f"the roles {tuple(roles)} name no dim of an input of shape {shape}")
    affine_shape: tuple[int, ...]
    if affine == "channel":
        affine_shape = (C,)
        affine_view = tuple(s if d in channel_dims else 1 for d, s in enumerate(view))
    elif affine == "normalized_shape":
        if num_groups is not None:
            raise ValueError("gamma per element of normalized_shape does not combine with groups")
        assert normalized_ndim is not None  # set above for this affine (for the type checker)
        affine_shape = shape[len(shape) - normalized_ndim:]
        affine_view = (1,) + view[1:]
    else:
        raise ValueError(f"affine must be 'channel' or 'normalized_shape', got {affine!r}")
    return Layout(norm, shape, view, tuple(sorted(dims)), affine_shape, affine_view,
                  num_groups if num_groups is None else int(num_groups), centered)


def layout(norm: str, shape: ShapeLike, num_groups: int | None = None,
           normalized_ndim: int | None = None) -> Layout:
    """The :class:`Layout` of ``norm`` (a key of :data:`TABLE`) for an input of ``shape``.

    Parameters
    ----------
    norm:
        ``"batch"``, ``"layer"``, ``"instance"``, ``"group"`` or ``"rms"``.
    shape:
        The input's shape ``(N, C, *spatial)`` (or a tensor).
    num_groups:
        Required for ``"group"`` (a divisor of ``C``); not allowed for the others.
    normalized_ndim:
        For ``"layer"`` and ``"rms"`` only: how many trailing dims are normalized
        (``len(normalized_shape)``).  Default: every dim but the first.
    """
    row = check_norm(norm)
    if norm == "group" and num_groups is None:
        raise ValueError("GroupNorm needs num_groups (a divisor of C)")
    if norm != "group" and num_groups is not None:
        raise ValueError(f"num_groups={num_groups!r} applies to GroupNorm only, not {row.title}")
    if row.affine != "normalized_shape" and normalized_ndim is not None:
        raise ValueError(f"normalized_ndim applies to LayerNorm and RMSNorm only, not {row.title}")
    return roles_layout(shape, row.roles, num_groups, norm=norm, affine=row.affine,
                        centered=row.centered, normalized_ndim=normalized_ndim)


def reduce_dims(norm: str, shape: ShapeLike, num_groups: int | None = None) -> tuple[int, ...]:
    """The dims of the input that are reduced to get one mean/variance.

    For ``"group"`` the channel dim is only partly reduced (within a group), so the answer
    refers to the grouped view ``(N, G, C // G, *spatial)``; see :func:`layout`.
    """
    return layout(norm, shape, num_groups).reduce_dims


def layout_labels(lay: Layout) -> torch.Tensor:
    """A label array with ``lay.shape``: equal labels share one mean and one variance.

    Labels run from 0 to ``num_sets - 1``, numbering the positions of the view's non-reduced
    dims (works for any layout, e.g. one of :func:`roles_layout`)."""
    stat = lay.stat_shape
    labels = torch.arange(math.prod(stat)).reshape(stat).expand(lay.view_shape)
    return labels.reshape(lay.shape).clone()


def stat_groups(norm: str, shape: ShapeLike, num_groups: int | None = None,
                normalized_ndim: int | None = None) -> torch.Tensor:
    """A label array with the input's shape: equal labels share one mean and one variance
    (:func:`layout_labels` of :func:`layout`)."""
    return layout_labels(layout(norm, shape, num_groups, normalized_ndim))


# ---------------------------------------------------------------------------------------
# words
# ---------------------------------------------------------------------------------------
def roles_words(roles: Sequence[str], group_size: int | None = None) -> str:
    """The set in words: ``("N", "S")`` -> "all samples and positions of one channel".

    ``group_size`` (C/G) makes the group's words exact ("of the 3 channels of one group").
    """
    roles = tuple(roles)
    spanned = [ROLE_WORDS[r] for r in ("N", "C", "S", "last") if r in roles]
    listed = ", ".join(spanned[:-1]) + " and " + spanned[-1] if len(spanned) > 1 else "".join(spanned)
    words = "all " + (listed or "elements")
    if "G" in roles and "C" not in roles:
        if group_size == 1:
            words += " of the one channel of its group"
        else:
            words += f" of the {'C/G' if group_size is None else group_size} channels of one group"
    elif "C" not in roles:
        words += " of one channel"
    if "N" not in roles:
        words += " of one sample"
    if "S" not in roles and "last" not in roles:
        words += " at one position"
    return words


def describe(norm: str, shape: ShapeLike, num_groups: int | None = None) -> str:
    """One line in words: which elements share statistics, and the set size."""
    lay = layout(norm, shape, num_groups)
    row = TABLE[norm]
    words = roles_words(row.roles, lay.view_shape[2] if lay.num_groups else None)
    if not row.centered:
        words += " (no mean subtracted: the root mean square only)"
    return f"{row.title}: S_i = {words}; |S_i| = {lay.set_size}, {lay.num_sets} sets"
