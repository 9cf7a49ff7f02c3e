"""The variant machinery: a mistake is the reference with one knob turned.

An op's reference computation is a dict of *knobs* (its ``base_spec``: which reduce set,
which variance ``correction``, where eps goes, ...).  A :class:`Variant` names the
catalogue key(s) it stands for and the knobs it changes; ``variant.spec(base)`` is the
whole knob dict the op's ``evaluate`` hook computes with.  Two variants that turn
different knobs add up (``a + b``) to the pair of mistakes made at once.

The ``wrong_axes`` variants reduce over another set of *roles* of the input's view, the
vocabulary of :mod:`normcore.axes` (``N`` batch, ``C`` channels, ``G`` the channels of one
group, ``S`` every spatial dim, and ``last``, only the last dim):
:func:`role_layout` makes a set of roles a :class:`~normcore.axes.Layout` with
:func:`normcore.axes.roles_layout`, and :func:`role_names` names its dims for one input
("(N, H, W)").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .. import axes
from ..axes import Layout

#: (rtol, atol) for "matches" by dtype: float64 sets; a float32 set's own tolerance is
#: derived from torch's rounding on it (:mod:`normcore.exercises.tolerance`), this is its floor.
TOLERANCE = {torch.float64: (1e-6, 1e-8), torch.float32: (1e-4, 1e-4)}


@dataclass(frozen=True)
class Variant:
    """A known mistake (or two at once) as changed knobs.

    ``keys`` are catalogue keys; ``changes`` the ``(knob, value)`` pairs; ``details`` one
    tuple of ``(name, value)`` pairs per key, which the op's ``render_fields`` hook turns
    into words (for instance the roles a ``wrong_axes`` variant reduced over).
    """

    keys: tuple[str, ...]
    changes: tuple[tuple[str, object], ...]
    details: tuple[tuple[tuple[str, object], ...], ...]

    @property
    def knobs(self) -> frozenset:
        """The names of the knobs this variant turns."""
        return frozenset(k for k, _ in self.changes)

    def spec(self, base: dict) -> dict:
        """The op's knob dict ``base`` with this variant's changes applied."""
        s = dict(base)
        s.update(dict(self.changes))
        return s

    def __add__(self, other: Variant) -> Variant:
        return Variant(self.keys + other.keys, self.changes + other.changes,
                       self.details + other.details)


def variant(key: str, changes: dict, **detail) -> Variant:
    """The variant of catalogue entry ``key`` that sets the knobs in ``changes``."""
    return Variant((key,), tuple(changes.items()), (tuple(detail.items()),))


# ---- comparing outputs ---------------------------------------------------------------------
def close(a: torch.Tensor, b: torch.Tensor, tol) -> torch.Tensor:
    """Elementwise "matches" (NaN matches NaN) at ``tol``: an ``(rtol, atol)`` pair, or a
    dtype, whose default :data:`TOLERANCE` then applies."""
    rtol, atol = TOLERANCE[tol] if isinstance(tol, torch.dtype) else tol
    return torch.isclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)


def tolerance_of(case, i: int):
    """The ``(rtol, atol)`` of output ``i`` on ``case``: the set's own
    (:mod:`normcore.exercises.tolerance`), else its dtype's default."""
    return case.tolerance[i] if case.tolerance else TOLERANCE[case.dtype]


def all_close(outs_a, outs_b, cases) -> bool:
    """Every output close on every set; a set where either side is ``None`` (a variant
    that does not exist for that input, such as reducing over (H, W) of an (N, C) input)
    is skipped."""
    return all(bool(close(a, b, tolerance_of(c, i)).all())
               for oa, ob, c in zip(outs_a, outs_b, cases) if oa is not None and ob is not None
               for i, (a, b) in enumerate(zip(oa, ob)))


# ---- statistics whose gradient paths a backward mistake drops -----------------------------
def knob_stats(x: torch.Tensor, lay: Layout, spec: dict, correction: int = 0):
    """``(mean, var)`` of ``x`` over the sets of ``lay`` (in its view, ``keepdim``), to pass
    to :func:`normcore.functional.normalize`: differentiable, except that knob
    ``spec["mean_grad"]`` / ``spec["var_grad"]`` set to ``False`` detaches that statistic,
    the backward pass's mistake of treating it as a constant."""
    var, mean = torch.var_mean(x.reshape(lay.view_shape), dim=lay.reduce_dims,
                               correction=correction, keepdim=True)
    return (mean if spec["mean_grad"] else mean.detach(),
            var if spec["var_grad"] else var.detach())


