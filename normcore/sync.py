r"""Synchronized BatchNorm on CPU: one batch, split over processes, normalized as one.

Why synchronize
---------------
With data parallelism every process ("rank") holds a slice :math:`B_r` of the global batch
:math:`B = B_1 \cup \dots \cup B_W`.  Plain BatchNorm on each rank normalizes with the
statistics of its own slice, so the model computes something else than it would on the whole
batch, and worse the smaller the slices are (a local batch of 1 cannot be trained at all).
Synchronized BatchNorm normalizes every slice with the statistics of :math:`B`, so that the
``W`` processes together compute exactly what one BatchNorm computes on the full batch:
the same outputs, the same gradients, the same running buffers.

Forward: merge the ranks' moments with Chan's formula
------------------------------------------------------
For a channel :math:`c`, rank :math:`r` computes the moments of its own values: their number
:math:`n_r` (``N_r`` times the spatial size), mean :math:`\mu_r` and sum of squared deviations
:math:`M_{2,r} = \sum_{k \in B_r} (x_k - \mu_r)^2`.  One ``all_gather`` of the ``2C + 1``
numbers :math:`(n_r, \mu_r, M_{2,r})` gives every rank the moments of every slice, and
Chan, Golub & LeVeque's merge (:func:`normcore.stats.chan_merge`)

.. math::

    n = n_a + n_b,\quad \delta = \mu_b - \mu_a,\quad
    \mu = \mu_a + \delta\,\frac{n_b}{n},\quad
    M_2 = M_{2,a} + M_{2,b} + \delta^2\,\frac{n_a n_b}{n},

applied pairwise as a tree (:func:`normcore.stats.chan_merge_many`), gives the moments of the
whole batch.  The merge is *exact* for any split, unequal ones included, because
:math:`M_2` of a union is the two within-part sums plus the spread between the parts' means
(the :math:`\delta^2` term).  Averaging the ranks' variances instead would forget that term
and weigh a rank of 1 sample like a rank of 100.  Then, with the global
:math:`\mu` and biased variance :math:`\sigma^2 = M_2 / n`,

.. math::

    \hat x_i = (x_i - \mu)\, s,\qquad s = \frac{1}{\sqrt{\sigma^2 + \epsilon}},\qquad
    y_i = \gamma\,\hat x_i + \beta,

and the buffers are updated, as in BatchNorm, with the unbiased :math:`M_2 / (n - 1)` and the
same factor on every rank (``momentum``, or :math:`1/t` when ``momentum=None``), so every
rank's ``running_mean``, ``running_var`` and ``num_batches_tracked`` stay identical to those
of a BatchNorm that saw the full batch.

Why gather the moments and not the sums :math:`\sum x, \sum x^2`?  Those would need one
``all_reduce`` only, but :math:`E[x^2] - E[x]^2` cancels catastrophically when
:math:`|\mu| \gg \sigma` (see :func:`normcore.stats.var_naive`).  Moments of
``2C + 1`` numbers per rank cost nothing to gather and merge stably.

Backward: two per-channel sums, one all_reduce
------------------------------------------------
With :math:`g_i = \partial L / \partial y_i` and the sums over the *whole* batch,

.. math::

    \frac{\partial L}{\partial \beta} = \sum_k g_k,\qquad
    \frac{\partial L}{\partial \gamma} = \sum_k g_k \hat x_k,\qquad
    \frac{\partial L}{\partial x_i} = \gamma\, s\,\Bigl(g_i - \frac1n \sum_k g_k
        - \hat x_i\, \frac1n \sum_k g_k \hat x_k\Bigr).

A rank holds only its own :math:`g_i`, and the input gradient needs the two global sums
:math:`\sum_k g_k` and :math:`\sum_k g_k \hat x_k`.  So the backward computes them on its
slice, ``all_reduce``\ s the ``2C`` numbers (SUM), and then every rank has its slice of the
full-batch input gradient exactly.  The gradients of :math:`\gamma` and :math:`\beta` are
returned as the *local* sums: the data-parallel wrapper (DDP) all-reduces parameter
gradients anyway, and the sum over ranks of the local parts is the full-batch gradient.
(``torch.nn.SyncBatchNorm`` does the same.)

This is a ``torch.autograd.Function`` with that hand-written backward rather than autograd
through a differentiable all-gather (``torch.distributed.nn.functional.all_gather``, which
does work on gloo but is deprecated in torch 2.13, and whose backward is an all-to-all of
every gathered tensor followed by autograd through the Chan merge): the formula above is the
one the chapter derives, and it needs exactly one collective of ``2C`` numbers.

Rules of the game
-----------------
* Every rank must call ``forward`` (in training) and ``backward`` the same number of times,
  in the same order: each is a collective, and a rank that skips one leaves the others
  waiting (until the process group's timeout).
* **Empty local batch** (``N_r = 0``): allowed, as in ``torch.nn.SyncBatchNorm``.  The rank
  contributes :math:`n_r = 0` (Chan's merge skips it), gets an empty output, still takes part
  in both collectives, and its local :math:`\gamma, \beta` gradients are zero.
  The *global* count must be at least 2 (a rank with one sample is fine when others have
  more); otherwise every rank raises the ``ValueError`` that BatchNorm raises.
* **Eval mode** normalizes with the buffers, which are identical on every rank: no
  communication.  ``track_running_stats=False`` in eval mode uses the local batch's
  statistics, unsynchronized (as torch does).
* **World of size 1**: plain BatchNorm (:class:`normcore.nn.BatchNorm1d` and friends).
* **No process group**: training mode raises a ``RuntimeError`` that says to call
  ``torch.distributed.init_process_group`` (a world of size 1 is fine) or to use
  ``normcore.nn.BatchNorm*d``.  ``torch.nn.SyncBatchNorm`` silently falls back to BatchNorm
  here; we don't, because "every rank quietly normalized with its own slice" is exactly the
  bug this module exists to prevent.

Where the rest lives
--------------------
The module is :class:`normcore.nn.SyncBatchNorm`; the process launcher that runs a function
in ``W`` processes joined in a gloo group is :func:`normcore.launch.run`; the chapter's
side-by-side comparison (per-device, synchronized and full-batch BN) is
:mod:`normcore.experiments.sync`.  :mod:`normcore.distributed` gathers all of them under one
name.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _checks as checks
from . import axes, stats
from .core import compute_dtype
from .defaults import EPS, MOMENTUM

__all__ = [
    "SyncBatchNormFunction", "sync_batch_norm", "local_moments", "all_gather_moments",
    "merge", "require_process_group",
]


def _bn_layout(x: Tensor) -> axes.Layout:
    """BatchNorm's set, from the table: every sample and position of one channel."""
    return axes.layout("batch", x.shape)


