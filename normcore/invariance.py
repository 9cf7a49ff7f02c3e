r"""Invariances by experiment: transform a layer's arguments, recompute, see whether it moved.

Ba et al. compare normalizations by what leaves a layer's output unchanged (the LN paper,
Table 1).  The experiment is the same for any layer and any transformation: compute
``layer(*args)``, compute ``layer(*transform(*args))``, and measure the largest change of the
output.  :func:`invariance_table` runs it for every pair and sorts each change into

* **invariant**: below ``invariant_below`` (default :math:`10^{-3}`).  The re-scalings hold
  only up to :math:`\epsilon`: a set of variance :math:`\sigma^2` scaled by :math:`a` turns
  :math:`\sigma^2 + \epsilon` into :math:`a^2\sigma^2 + \epsilon`, which moves
  :math:`\hat x` by at most :math:`|\hat x|\,\epsilon\,(1 + a^{-2}) / (2\sigma^2)`; with
  :math:`\epsilon = 10^{-5}` and sets of variance near 1 that is far below :math:`10^{-3}`;
* **changed**: above ``changed_above`` (default 0.05), a change no :math:`\epsilon` explains;
* anything in between is neither, and raises ``ValueError``: the experiment must tell the two
  apart clearly, or its data must be chosen again.

Two families of transformations are defined here:

* :func:`ln_paper_transforms`: the LN paper's six, on a linear layer :math:`z = X\mathbf{W}^\top`
  (weight matrix re-scaling and re-centering, weight vector re-scaling, dataset re-scaling and
  re-centering, single training case re-scaling);
* :data:`INPUT_TRANSFORMS` and :func:`input_transforms`: the same ideas stated on a
  normalization's own input ``z`` of shape ``(N, C, *S)``: a scale or a shift that is the
  same everywhere, per sample or per channel.  For a linear layer before the norm they *are*
  the paper's: scaling the weight matrix or the data scales every ``z``; re-scaling row
  :math:`\mathbf{W}_c` scales channel ``c``; re-centering the weight matrix,
  :math:`\mathbf{W} + \mathbf{1}v^\top`, adds :math:`v^\top x_n` to every channel of sample
  ``n``; re-centering the data, :math:`x + v`, adds :math:`(\mathbf{W}v)_c` to channel ``c``
  of every sample (:data:`LN_PAPER_ON_INPUT`).

:func:`predicted_invariant` says which of the input transformations a standardization over a
set :math:`S_i` removes, from the roles the set spans (:mod:`normcore.axes`): a scale (or
shift) is removed exactly when it is the same on every element of each set, and the layer
divides by a spread (or subtracts a mean).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["InvarianceTable", "invariance_table", "LN_PAPER", "ln_paper_transforms",
           "InputTransform", "INPUT_TRANSFORMS", "LN_PAPER_ON_INPUT", "input_transforms",
           "predicted_invariant", "spans"]


@dataclass(frozen=True)
class InvarianceTable:
    """The largest change of each layer's output under each transformation, and the verdicts."""

    layers: tuple[str, ...]
    transforms: tuple[str, ...]
    changes: dict[tuple[str, str], float]     # (layer, transform) -> max |change|
    invariant_below: float
    changed_above: float

    def invariant(self, layer: str, transform: str) -> bool:
        """True if ``layer``'s output did not move under ``transform``."""
        return self.changes[layer, transform] < self.invariant_below

    def row(self, layer: str) -> list[bool]:
        """The verdicts of one layer, in the order of the transformations."""
        return [self.invariant(layer, t) for t in self.transforms]

    @property
    def worst_invariant(self) -> float:
        """The largest change among the outputs called invariant (0.0 if there is none)."""
        return max((c for c in self.changes.values() if c < self.invariant_below), default=0.0)

    def format(self, name_width: int = 31, column_width: int = 11,
               titles: Mapping[str, str] | None = None) -> str:
        """The table as text: one line per transformation, one column per layer, yes/no."""
        titles = titles or {}
        head = f"{'':{name_width}}" + "".join(f"{titles.get(n, n):>{column_width}}"
                                             for n in self.layers)
        lines = [head]
        for t in self.transforms:
            lines.append(f"{t:{name_width}}" + "".join(
                f"{'yes' if self.invariant(n, t) else 'no':>{column_width}}" for n in self.layers))
        return "\n".join(lines)


def _max_change(a: Tensor, b: Tensor) -> float:
    if a.shape != b.shape:
        raise ValueError(f"a transformation changed the output's shape from {tuple(a.shape)} "
                         f"to {tuple(b.shape)}; it must keep the layer's arguments' shapes")
    return float((a - b).detach().abs().max())


