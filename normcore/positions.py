r"""The compiled kernels' loops for ``channels_last`` memory: GroupNorm, InstanceNorm and
BatchNorm on the ``(N, P, C)`` view of the input's own memory (samples, positions, channels;
BatchNorm is one sample of every position), where a set's values are spread over the
positions, C apart.  Compiled and run as :mod:`normcore.loops`' kernels are.

* Forward, GN and IN (:func:`sample_forward`): sample by sample while it is in cache, the
  sums per channel about the channel's first value (again about its mean where that
  cancelled past :data:`normcore.loops.ONE_PASS_RATIO`), each set's mean and variance from
  its channels' (exactly: the squared deviations plus the spread of the channel means),
  then the output.  One sample is one thread's: its output does not depend on the others.
  BN's one sample (:func:`forward_positions`): the same sums by chunks of positions among the
  threads, combined in float64, then the output by chunks.
* Backward (:func:`backward_positions`): per sample and channel :math:`\sum g\,(x-\mu)` and
  :math:`\sum g`, then :math:`\partial L/\partial x = g\,\gamma r - (x-\mu)\,r^2
  \sum_S d\hat x/n - r \sum_S d/n` with :math:`d = g\gamma`.
* BN and IN in eval mode (:func:`backward_fixed`): dx and both sums in one pass.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from . import loops
from .loops import ONE_PASS_RATIO, _run, _vector

__all__ = ["as_positions", "forward_positions", "backward_positions", "backward_fixed",
           "fixed_forward",
           "sample_forward", "position_sums", "position_affine", "fixed_backward"]

#: numpy, from :mod:`normcore.loops` when a kernel is compiled (:func:`_kernel`)
np: Any = None


def position_sums(x, m, g, with_g, parts, span, lo, hi):
    r"""``channels_last`` memory, ``x`` of ``(N, P, C)``: for each job ``t`` of ``lo`` to ``hi``
    (sample ``t // K``, its positions ``span * (t % K)`` onward, ``K = parts.shape[2]``), the
    sums per channel of :math:`x - m` and of its square into ``parts[:, n, k]``; or, with
    ``with_g``, of :math:`g\,(x - m)` and of :math:`g` (the backward's)."""
    _, positions, channels = x.shape
    chunks = parts.shape[2]
    for t in range(lo, hi):
        n, k = t // chunks, t % chunks
        for p in range(span * k, min(span * (k + 1), positions)):
            for c in range(channels):
                d = float(x[n, p, c]) - m[n, c]
                if with_g:
                    gv = float(g[n, p, c])
                    parts[0, n, k, c] += gv * d
                    parts[1, n, k, c] += gv
                else:
                    parts[0, n, k, c] += d
                    parts[1, n, k, c] += d * d


def sample_forward(x, w, b, eps, per_group, ratio, y, stats, lo, hi):
    """``channels_last`` memory, ``x`` of ``(N, P, C)``: samples ``lo`` to ``hi`` normalized
    into ``y``, each while it is in cache (GroupNorm, InstanceNorm); sets of ``per_group``
    consecutive channels; per set the mean, variance and r into ``stats``.  The sums per
    channel about its first position's value, again about the channel's mean where that
    cancelled past ``ratio`` (:data:`ONE_PASS_RATIO`), then each set's from its channels'."""
    _, positions, channels = x.shape
    groups = channels // per_group
    for n in range(lo, hi):
        m = np.empty(channels)          # per channel: the shift, the two sums, the factors
        s1 = np.empty(channels)
        s2 = np.empty(channels)
        scale = np.empty(channels)
        center = np.empty(channels)
        for c in range(channels):
            m[c] = x[n, 0, c]
        for attempt in range(2):
            s1[:] = 0.0
            s2[:] = 0.0
            for p in range(positions):
                for c in range(channels):
                    d = float(x[n, p, c]) - m[c]
                    s1[c] += d
                    s2[c] += d * d
            again = False
            for c in range(channels):
                if s2[c] > ratio * (s2[c] - s1[c] * s1[c] / positions):
                    again = True
            if not again or attempt == 1:
                break
            for c in range(channels):
                m[c] += s1[c] / positions                          # about the mean, again
        for gi in range(groups):
            mu = 0.0
            for c in range(gi * per_group, (gi + 1) * per_group):
                mu += m[c] + s1[c] / positions
            mu /= per_group                                                     # (1)
            q = 0.0
            for c in range(gi * per_group, (gi + 1) * per_group):
                e = m[c] + s1[c] / positions - mu
                q += s2[c] - s1[c] * s1[c] / positions + positions * e * e
            var = q / (positions * per_group)                                   # (2)
            r = 1.0 / math.sqrt(var + eps)                                      # (3)
            for c in range(gi * per_group, (gi + 1) * per_group):
                scale[c] = r * w[c]
                center[c] = mu
            stats[0, n * groups + gi] = mu
            stats[1, n * groups + gi] = var
            stats[2, n * groups + gi] = r
        for p in range(positions):
            for c in range(channels):
                y[n, p, c] = (float(x[n, p, c]) - center[c]) * scale[c] + b[c]  # (4)-(5)


def position_affine(x, m, s, t, g, q, with_g, out, span, chunks, lo, hi):
    """``out = (x - m) s + t`` (and ``+ g q`` with ``with_g``), with ``m``, ``s``, ``t``, ``q``
    one value per sample and channel, ``(N, C)``, over the jobs of :func:`position_sums`."""
    _, positions, channels = x.shape
    for job in range(lo, hi):
        n, k = job // chunks, job % chunks
        for p in range(span * k, min(span * (k + 1), positions)):
            for c in range(channels):
                v = (float(x[n, p, c]) - m[n, c]) * s[n, c] + t[n, c]
                if with_g:
                    v += float(g[n, p, c]) * q[n, c]
                out[n, p, c] = v


def fixed_backward(x, g, m, q, dx, parts, span, lo, hi):
    r"""BatchNorm and InstanceNorm with fixed statistics (eval mode) on ``channels_last``
    memory, ``x`` and ``g`` of ``(1, P, C)``: over the jobs of :func:`position_sums`,
    :math:`\partial L/\partial x = g\,q` (``q`` = gamma r) into ``dx``, and the sums per
    channel of :math:`g\,(x - m)` and of :math:`g` into ``parts``: one pass over x and g."""
    _, positions, channels = x.shape
    for k in range(lo, hi):
        for p in range(span * k, min(span * (k + 1), positions)):
            for c in range(channels):
                gv = float(g[0, p, c])
                parts[0, k, c] += gv * (float(x[0, p, c]) - m[c])
                parts[1, k, c] += gv
                dx[0, p, c] = gv * q[c]


def _kernel(func):
    """:func:`normcore.loops.compiled`, with this module's ``np`` set first (numba reads a
    kernel's globals when it compiles it; numpy is imported only with numba)."""
    global np
    if np is None:
        try:
            import numpy
        except ImportError as err:      # normcore.dispatch sends nothing here without it
            raise ImportError("normcore's compiled kernels need numpy: install the extra "
                              "normcore[fast], or switch them off: normcore.use_kernels(False)"
                              ) from err
        np = numpy
    return loops.compiled(func)


def _spans(x3: torch.Tensor) -> tuple[int, int]:
    """``(positions per job, jobs per sample)`` of a ``(N, P, C)`` view: about
    :data:`loops.CHUNK_ELEMENTS` per job, at least one position."""
    _, positions, channels = x3.shape
    span = max(1, loops.CHUNK_ELEMENTS // max(channels, 1))
    return span, -(-positions // span)


def _position_moments(x3, m, span: int, chunks: int, g3=None):
    r"""Per sample and channel, float64 ``(2, N, C)``: the sums of :math:`x - m` and of its
    square; with ``g3``, of :math:`g\,(x - m)` and of :math:`g` (:func:`position_sums`)."""
    N, _, C = x3.shape
    parts = torch.zeros(2, N, chunks, C, dtype=torch.float64)
    xa = x3.detach().numpy()
    ga = xa if g3 is None else g3.detach().numpy()
    _run(_kernel(position_sums), N * chunks, xa, m.numpy(), ga, g3 is not None, parts.numpy(),
         span)
    return parts.sum(2)


def forward_positions(x3: torch.Tensor, eps: float, weight, bias, per_group: int,
                      y3: torch.Tensor, per_sample: bool = True):
    r"""GroupNorm, InstanceNorm and BatchNorm on ``channels_last`` memory: ``y3`` from ``x3``
    (``(N, P, C)``, contiguous: samples, positions, channels; BatchNorm is one sample of every
    position), with sets of ``per_group`` consecutive channels of a sample; returns the
    float64 ``(3, N G)`` statistics.  Two passes over x: the sums per channel about the first
    position's value (so that a large mean cancels in float64, not in the sum), from which
    each channel's mean and squared deviations, combined exactly into each set's (a channel
    taken again about its mean where the first pass cancelled too much,
    :data:`ONE_PASS_RATIO`); then the output."""
    N, P, C = x3.shape
    G = C // per_group
    if per_sample:            # GN, IN: sample by sample, each whole on one thread
        stats = torch.empty(3, N * G, dtype=torch.float64)
        _run(_kernel(sample_forward), N, x3.detach().numpy(), _vector(weight, C, 1.0),
             _vector(bias, C, 0.0), float(eps), per_group, ONE_PASS_RATIO, y3.numpy(),
             stats.numpy())
        return stats
    span, chunks = _spans(x3)
    m = x3[:, 0, :].double()
    s1, s2 = _position_moments(x3, m, span, chunks)
    dev = s2 - s1 * s1 / P                                       # per channel, about its mean
    if not bool(((s2 <= ONE_PASS_RATIO * dev) | (s2 == 0)).all()):
        m = m + s1 / P                                           # again, about the mean
        s1, s2 = _position_moments(x3, m, span, chunks)
        dev = s2 - s1 * s1 / P
    means = (m + s1 / P).view(N, G, per_group)
    mu = means.mean(2)                                                          # (1)
    spread = ((means - mu[:, :, None]) ** 2).sum(2) * P
    var = (dev.view(N, G, per_group).sum(2) + spread) / (P * per_group)         # (2)
    r = 1.0 / torch.sqrt(var + eps)                                             # (3)
    w = torch.from_numpy(_vector(weight, C, 1.0))
    scale = (r[:, :, None] * w.view(G, per_group)).reshape(N, C)
    shift = torch.from_numpy(_vector(bias, C, 0.0)).expand(N, C).contiguous()
    xa = x3.detach().numpy()
    _run(_kernel(position_affine), N * chunks, xa, _expand(mu, per_group).numpy(),
         scale.numpy(), shift.numpy(), xa, scale.numpy(), False, y3.numpy(), span,
         chunks)                                                                # (4)-(5)
    return torch.stack([mu.reshape(-1), var.reshape(-1), r.reshape(-1)])


def _expand(t: torch.Tensor, per_group: int) -> torch.Tensor:
    """A value per sample and set ``(N, G)`` as one per sample and channel ``(N, C)``."""
    return t.repeat_interleave(per_group, dim=1).contiguous()


def backward_positions(g3: torch.Tensor, x3: torch.Tensor, weight, per_group: int,
                       mu: torch.Tensor, r: torch.Tensor, dx3: torch.Tensor):
    r"""``dx3`` from ``g3`` and ``x3`` (as :func:`forward_positions`), the float64 per-set
    ``mu`` and ``r``; returns the float64 ``(2, C)`` sums of :math:`g\hat x` and :math:`g`.
    Two passes: per sample and channel :math:`\sum g\,(x - \mu)` and :math:`\sum g`; then
    :math:`\partial L/\partial x = g\,\gamma r - (x - \mu)\,r^2 \sum_S d\hat x / n - r
    \sum_S d / n`, with :math:`d = g\gamma` and the sums over each set from the first
    pass's."""
    N, P, C = x3.shape
    G = C // per_group
    span, chunks = _spans(x3)
    mu_c = _expand(mu.reshape(N, G), per_group)
    r_c = _expand(r.reshape(N, G), per_group)
    sgc, sg = _position_moments(x3, mu_c, span, chunks, g3)
    sgx = sgc * r_c                                                   # sum_P g x_hat
    w = torch.from_numpy(_vector(weight, C, 1.0))
    n = P * per_group
    sd = _expand((sg * w).view(N, G, per_group).sum(2), per_group)          # sum_S d
    sdx = _expand((sgx * w).view(N, G, per_group).sum(2), per_group)       # sum_S d x_hat
    slope = (-r_c * r_c * sdx / n).contiguous()
    shift = (-r_c * sd / n).contiguous()
    q = (r_c * w).contiguous()
    _run(_kernel(position_affine), N * chunks, x3.detach().numpy(), mu_c.numpy(), slope.numpy(),
         shift.numpy(), g3.detach().numpy(), q.numpy(), True, dx3.numpy(), span, chunks)
    return torch.stack([sgx.sum(0), sg.sum(0)])


def as_positions(t: torch.Tensor, samples: int) -> torch.Tensor:
    """``t`` on ``channels_last`` memory as its ``(samples, P, C)`` view: samples, positions,
    channels (BatchNorm: one sample of every position), with no copy, so that a kernel can
    write into it."""
    view = t.movedim(1, -1).reshape(samples, -1, t.shape[1])
    if view.data_ptr() != t.data_ptr() or not view.is_contiguous():
        raise RuntimeError(f"normcore.positions: a tensor of strides {tuple(t.stride())} is not "
                           f"channels_last memory; the compiled kernels write into its own")
    return view


def backward_fixed(g3: torch.Tensor, x3: torch.Tensor, mean: torch.Tensor, q: torch.Tensor,
                   dx3: torch.Tensor):
    r"""``dx3 = g3 q`` and the float64 ``(2, C)`` sums per channel of :math:`g\,(x - \mu)`
    and :math:`g`, for ``x3``, ``g3`` of ``(1, P, C)`` (``channels_last`` memory as one
    sample of every position), ``mean`` and ``q`` float64 ``(C,)``."""
    span, chunks = _spans(x3)
    parts = torch.zeros(2, chunks, x3.shape[2], dtype=torch.float64)
    _run(_kernel(fixed_backward), chunks, x3.detach().numpy(), g3.detach().numpy(),
         mean.contiguous().numpy(), q.contiguous().numpy(), dx3.numpy(), parts.numpy(), span)
    return parts.sum(1)


def fixed_forward(x3: torch.Tensor, mean: torch.Tensor, s: torch.Tensor, t: torch.Tensor,
                  y3: torch.Tensor) -> None:
    """BN and IN with fixed statistics (eval mode) on ``channels_last`` memory, ``x3`` and
    ``y3`` of ``(1, P, C)``: ``y3 = (x3 - mean) s + t`` (float64 ``(C,)`` factors), by chunks
    of positions (:func:`position_affine`), each output rounded once."""
    span, chunks = _spans(x3)
    C = x3.shape[2]
    xa = x3.detach().numpy()
    m, sa, ta = (v.reshape(1, C).contiguous().numpy() for v in (mean, s, t))
    _run(_kernel(position_affine), chunks, xa, m, sa, ta, xa, sa, False, y3.numpy(), span,
         chunks)