# ---------------------------------------------------------------------------------------
# moments: local, gathered, merged
# ---------------------------------------------------------------------------------------
def local_moments(x: Tensor) -> stats.Moments:
    r"""This rank's per-channel :class:`~normcore.stats.Moments` of an ``(N, C, *)`` input.

    ``count`` is the number of values per channel, :math:`N \cdot \prod \text{spatial}` (an
    ``int``); ``mean`` and ``m2`` have shape ``(C,)``.  An empty slice (``N = 0``) has count 0
    and zero mean and ``m2`` (``torch.var_mean`` of nothing would be NaN).
    """
    C = x.shape[1]
    count = x.numel() // C if C else 0
    if count == 0:
        zeros = x.new_zeros(C)
        return stats.Moments(0, zeros, zeros.clone())
    var, mean = torch.var_mean(x, dim=_bn_layout(x).reduce_dims, correction=0)  # two-pass
    return stats.Moments(count, mean, var * count)                     # M2 = n * biased var


def all_gather_moments(local: stats.Moments,
                       group: dist.ProcessGroup | None = None) -> list[stats.Moments]:
    """Every rank's :class:`~normcore.stats.Moments`, in rank order (one ``all_gather``).

    The ``2C + 1`` numbers ``(count, mean, m2)`` are packed into one float64 tensor: one
    collective, and the count stays exact (float32 would round counts above 2**24).
    """
    C = local.mean.shape[0]
    packed = torch.cat([local.mean.new_tensor([float(local.count)], dtype=torch.float64),
                        local.mean.detach().to(torch.float64),
                        local.m2.detach().to(torch.float64)])
    gathered = [torch.empty_like(packed) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, packed, group=group)
    return [stats.Moments(int(p[0].item()), p[1:C + 1], p[C + 1:]) for p in gathered]


def merge(parts: Sequence[stats.Moments]) -> stats.Moments:
    """Chan's merge of the ranks' moments (empty ranks skipped), with BatchNorm's size check."""
    total = sum(int(p.count) for p in parts)
    if total <= 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got {total} value(s) per "
            f"channel over all {len(parts)} ranks (local counts {[int(p.count) for p in parts]}). "
            f"(SyncBatchNorm: a batch statistic over one value is that value; use a larger "
            f"global batch, or eval mode)")
    return stats.chan_merge_many(parts)


