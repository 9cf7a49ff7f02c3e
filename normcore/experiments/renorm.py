r"""Batch Renormalization (Ioffe 2017): BatchNorm that trains with its inference statistics.

BatchNorm normalizes with the batch's :math:`\mu_B, \sigma_B` in training and with the running
:math:`\hat\mu, \hat\sigma` at inference, two different functions of an example.  Batch Renorm
writes the inference normalization through the batch's,

.. math::

    \frac{x - \hat\mu}{\hat\sigma} = \frac{x - \mu_B}{\sigma_B}\, r + d, \qquad
    r = \frac{\sigma_B}{\hat\sigma}, \quad d = \frac{\mu_B - \hat\mu}{\hat\sigma},

and trains with the right-hand side, holding ``r`` and ``d`` constant in the backward pass
(stop-gradient) and clipping them, ``r`` to ``[1 / r_max, r_max]`` and ``d`` to
``[-d_max, d_max]`` (the paper's Algorithm 1).  Unclipped, a training step computes what
inference computes; the gradient still flows through :math:`\mu_B, \sigma_B` as in BN.  With
``r_max = 1`` and ``d_max = 0`` it *is* BatchNorm in training.  Here
:math:`\sigma_B = \sqrt{\sigma^2_B + \epsilon}` with the biased batch variance, and the
running buffers track :math:`\mu_B` and :math:`\sigma_B` (a standard deviation, not a
variance) by ``m <- m + momentum (batch - m)``.

The part of the formula that is BN's, :math:`(x - \mu_B)/\sigma_B` with its gradient, is
BatchNorm's training forward (torch's fused kernel, the function
:func:`normcore.functional.batch_norm` computes, faster on the small tensors of the chapter's
runs); this module adds ``r``, ``d``, the clipping and the buffers.  :func:`schedule` is a
warm-up of the clipping bounds in the manner of the paper's, for a run of any length.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from .. import axes

__all__ = ["batch_renorm", "BatchRenorm1d", "schedule"]


def batch_renorm(x: torch.Tensor, running_mean: torch.Tensor, running_std: torch.Tensor,
                 weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 training: bool = False, r_max: float = 3.0, d_max: float = 5.0,
                 momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    """Batch Renormalization of ``x`` ``(N, C, *)``, one statistic per channel (dim 1).

    ``training=True``: normalize with the batch's statistics, corrected by the clipped,
    constant ``r`` and ``d``, and update ``running_mean`` and ``running_std`` in place.
    ``training=False``: normalize with the running buffers.
    """
    C = x.shape[1] if x.dim() >= 2 else 0
    if x.dim() < 2 or running_mean.shape != (C,) or running_std.shape != (C,):
        raise ValueError(f"batch_renorm: expects x of shape (N, C, ...) and buffers of shape "
                         f"(C,), got x {tuple(x.shape)}, running_mean "
                         f"{tuple(running_mean.shape)}, running_std {tuple(running_std.shape)}")
    if r_max < 1 or d_max < 0:
        raise ValueError(f"batch_renorm: r is clipped to [1/r_max, r_max] and d to "
                         f"[-d_max, d_max], so r_max >= 1 and d_max >= 0; got r_max={r_max}, "
                         f"d_max={d_max}")
    view = (1, C) + (1,) * (x.dim() - 2)
    if training:
        dims = axes.reduce_dims("batch", x.shape)       # every sample and position
        with torch.no_grad():
            var_b, mu_b = torch.var_mean(x, dim=dims, correction=0)
            sigma_b = torch.sqrt(var_b + eps)
            r = (sigma_b / running_std).clamp(1 / r_max, r_max)        # stop-gradient
            d = ((mu_b - running_mean) / running_std).clamp(-d_max, d_max)
            running_mean.add_(momentum * (mu_b - running_mean))
            running_std.add_(momentum * (sigma_b - running_std))
        xhat = TF.batch_norm(x, None, None, training=True, eps=eps)    # (x - mu_B) / sigma_B
        xhat = xhat * r.view(view) + d.view(view)
    else:
        xhat = (x - running_mean.view(view)) / running_std.view(view)
    if weight is not None:
        xhat = xhat * weight.view(view)
    if bias is not None:
        xhat = xhat + bias.view(view)
    return xhat


def schedule(step: int, steps: int, r_max: float = 3.0, d_max: float = 5.0) -> tuple[float, float]:
    """The clipping bounds ``(r_max, d_max)`` at ``step`` of a run of ``steps``.

    The paper trains as plain BN (``r_max = 1``, ``d_max = 0``) for its first 5k steps, while
    the running averages settle, then relaxes the bounds gradually, reaching ``d_max = 5`` at
    25k and ``r_max = 3`` at 40k steps.  A run here is a few hundred steps, so the warm-up
    is stated as shares of the run instead: plain BN for the first 5%, then linear ramps
    that reach ``d_max`` at 20% and ``r_max`` at 30% of the steps.
    """
    start, d_end, r_end = 0.05 * steps, 0.20 * steps, 0.30 * steps

    def ramp(end: float) -> float:
        return min(max((step - start) / (end - start), 0.0), 1.0)

    return 1.0 + (r_max - 1.0) * ramp(r_end), d_max * ramp(d_end)


class BatchRenorm1d(torch.nn.Module):
    """:func:`batch_renorm` as a layer, for inputs ``(N, C)`` or ``(N, C, L)``; set the
    clipping bounds with :meth:`set_bounds` (the training loop follows :func:`schedule`)."""

    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.r_max, self.d_max = 1.0, 0.0
        self.weight = torch.nn.Parameter(torch.ones(num_features))
        self.bias = torch.nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_std", torch.ones(num_features))

    def set_bounds(self, r_max: float, d_max: float) -> None:
        self.r_max, self.d_max = float(r_max), float(d_max)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return batch_renorm(x, self.running_mean, self.running_std, self.weight, self.bias,
                            self.training, self.r_max, self.d_max, self.momentum, self.eps)
