r"""Statistics: variances computed three ways, Chan's merge, and running averages.

Biased and unbiased variance
----------------------------
For :math:`n` values with mean :math:`\mu` and :math:`M_2 = \sum_k (x_k - \mu)^2`:

.. math::

    \sigma^2_{\text{biased}} = \frac{M_2}{n}, \qquad
    \sigma^2_{\text{unbiased}} = \frac{M_2}{n - 1} = \sigma^2_{\text{biased}}\,\frac{n}{n-1}.

A normalization layer *normalizes* with the biased variance (it describes the values at
hand) but *stores* the unbiased one in ``running_var`` (it estimates the population variance
that eval mode will use), exactly as PyTorch does.

Three ways to compute a variance
--------------------------------
* :func:`var_naive`: :math:`E[x^2] - E[x]^2`, one pass, but it subtracts two large, nearly
  equal numbers when :math:`|\mu| \gg \sigma` and loses every significant digit.
* :func:`var_two_pass`: first :math:`\mu`, then :math:`\frac1n\sum (x-\mu)^2`. Exact up to
  rounding; reads the data twice.
* :func:`var_welford`: one pass, updating :math:`(n, \mu, M_2)` one value at a time
  (Welford 1962); as accurate as two-pass.

:func:`chan_merge` combines two partial results :math:`(n_a, \mu_a, M_{2,a})` and
:math:`(n_b, \mu_b, M_{2,b})` into the result for the union (Chan, Golub & LeVeque 1979):

.. math::

    n = n_a + n_b,\quad \delta = \mu_b - \mu_a,\quad
    \mu = \mu_a + \delta\,\frac{n_b}{n},\quad
    M_2 = M_{2,a} + M_{2,b} + \delta^2\,\frac{n_a n_b}{n}.

That is what synchronized BatchNorm needs to merge per-device statistics.

Running averages
----------------
PyTorch's ``momentum`` is the weight of the *new* value (the opposite of an optimizer's
momentum):  :math:`r \leftarrow (1 - m)\, r + m\, s`.  With ``momentum=None`` the factor is
:math:`1 / t` at step :math:`t` (``num_batches_tracked``), which makes :math:`r` the plain
average of every batch statistic seen so far.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch


def _dims(x: torch.Tensor, dim) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(x.dim()))
    if isinstance(dim, int):
        return (dim,)
    return tuple(dim)


def _count(x: torch.Tensor, dims: Sequence[int]) -> int:
    return math.prod(x.shape[d] for d in dims)


# ---------------------------------------------------------------------------------------
# biased / unbiased
# ---------------------------------------------------------------------------------------
def unbiased_from_biased(var: torch.Tensor, n: int) -> torch.Tensor:
    """Bessel's correction: ``var * n / (n - 1)``.  Needs ``n >= 2``."""
    if n < 2:
        raise ValueError(
            f"the unbiased variance needs at least 2 values per statistic, got n={n}")
    return var * (n / (n - 1))


# ---------------------------------------------------------------------------------------
# three ways to compute a variance (biased unless correction=1)
# ---------------------------------------------------------------------------------------
def var_naive(x: torch.Tensor, dim=None, correction: int = 0, keepdim: bool = False) -> torch.Tensor:
    r"""One pass, :math:`E[x^2] - E[x]^2`.  Catastrophic cancellation when :math:`|\mu|\gg\sigma`."""
    dims = _dims(x, dim)
    n = _count(x, dims)
    mean = x.mean(dims, keepdim=True)
    mean_sq = (x * x).mean(dims, keepdim=True)
    var = (mean_sq - mean * mean) * (n / (n - correction))
    return var if keepdim else var.squeeze(dims) if dims else var


def var_two_pass(x: torch.Tensor, dim=None, correction: int = 0, keepdim: bool = False) -> torch.Tensor:
    r"""Two passes: :math:`\mu` first, then :math:`\sum (x - \mu)^2 / (n - \text{correction})`."""
    dims = _dims(x, dim)
    n = _count(x, dims)
    mean = x.mean(dims, keepdim=True)
    var = ((x - mean) ** 2).sum(dims, keepdim=True) / (n - correction)
    return var if keepdim else var.squeeze(dims) if dims else var


class Moments(NamedTuple):
    """Partial statistics of a set: its size, mean and sum of squared deviations ``M2``."""

    count: torch.Tensor | int
    mean: torch.Tensor
    m2: torch.Tensor

    def var(self, correction: int = 0) -> torch.Tensor:
        """The variance these moments describe (biased for ``correction=0``)."""
        return self.m2 / (self.count - correction)


