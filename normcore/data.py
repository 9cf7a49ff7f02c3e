r"""Seeded inputs, one source for the exercises, the experiments and the tests.

Every draw goes through a ``torch.Generator`` (never the global RNG) and is made in float64,
then cast: the same seed gives the same numbers in every dtype, on every machine.

* :func:`normal`: standard normal values;
* :func:`structured`: an ``(N, C, *)`` input whose channels have different means and scales
  and whose samples are shifted apart, so that *every* choice of reduce dims gives different
  statistics (what a checker needs to tell BN's set from IN's, LN's or GN's);
* :func:`large_mean`: values :math:`4096 + d`, a small spread on a large mean, where
  :math:`E[x^2]-E[x]^2` cancels to exactly 0 in float32;
* :func:`affine`: gamma and beta away from the identity.
"""
from __future__ import annotations

import torch

__all__ = ["generator", "normal", "structured", "large_mean", "affine", "LARGE_MEAN"]

LARGE_MEAN = 4096.0


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(int(seed))


def normal(gen: torch.Generator, shape, dtype=torch.float64) -> torch.Tensor:
    """Standard normal values of ``shape``, drawn in float64."""
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(dtype)


def structured(gen: torch.Generator, shape, dtype=torch.float64, *, scale=(0.5, 2.5),
               shift: float = 2.0, sample_shift: float = 1.0) -> torch.Tensor:
    """Normal values with a per-channel scale (uniform in ``scale``) and shift
    (``shift`` times a normal draw) along dim 1, and a per-sample shift along dim 0
    (``sample_shift`` times a normal draw; 0 for none)."""
    shape = tuple(shape)
    x = normal(gen, shape)
    if len(shape) >= 2:
        per_channel = [1] * len(shape)
        per_channel[1] = shape[1]
        lo, hi = scale
        s = lo + (hi - lo) * torch.rand(shape[1], generator=gen, dtype=torch.float64)
        b = shift * normal(gen, (shape[1],))
        x = x * s.view(per_channel) + b.view(per_channel)
    per_sample = [1] * len(shape)
    per_sample[0] = shape[0]
    if sample_shift:
        x = x + sample_shift * normal(gen, (shape[0],)).view(per_sample)
    return x.to(dtype)


def large_mean(gen: torch.Generator, shape, dtype=torch.float32) -> torch.Tensor:
    """4096 + d with d in {-0.5, -0.25, 0.25, 0.5}.  With power-of-two set sizes, every sum
    in E[x^2] - E[x]^2 is exact in float32 in any order, and the result is exactly 0 (the
    true variance is about 0.16): a deterministic catastrophic cancellation."""
    levels = torch.tensor([-0.5, -0.25, 0.25, 0.5], dtype=torch.float64)
    d = levels[torch.randint(0, 4, tuple(shape), generator=gen)]
    return (LARGE_MEAN + d).to(dtype)


def affine(gen: torch.Generator, shape, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """gamma uniform in [0.5, 2] and beta of spread 0.5: an affine map far from y = x."""
    gamma = (0.5 + 1.5 * torch.rand(tuple(shape), generator=gen, dtype=torch.float64)).to(dtype)
    beta = (0.5 * normal(gen, shape)).to(dtype)
    return gamma, beta