def invariance_table(layers: Mapping[str, Callable[..., Tensor]],
                     transforms: Mapping[str, Callable[..., tuple]], *args,
                     invariant_below: float = 1e-3, changed_above: float = 0.05
                     ) -> InvarianceTable:
    """Run every layer on ``args`` and on ``transform(*args)`` for every transformation.

    ``layers`` maps a name to ``layer(*args) -> Tensor``; ``transforms`` a name to
    ``transform(*args) -> tuple`` of new arguments (for one argument, a 1-tuple).  Raises
    ValueError if a change falls between ``invariant_below`` and ``changed_above`` (neither
    clearly invariant nor clearly changed), naming the layer and the transformation.
    """
    if not 0 < invariant_below < changed_above:
        raise ValueError(f"need 0 < invariant_below < changed_above, got {invariant_below} "
                         f"and {changed_above}")
    if not layers or not transforms:
        raise ValueError("give at least one layer and one transformation")
    changes: dict[tuple[str, str], float] = {}
    for name, layer in layers.items():
        base = layer(*args)
        for t_name, transform in transforms.items():
            moved = transform(*args)
            if not isinstance(moved, tuple):
                raise TypeError(f"transformation {t_name!r} returned {type(moved).__name__}; "
                                f"it must return a tuple of the layer's arguments")
            change = _max_change(base, layer(*moved))
            if not (change < invariant_below or change > changed_above) or math.isnan(change):
                raise ValueError(
                    f"{name} under {t_name!r}: the output moved by {change:.3g}, between "
                    f"{invariant_below:g} (invariant) and {changed_above:g} (changed); choose "
                    f"data that tells the two apart (sets of variance near 1, factors near 1)")
            changes[name, t_name] = change
    return InvarianceTable(tuple(layers), tuple(transforms), changes, invariant_below,
                           changed_above)


# ---------------------------------------------------------------------------------------
# the LN paper's six, on a linear layer z = X W^T
# ---------------------------------------------------------------------------------------
#: The transformations of Ba et al. (2016), Table 1, in its order.
LN_PAPER = ("weight matrix re-scaling", "weight matrix re-centering", "weight vector re-scaling",
            "dataset re-scaling", "dataset re-centering", "single training case re-scaling")


def ln_paper_transforms(v: Tensor, row_scale: Tensor, case_scale: Tensor, a: float = 3.0
                        ) -> dict[str, Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]]:
    r"""The LN paper's six transformations of ``(W, X)`` for the layer ``z = X @ W.T``.

    ``v`` (the input's width) is the vector of both re-centerings, ``row_scale`` (shape
    ``(C, 1)``) the factor of each row :math:`\mathbf{W}_c`, ``case_scale`` (shape ``(N, 1)``)
    the factor of each training case, and ``a`` the factor of the two global re-scalings.
    """
    return {
        "weight matrix re-scaling": lambda W, X: (a * W, X),
        "weight matrix re-centering": lambda W, X: (W + v[None, :], X),   # W + 1 v^T
        "weight vector re-scaling": lambda W, X: (row_scale * W, X),
        "dataset re-scaling": lambda W, X: (W, a * X),
        "dataset re-centering": lambda W, X: (W, X + v[None, :]),
        "single training case re-scaling": lambda W, X: (W, case_scale * X),
    }


# ---------------------------------------------------------------------------------------
# the same ideas on a norm's own input z, of shape (N, C, *S)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputTransform:
    """A scale, a shift, or both, of a norm's input ``z``: ``varies`` lists the roles
    (``"N"`` sample, ``"C"`` channel) along which the factor differs; along the others, and
    over every position, it is the same."""

    name: str
    kind: str                    # "scale", "shift" or "affine" (a scale and a shift)
    varies: tuple[str, ...]


#: Six transformations of a norm's input, from the coarsest to the finest.
INPUT_TRANSFORMS: dict[str, InputTransform] = {t.name: t for t in (
    InputTransform("scale all", "scale", ()),
    InputTransform("scale per sample", "scale", ("N",)),
    InputTransform("scale per channel", "scale", ("C",)),
    InputTransform("shift per sample", "shift", ("N",)),
    InputTransform("shift per channel", "shift", ("C",)),
    InputTransform("scale and shift per (sample, channel)", "affine", ("N", "C")),
)}