def welford(x: torch.Tensor, dim: int = 0) -> Moments:
    r"""Welford's online algorithm along ``dim``: one value at a time.

    .. math::

        n \leftarrow n + 1,\quad \delta = x - \mu,\quad \mu \leftarrow \mu + \delta / n,\quad
        M_2 \leftarrow M_2 + \delta\,(x - \mu).

    Vectorized over every other dim; the loop over ``dim`` is a Python loop, which is the
    point (it shows the streaming update) and fine for the sizes of the book.
    """
    xs = x.movedim(dim, 0)
    mean = torch.zeros_like(xs[0])
    m2 = torch.zeros_like(xs[0])
    for n, value in enumerate(xs, start=1):
        delta = value - mean
        mean = mean + delta / n
        m2 = m2 + delta * (value - mean)
    return Moments(xs.shape[0], mean, m2)


def var_welford(x: torch.Tensor, dim: int = 0, correction: int = 0) -> torch.Tensor:
    """The variance along ``dim`` by :func:`welford`."""
    return welford(x, dim).var(correction)


def moments(x: torch.Tensor, dim=None, keepdim: bool = False) -> Moments:
    """:class:`Moments` of ``x`` over ``dim`` (two-pass)."""
    dims = _dims(x, dim)
    n = _count(x, dims)
    var, mean = torch.var_mean(x, dim=dims, correction=0, keepdim=keepdim)
    return Moments(n, mean, var * n)


def chan_merge(a: Moments, b: Moments) -> Moments:
    """Chan, Golub & LeVeque's pairwise merge of two partial :class:`Moments`."""
    n = a.count + b.count
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / n)
    m2 = a.m2 + b.m2 + delta * delta * (a.count * b.count / n)
    return Moments(n, mean, m2)


def chan_merge_many(parts: Sequence[Moments]) -> Moments:
    """Merge any number of partial :class:`Moments`, pairwise as a tree (stable, parallel)."""
    parts = [p for p in parts if (p.count if isinstance(p.count, int) else int(p.count)) > 0]
    if not parts:
        raise ValueError("chan_merge_many needs at least one non-empty part")
    while len(parts) > 1:
        merged = [chan_merge(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            merged.append(parts[-1])
        parts = merged
    return parts[0]


# ---------------------------------------------------------------------------------------
# running statistics
# ---------------------------------------------------------------------------------------
def check_momentum(momentum) -> None:
    """``momentum`` must be ``None`` (cumulative average) or a number in [0, 1]."""
    if momentum is None:
        return
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise TypeError(f"momentum must be a float in [0, 1] or None, got {momentum!r}")
    if torch.compiler.is_compiling():
        # BatchNorm's 1 / num_batches_tracked may be a value of the graph (in (0, 1]): no
        # guard on it (imported here: the module costs most of a second to import)
        from torch.fx.experimental.symbolic_shapes import guard_or_true
        ok = guard_or_true(0.0 <= momentum) and guard_or_true(momentum <= 1.0)
    else:
        ok = 0.0 <= float(momentum) <= 1.0
    if not ok:
        raise ValueError(
            f"momentum={momentum} is outside [0, 1]; it is the weight of the new batch "
            f"statistic in r <- (1 - momentum) * r + momentum * s (PyTorch default 0.1)")


def averaging_factor(momentum: float | None, num_batches_tracked: int) -> float:
    """The weight of the new statistic at this step: ``momentum``, or ``1/t`` when ``None``."""
    check_momentum(momentum)
    if momentum is None:
        if num_batches_tracked < 1:
            raise ValueError("the cumulative average (momentum=None) needs num_batches_tracked >= 1")
        return 1.0 / float(num_batches_tracked)
    return float(momentum)


@torch.no_grad()
def ema_update_(running: torch.Tensor, value: torch.Tensor, factor: float) -> torch.Tensor:
    r"""In place: :math:`r \leftarrow (1 - f)\, r + f\, v`.  Returns ``running``."""
    running.mul_(1.0 - factor).add_(value.to(running.dtype), alpha=factor)
    return running


class RunningStats:
    """The bookkeeping of a BatchNorm layer's buffers, on its own, for simulations.

    ``update(batch)`` takes a ``(B, C)`` batch, computes its mean and biased variance,
    stores the unbiased one, and applies the EMA (or the cumulative average when
    ``momentum is None``), exactly as ``torch.nn.BatchNorm1d`` does in train mode.
    """

    def __init__(self, num_features: int, momentum: float | None = 0.1, dtype=torch.float32):
        check_momentum(momentum)
        self.momentum = momentum
        self.mean = torch.zeros(num_features, dtype=dtype)
        self.var = torch.ones(num_features, dtype=dtype)
        self.num_batches_tracked = 0

    def update(self, batch: torch.Tensor) -> RunningStats:
        if batch.dim() != 2 or batch.shape[1] != self.mean.shape[0]:
            raise ValueError(
                f"expected a batch of shape (B, {self.mean.shape[0]}), got {tuple(batch.shape)}")
        n = batch.shape[0]
        var, mean = torch.var_mean(batch, dim=0, correction=0)
        self.num_batches_tracked += 1
        f = averaging_factor(self.momentum, self.num_batches_tracked)
        ema_update_(self.mean, mean, f)
        ema_update_(self.var, unbiased_from_biased(var, n), f)
        return self