# ---- wrong reduce sets ---------------------------------------------------------------------
#: The reduce sets tried for ``wrong_axes``, as roles of :mod:`normcore.axes` (``N``,
#: ``C``, ``G``, ``S`` and the extra role ``last``), in the order they are tried: when two
#: give the same numbers on the test sets, the first one names the mistake.
ROLE_SETS = [("N",), ("S",), ("C", "S"), ("N", "C", "S"), ("last",), ("C",), ("N", "C"),
             ("N", "S"), ("G",), ("N", "G", "S"), ("N", "G")]
assert all(set(r) <= set(axes.ROLES + axes.EXTRA_ROLES) for r in ROLE_SETS)


def role_layout(base: Layout, roles) -> Layout | None:
    """``base`` reducing over the dims that ``roles`` name instead of its own
    (:func:`normcore.axes.roles_layout`); ``None`` if they name no dim of this input."""
    grouped = base.norm == "group" and base.num_groups is not None
    if "last" in roles and grouped and len(base.view_shape) == 3:
        # the last dim of an (N, C) input is all of C: both channel dims of the view
        roles = tuple("C" if r == "last" else r for r in roles)
    try:
        lay = axes.roles_layout(base.shape, roles, base.num_groups if grouped else None)
    except ValueError:
        return None
    return dataclasses.replace(base, reduce_dims=lay.reduce_dims)


def role_variants(base_layouts) -> list[Variant]:
    """One ``wrong_axes`` variant per role set that names a dim of some test set."""
    return [variant("wrong_axes", {"reduce": ("roles", roles)}, roles=roles)
            for roles in ROLE_SETS
            if any(role_layout(b, roles) is not None for b in base_layouts)]


def spatial_names(k: int) -> list[str]:
    """The book's names of ``k`` spatial dims: L; H, W; D, H, W."""
    return {0: [], 1: ["L"], 2: ["H", "W"], 3: ["D", "H", "W"]}.get(
        k, [f"S{i}" for i in range(k)])


def role_names(roles, names) -> str:
    """``roles`` in words, with the dim ``names`` of the input: ``(N, H, W)``."""
    parts = []
    if "N" in roles:
        parts.append(names[0])
    if "C" in roles:
        parts.append(names[1])
    elif "G" in roles:
        parts.append("the channels of one group")
    if "S" in roles:
        parts.extend(names[2:])
    elif "last" in roles:
        last = names[-1] if len(names) > 2 else names[1]
        if last not in parts:
            parts.append(last)
    return "(" + ", ".join(parts) + ")"


def same_partition(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Do the label arrays ``a`` and ``b`` group the elements into the same sets?"""
    a, b = a.flatten(), b.flatten()
    return bool(((a[:, None] == a[None, :]) == (b[:, None] == b[None, :])).all())


def wrong_axes_fields(base: Layout, roles, names, norm: str) -> dict:
    """The template fields of a ``wrong_axes`` variant of the norm ``norm``: ``got`` (the
    roles reduced over, in the op's names) and ``other`` (", which is how LayerNorm groups
    the elements" when the wrong set is another norm's, else empty).  ``base`` is the op's
    own layout, which its ``context`` hook keeps under ``"_layout"``."""
    lay = role_layout(base, roles)
    other = ""
    if lay is not None:
        others = [n for n in ("batch", "layer", "instance") if n != norm]
        match = same_set_as(lay, lay.shape, others)
        if match is not None:
            other = f", which is how {axes.TITLES[match]} groups the elements"
    return {"got": role_names(roles, names), "other": other}


def same_set_as(lay: Layout, shape, norms) -> str | None:
    """The first of ``norms`` whose sets are those of ``lay`` on ``shape``, if any."""
    mine = axes.layout_labels(lay)
    for norm in norms:
        if norm == "instance" and len(shape) < 3:
            continue
        if same_partition(mine, axes.stat_groups(norm, shape)):
            return norm
    return None