#: Each of the LN paper's transformations, seen at the input of the norm after a linear layer.
LN_PAPER_ON_INPUT = {
    "weight matrix re-scaling": "scale all",
    "weight matrix re-centering": "shift per sample",
    "weight vector re-scaling": "scale per channel",
    "dataset re-scaling": "scale all",
    "dataset re-centering": "shift per channel",
    "single training case re-scaling": "scale per sample",
}


def _factor(shape: Sequence[int], varies: tuple[str, ...], low: float, high: float,
            gen: torch.Generator, dtype: torch.dtype) -> Tensor:
    """One draw of size ``low`` to ``high`` and random sign per index of the varying roles,
    broadcast over the rest of ``shape``."""
    size = [1] * len(shape)
    if "N" in varies:
        size[0] = shape[0]
    if "C" in varies:
        size[1] = shape[1]
    size_ = low + (high - low) * torch.rand(size, generator=gen, dtype=dtype)
    sign = torch.randint(0, 2, size, generator=gen).to(dtype) * 2 - 1
    return sign * size_


def input_transforms(shape: Sequence[int], gen: torch.Generator,
                     dtype: torch.dtype = torch.float64, scale: tuple[float, float] = (1.25, 2.0),
                     shift: tuple[float, float] = (0.5, 2.0)
                     ) -> dict[str, Callable[[Tensor], tuple[Tensor]]]:
    r""":data:`INPUT_TRANSFORMS` as functions ``z -> (z',)`` for an input of ``shape``.

    Each factor is drawn from ``gen``, one per index of the roles the transformation varies
    along: a scale is :math:`a` or :math:`1/a` with :math:`a` in ``scale`` (so it is never
    near 1, which no experiment could tell from no scale), a shift is :math:`\pm b` with
    :math:`b` in ``shift``.
    """
    shape = tuple(shape)
    if len(shape) < 2:
        raise ValueError(f"an input of shape (N, C, ...) is needed, got {shape}")
    if not 1 < scale[0] <= scale[1]:
        raise ValueError(f"scale is the range of a > 1 (a or 1/a is drawn), got {scale}")
    if not 0 < shift[0] <= shift[1]:
        raise ValueError(f"shift is the range of b > 0 (+b or -b is drawn), got {shift}")
    out = {}
    for name, t in INPUT_TRANSFORMS.items():
        a = b = None
        if t.kind != "shift":   # log a uniform in [log scale[0], log scale[1]], either sign
            a = torch.exp(_factor(shape, t.varies, math.log(scale[0]), math.log(scale[1]),
                                  gen, dtype))
        if t.kind != "scale":
            b = _factor(shape, t.varies, *shift, gen, dtype)
        if t.kind == "scale":
            out[name] = lambda z, a=a: (a * z,)
        elif t.kind == "shift":
            out[name] = lambda z, b=b: (z + b,)
        else:
            out[name] = lambda z, a=a, b=b: (a * z + b,)
    return out


def spans(roles: Sequence[str], role: str, group_size: int | None = None) -> bool:
    """Whether a set over ``roles`` (:mod:`normcore.axes`) extends along ``role``: along the
    samples if it spans ``N``; along the channels if it spans ``C``, or ``G`` with more than
    one channel in a group (``group_size``, :math:`C/G`; unknown counts as more than one)."""
    if role == "N":
        return "N" in roles
    if role == "C":
        return "C" in roles or ("G" in roles and group_size != 1)
    raise ValueError(f"unknown role {role!r}; a transformation varies along 'N' or 'C'")


def predicted_invariant(roles: Sequence[str], transform: str, *, centers: bool,
                        scales: bool, group_size: int | None = None) -> bool:
    """Whether a layer that standardizes over sets spanning ``roles`` removes ``transform``.

    ``centers``: it subtracts each set's mean (False for RMSNorm); ``scales``: it divides by
    each set's spread; ``group_size``: :math:`C/G` when the roles hold ``G``.  The
    transformation is removed exactly when the layer removes its kind (a shift needs
    ``centers``, a scale ``scales``, both for ``"affine"``) and it is the same on every
    element of each set, i.e. the set does not extend along a role it varies along.
    """
    if transform not in INPUT_TRANSFORMS:
        raise ValueError(f"unknown transformation {transform!r}; expected one of "
                         f"{', '.join(map(repr, INPUT_TRANSFORMS))}")
    t = INPUT_TRANSFORMS[transform]
    kind_ok = {"scale": scales, "shift": centers, "affine": scales and centers}[t.kind]
    return kind_ok and not any(spans(roles, r, group_size) for r in t.varies)
