"""The seeded inputs a checker runs the student's function on (its *test sets*).

Each op's ``cases`` hook builds a few :class:`Case` objects from one
``torch.Generator``, never the global random state, with the helpers below: values whose
channels and samples differ in mean and scale (so that every wrong reduce set gives other
numbers), and values with a large mean and a small spread (so that E[x^2] - E[x]^2 fails).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .report import dtype_text, shape_text

LARGE_MEAN = 4096.0
#: Names of the test sets, in the order an op builds them.
SET_NAMES = "ABCDEFGHIJ"


@dataclass
class Case:
    """One test set: the keyword arguments of the call and what the messages say of it.

    ``kind`` marks the sets a message refers to: ``"regular"``, ``"float32"``,
    ``"nearzero"`` (a nearly constant set and a large eps) or ``"largemean"``.
    ``options`` are the parsed options of :func:`check` the set was built under.
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

    @property
    def title(self) -> str:
        return f"set {self.name} ({self.label})"

    @property
    def short(self) -> str:
        """The set's name with its shape and dtype only."""
        what = self.label.split(" of shape ")[0]
        return f"set {self.name} ({what} of shape {shape_text(self.shape)}, " \
               f"{dtype_text(self.dtype)})"


def draw(gen: torch.Generator, shape, dtype=torch.float64) -> torch.Tensor:
    """Standard normal values, drawn in float64 whatever ``dtype`` (the same numbers)."""
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def structured(gen: torch.Generator, shape, dtype) -> torch.Tensor:
    """Channels (and samples) with different means and scales, so that every choice of
    reduce dims gives different statistics."""
    x = draw(gen, shape)
    view = [1] * len(shape)
    if len(shape) >= 2:
        channel_view = list(view)
        channel_view[1] = shape[1]
        scale = 0.5 + 2.0 * torch.rand(shape[1], generator=gen, dtype=torch.float64)
        shift = 2.0 * draw(gen, (shape[1],))
        x = x * scale.view(channel_view) + shift.view(channel_view)
    sample_view = list(view)
    sample_view[0] = shape[0]
    x = x + draw(gen, (shape[0],)).view(sample_view)
    return x.to(dtype)


def large_mean(gen: torch.Generator, shape, dtype=torch.float32) -> torch.Tensor:
    """4096 + d with d in {-0.5, -0.25, 0.25, 0.5}.  With power-of-two set sizes, every sum
    in E[x^2] - E[x]^2 is exact in float32 in any order, and the result is exactly 0 (the
    true variance is about 0.16): a deterministic catastrophic cancellation."""
    levels = torch.tensor([-0.5, -0.25, 0.25, 0.5], dtype=torch.float64)
    d = levels[torch.randint(0, 4, shape, generator=gen)]
    return (LARGE_MEAN + d).to(dtype)


def affine(gen: torch.Generator, shape, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``gamma`` in [0.5, 2) and ``beta`` around 0, so that a missing affine map shows."""
    gamma = (0.5 + 1.5 * torch.rand(shape, generator=gen, dtype=torch.float64)).to(dtype)
    beta = (0.5 * draw(gen, shape)).to(dtype)
    return gamma, beta
