"""The seeded inputs a checker runs the student's function on (its *test sets*).

Each op's ``cases`` hook builds a few :class:`Case` objects from one
``torch.Generator``, never the global random state, with the draws of
:mod:`normcore.data`: values whose channels and samples differ in mean and scale (so that
every wrong reduce set gives other numbers), and values with a large mean and a small spread
(so that E[x^2] - E[x]^2 fails).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import data
from .report import dtype_text, shape_text

LARGE_MEAN = data.LARGE_MEAN
#: Names of the test sets, in the order an op builds them.
SET_NAMES = "ABCDEFGHIJ"


@dataclass
class Case:
    """One test set: the keyword arguments of the call and what the messages say of it.

    ``kind`` marks the sets a message refers to: ``"regular"``, ``"float32"``,
    ``"nearzero"`` (a nearly constant set and a large eps) or ``"largemean"``.
    ``options`` are the parsed options of :func:`check` the set was built under.
    ``tolerance``: one ``(rtol, atol)`` per output, which :func:`check` fills in
    (:mod:`.tolerance`); empty, the dtype's default
    (:data:`~normcore.exercises.variants.TOLERANCE`) applies.
    """

    name: str
    label: str
    args: dict
    shape: tuple
    dtype: torch.dtype
    eps: float = 1e-5
    groups: int | None = None
    kind: str = "regular"
    options: dict = field(default_factory=dict)
    tolerance: tuple = ()

    @property
    def title(self) -> str:
        return f"set {self.name} ({self.label})"

    @property
    def short(self) -> str:
        """The set's name with its shape and dtype only."""
        what = self.label.split(" of shape ")[0]
        return (f"set {self.name} ({what} of shape {shape_text(self.shape)}, "
                f"{dtype_text(self.dtype)})")


# the draws themselves come from normcore.data, the one source of seeded inputs
draw = data.normal
structured = data.structured
large_mean = data.large_mean
affine = data.affine