# ---------------------------------------------------------------------------------------
# the autograd Function: forward with merged moments, backward with two all-reduced sums
# ---------------------------------------------------------------------------------------
class SyncBatchNormFunction(torch.autograd.Function):
    """Training-mode BatchNorm with the global batch's statistics (module docstring):
    ``SyncBatchNormFunction.apply(input, weight, bias, running_mean, running_var, momentum,
    eps, group)``."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, weight: Tensor | None, bias: Tensor | None,
                running_mean: Tensor | None, running_var: Tensor | None,
                momentum: float, eps: float, group: dist.ProcessGroup | None) -> Tensor:
        cdt = compute_dtype(input.dtype)
        x = input.to(cdt)
        view = _bn_layout(x).affine_view_shape                   # broadcast per channel
        # 1. (n_r, mu_r, M2_r) on this slice;  2. all_gather;  3. Chan's merge
        merged = merge(all_gather_moments(local_moments(x), group))
        n = int(merged.count)                                    # global values per channel
        mean = merged.mean.to(cdt)                               # mu
        var = (merged.m2 / n).to(cdt)                            # sigma^2 = M2 / n (biased)
        invstd = torch.rsqrt(var + eps)                          # s = 1 / sqrt(sigma^2 + eps)
        # 4. running buffers: EMA (or cumulative) with mu and the unbiased M2 / (n - 1)
        if running_mean is not None and running_var is not None:
            stats.ema_update_(running_mean, merged.mean, momentum)
            stats.ema_update_(running_var, merged.m2 / (n - 1), momentum)
        # 5. y = gamma * x_hat + beta, folded into one scale and shift per channel
        scale = invstd if weight is None else invstd * weight.to(cdt)   # gamma * s
        shift = -mean * scale if bias is None else bias.to(cdt) - mean * scale
        y = torch.addcmul(shift.view(view), x, scale.view(view))        # x * scale + shift
        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.n, ctx.group, ctx.cdt, ctx.has_bias = n, group, cdt, bias is not None
        ctx.param_dtype = None if weight is None else weight.dtype
        return y.to(input.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        input, weight, mean, invstd = ctx.saved_tensors
        cdt, n = ctx.cdt, ctx.n
        C = input.shape[1]
        lay = _bn_layout(input)
        view, dims = lay.affine_view_shape, lay.reduce_dims
        g = grad_output.to(cdt)                                  # g_i = dL/dy_i (this slice)
        x_hat = (input.to(cdt) - mean.view(view)) * invstd.view(view)
        # the local parts of sum_k g_k and sum_k g_k x_hat_k (zeros on an empty slice)
        sum_g = g.sum(dims)
        sum_g_xhat = (g * x_hat).sum(dims)
        # the parameters' gradients are the local parts; DDP sums them over the ranks
        grad_weight = sum_g_xhat.to(ctx.param_dtype) if ctx.needs_input_grad[1] else None
        grad_bias = sum_g.to(ctx.param_dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_input = None
        if ctx.needs_input_grad[0]:
            # one all_reduce of 2C numbers makes both sums global
            both = torch.cat([sum_g, sum_g_xhat])
            dist.all_reduce(both, op=dist.ReduceOp.SUM, group=ctx.group)
            mean_g, mean_g_xhat = (both / n).split(C)            # (1/n) sums over all ranks
            gamma_s = invstd if weight is None else invstd * weight.to(cdt)
            # dL/dx_i = gamma s (g_i - mean(g) - x_hat_i mean(g x_hat))
            grad_input = gamma_s.view(view) * (g - mean_g.view(view)
                                               - x_hat * mean_g_xhat.view(view))
            grad_input = grad_input.to(input.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def sync_batch_norm(input: Tensor, running_mean: Tensor | None = None,
                    running_var: Tensor | None = None, weight: Tensor | None = None,
                    bias: Tensor | None = None, momentum: float | None = MOMENTUM,
                    eps: float = EPS, process_group: dist.ProcessGroup | None = None) -> Tensor:
    r"""Training-mode BatchNorm whose statistics are those of the batch over all ranks.

    ``input`` is this rank's slice ``(N_r, C, *)``.  Every rank of ``process_group`` (default:
    the world) must call it.  If given, ``running_mean`` and ``running_var`` are updated in
    place with the global mean and unbiased variance and weight ``momentum`` (a number: pass
    ``1 / num_batches_tracked`` for the cumulative average; the module does that for you).
    """
    caller = "sync_batch_norm"
    checks.check_float(input, "input", caller)
    checks.check_eps(eps, caller)
    checks.check_momentum(momentum)
    momentum = checks.momentum_value(momentum, caller)  # None raises the explanatory TypeError
    if input.dim() < 2:
        raise ValueError(
            f"{caller}: expected an input of shape (N, C, *), got shape {tuple(input.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{caller}: give both running_mean and running_var, or neither")
    require_process_group(caller)
    return SyncBatchNormFunction.apply(input, weight, bias, running_mean, running_var,
                                  float(momentum), float(eps), process_group)


def require_process_group(who: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{who}: training mode needs torch.distributed's default process group to "
            f"synchronize the batch statistics, and none is initialized. Call "
            f"torch.distributed.init_process_group('gloo', rank=..., world_size=...) in every "
            f"process first (normcore.launch.run does it for you; a world of size 1 is "
            f"fine), or use normcore.nn.BatchNorm1d/2d/3d for single-process training. "
            f"(torch.nn.SyncBatchNorm would silently fall back to per-process BatchNorm here.)")
