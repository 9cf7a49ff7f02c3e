r"""LayerNorm and RMSNorm over the rows of a ``(sets, |S|)`` view, and GroupNorm and
InstanceNorm over the sets of a contiguous input, one row (set) at a time: the formula as
three loops over it; GroupNorm, InstanceNorm and BatchNorm on ``channels_last`` memory by
samples or chunks of positions (:func:`forward_positions`).  Compiled by numba when it is
installed (the extra ``normcore[fast]``; without it :mod:`normcore.rows` and
:mod:`normcore.groups` run their blocks of torch ops).

Why: in eager PyTorch every step of the formula is one pass of a torch op over its tensors,
and the blocks of :mod:`normcore.rows` make five passes where torch's fused kernel makes one
(LayerNorm over the last dim stayed at 2.3-2.6x torch's time, however the passes were cut).
Here each row (2 KB for 512 float32 values; a GroupNorm set of 2 channels of 32 x 32, 8 KB)
is read from memory once and then stays in the cache for the loops after the first, as in
torch's kernels, and each value of the output is written once.  The sums are in float64, and
each output is formed in float64 and rounded once: more accurate than torch's float32
kernels (LayerNorm's y about a third of torch's error), not less.

The kernels are plain Python (:func:`forward_rows`, :func:`backward_rows`; for GN and IN,
whose gamma is one value per channel, :func:`forward_sets`, :func:`backward_sets`): read
them as the formula, one row at a time, or run them uncompiled on a small input.  Compiled,
they release the GIL, and :func:`forward` and :func:`backward` (:func:`forward_groups`,
:func:`backward_groups`) split the rows among torch's threads.  The rows are taken in fixed
chunks of about :data:`CHUNK_ELEMENTS`, whose column sums (dgamma, dbeta) are added in a
fixed order: the results do not depend on the number of threads.

Forward, for each row :math:`x` of :math:`n` values (:math:`\mu = 0` for RMSNorm):

.. math::

    \mu = \tfrac1n \textstyle\sum_j x_j, \qquad
    \sigma^2 = \tfrac1n \textstyle\sum_j (x_j - \mu)^2, \qquad
    r = 1/\sqrt{\sigma^2 + \epsilon}, \qquad y_j = (x_j - \mu)\,r\,\gamma_j + \beta_j.

Backward, with :math:`\hat x_j = (x_j - \mu)\,r` and :math:`d_j = g_j \gamma_j`, the boxed
formula of :mod:`normcore.grad`:
:math:`\partial L/\partial x_j = r\,\big(d_j - \tfrac1n\sum_k d_k - \hat x_j\,\tfrac1n
\sum_k d_k \hat x_k\big)`, and over the rows :math:`\partial L/\partial \gamma_j = \sum g_j
\hat x_j`, :math:`\partial L/\partial \beta_j = \sum g_j`.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["CHUNK_ELEMENTS", "available", "forward", "backward", "forward_groups",
           "backward_groups", "forward_positions", "backward_positions", "forward_rows",
           "backward_rows", "forward_sets", "backward_sets", "position_sums", "position_affine",
           "backward_fixed", "fixed_backward", "positions"]

#: rows per chunk: about this many elements (256 KB of float32, the L2 cache of a core)
CHUNK_ELEMENTS = 1 << 16
#: at most this much memory for the backward's column sums per chunk (a long row, as in a
#: LayerNorm over (C, H, W), makes bigger chunks: 32 rows of 65536 values, 4 chunks)
PARTS_BYTES = 1 << 22
#: a channel is taken in two passes (about the first position's value, then the mean) when
#: the first pass's sum of squares is more than this times the sum of squared deviations:
#: the one pass then loses more than 4 of float64's 16 digits to cancellation
ONE_PASS_RATIO = 1e4
#: the dtypes the compiled kernels read (a half-precision x takes :mod:`normcore.rows`' blocks)
DTYPES = (torch.float32, torch.float64)


def forward_rows(x, w, b, eps, centered, y, stats, chunk, lo, hi):
    """Rows ``chunk * lo`` to ``chunk * hi`` of ``x`` normalized into ``y``; per row
    ``stats[0]`` the mean, ``stats[1]`` the variance, ``stats[2]`` r, in float64."""
    rows, n = x.shape
    for i in range(chunk * lo, min(chunk * hi, rows)):
        mu = 0.0
        if centered:
            s = 0.0
            for j in range(n):
                s += float(x[i, j])
            mu = s / n                                                          # (1)
        q = 0.0
        for j in range(n):
            c = float(x[i, j]) - mu
            q += c * c
        var = q / n                                                             # (2)
        r = 1.0 / math.sqrt(var + eps)                                          # (3)
        for j in range(n):
            y[i, j] = (float(x[i, j]) - mu) * r * w[j] + b[j]                   # (4)-(5)
        stats[0, i], stats[1, i], stats[2, i] = mu, var, r


def backward_rows(x, g, w, mu, r, centered, dx, parts, chunk, lo, hi):
    r"""dL/dx of rows ``chunk * lo`` to ``chunk * hi`` into ``dx``, and each chunk ``k``'s
    sums of :math:`g\hat x` and of :math:`g` into ``parts[0, k]`` and ``parts[1, k]``; the
    mean ``mu`` and ``r`` per row in float64 (the forward's)."""
    rows, n = x.shape
    for k in range(lo, hi):
        for i in range(chunk * k, min(chunk * (k + 1), rows)):
            m, ri = mu[i], r[i]
            sd = 0.0
            sdx = 0.0
            for j in range(n):
                xh = (float(x[i, j]) - m) * ri                                  # x_hat
                gj = float(g[i, j])
                d = gj * w[j]
                sd += d
                sdx += d * xh
                parts[0, k, j] += gj * xh                                       # dL/dgamma
                parts[1, k, j] += gj                                            # dL/dbeta
            a = sdx / n
            c = sd / n if centered else 0.0
            for j in range(n):
                xh = (float(x[i, j]) - m) * ri
                dx[i, j] = ri * (float(g[i, j]) * w[j] - c - xh * a)


def forward_sets(x, w, b, eps, y, stats, chunk, lo, hi):
    """GroupNorm and InstanceNorm on contiguous memory: sets ``chunk * lo`` to ``chunk * hi``
    of ``x`` (``(N G, C/G, P)``: a set's channels, each of ``P`` positions) normalized into
    ``y``, with gamma and beta ``(G, C/G)``; per set the mean, variance and r into ``stats``."""
    sets, cg, p = x.shape
    groups = w.shape[0]
    for s in range(chunk * lo, min(chunk * hi, sets)):
        t = 0.0
        for c in range(cg):
            for j in range(p):
                t += float(x[s, c, j])
        mu = t / (cg * p)                                                       # (1)
        q = 0.0
        for c in range(cg):
            for j in range(p):
                d = float(x[s, c, j]) - mu
                q += d * d
        var = q / (cg * p)                                                      # (2)
        r = 1.0 / math.sqrt(var + eps)                                          # (3)
        for c in range(cg):
            a = r * w[s % groups, c]
            for j in range(p):
                y[s, c, j] = (float(x[s, c, j]) - mu) * a + b[s % groups, c]    # (4)-(5)
        stats[0, s], stats[1, s], stats[2, s] = mu, var, r


def backward_sets(x, g, w, mu, r, dx, parts, chunk, lo, hi):
    r"""dL/dx of the sets ``chunk * lo`` to ``chunk * hi`` (as :func:`forward_sets`), and each
    chunk ``k``'s sums of :math:`g\hat x` and :math:`g` per channel into ``parts[:, k]``
    (``(2, chunks, G, C/G)``): gamma is constant over a channel's positions, so each sum over
    the set is a sum over its channels of per-channel sums."""
    sets, cg, p = x.shape
    groups = w.shape[0]
    for k in range(lo, hi):
        for s in range(chunk * k, min(chunk * (k + 1), sets)):
            m, ri, gi = mu[s], r[s], s % groups
            sd = 0.0
            sdx = 0.0
            for c in range(cg):
                sg = 0.0
                sgx = 0.0
                for j in range(p):
                    gj = float(g[s, c, j])
                    sg += gj
                    sgx += gj * ((float(x[s, c, j]) - m) * ri)
                parts[0, k, gi, c] += sgx                                       # dL/dgamma
                parts[1, k, gi, c] += sg                                        # dL/dbeta
                sd += w[gi, c] * sg
                sdx += w[gi, c] * sgx
            a = sdx / (cg * p)
            cc = sd / (cg * p)
            for c in range(cg):
                q = w[gi, c]
                for j in range(p):
                    xh = (float(x[s, c, j]) - m) * ri
                    dx[s, c, j] = ri * (float(g[s, c, j]) * q - cc - xh * a)


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


def sample_forward(x, w, b, eps, per_group, y, stats, lo, hi):
    """``channels_last`` memory, ``x`` of ``(N, P, C)``: samples ``lo`` to ``hi`` normalized
    into ``y``, each while it is in cache (GroupNorm, InstanceNorm); sets of ``per_group``
    consecutive channels; per set the mean, variance and r into ``stats``.  The sums per
    channel about its first position's value, again about the channel's mean where that
    cancelled too much (:data:`ONE_PASS_RATIO`), then each set's from its channels'."""
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
                if s2[c] > ONE_PASS_RATIO * (s2[c] - s1[c] * s1[c] / positions):
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


_compiled: dict = {}
_pool: list = []
#: numpy, for the kernels' small per-channel arrays: imported with numba (:func:`available`)
np: Any = None
# a forked child (a DataLoader worker) has none of the pool's threads: it makes its own
os.register_at_fork(after_in_child=_pool.clear)


def available() -> bool:
    """Whether the compiled kernels can run: numba is installed, and ``NORMCORE_NUMBA`` is not
    ``0`` (which keeps :mod:`normcore.rows`' torch blocks, e.g. to compare the two)."""
    if os.environ.get("NORMCORE_NUMBA", "1") == "0":
        return False
    global np
    if "numba" not in _compiled:
        try:
            import numba
            import numpy
        except ImportError:
            numba = None
        else:
            np = numpy
        _compiled["numba"] = numba
    return _compiled["numba"] is not None


def _kernel(func):
    """``func`` compiled: without the GIL, cached on disk, and with the sums reassociated so
    that they vectorize (float64 sums of at most a few thousand values: the order changes
    them by far less than a float32 rounding)."""
    if func.__name__ not in _compiled:
        numba = _compiled["numba"]
        _compiled[func.__name__] = numba.njit(nogil=True, cache=True, error_model="numpy",
                                              fastmath={"reassoc", "nsz"})(func)
    return _compiled[func.__name__]


def _run(kernel, chunks: int, *args) -> None:
    """``kernel(*args, chunk_lo, chunk_hi)`` over ``chunks`` chunks, split among torch's
    threads (the kernel releases the GIL); one thread: one call."""
    threads = min(torch.get_num_threads(), chunks)
    if threads <= 1:
        kernel(*args, 0, chunks)
        return
    while len(_pool) < 1:
        _pool.append(ThreadPoolExecutor(thread_name_prefix="normcore-loops"))
    cuts = [chunks * t // threads for t in range(threads + 1)]
    jobs = [_pool[0].submit(kernel, *args, cuts[t], cuts[t + 1]) for t in range(1, threads)]
    kernel(*args, cuts[0], cuts[1])
    for job in jobs:
        job.result()


def _chunk(rows: int, n: int) -> int:
    """Rows per chunk: :data:`CHUNK_ELEMENTS` elements, or more where the chunks' column sums
    (two float64 rows each) would take more than :data:`PARTS_BYTES`."""
    chunks = max(1, min(-(-rows * n // CHUNK_ELEMENTS), PARTS_BYTES // (16 * max(n, 1))))
    return -(-rows // chunks)


def _vector(t, n: int, fill: float):
    """gamma or beta as a float64 numpy vector of ``n`` values (``fill`` when None)."""
    if t is None:
        return torch.full((n,), fill, dtype=torch.float64).numpy()
    return t.detach().reshape(n).to(torch.float64).contiguous().numpy()


def forward_groups(x3: torch.Tensor, eps: float, weight, bias, groups: int,
                   y3: torch.Tensor):
    """``y3`` from ``x3`` (``(N G, C/G, P)``, contiguous, on the CPU, in :data:`DTYPES`);
    returns the float64 ``(3, N G)`` statistics: mean, variance, r."""
    sets, cg, p = x3.shape
    stats = torch.empty(3, sets, dtype=torch.float64)
    chunk = _chunk(sets, cg * p)
    shape = (groups, cg)
    _run(_kernel(forward_sets), -(-sets // chunk), x3.detach().numpy(),
         _vector(weight, groups * cg, 1.0).reshape(shape),
         _vector(bias, groups * cg, 0.0).reshape(shape), float(eps), y3.numpy(),
         stats.numpy(), chunk)
    return stats


def backward_groups(g3: torch.Tensor, x3: torch.Tensor, weight, groups: int, mu: torch.Tensor,
                    r: torch.Tensor, dx3: torch.Tensor):
    r"""``dx3`` from ``g3`` and ``x3`` (as :func:`forward_groups`), the float64 per-set ``mu``
    and ``r``; returns the float64 ``(2, C)`` sums of :math:`g\hat x` and :math:`g` per
    channel (dL/dgamma, dL/dbeta)."""
    sets, cg, p = x3.shape
    chunk = _chunk(sets, cg * p)
    chunks = -(-sets // chunk)
    parts = torch.zeros(2, chunks, groups, cg, dtype=torch.float64)
    _run(_kernel(backward_sets), chunks, x3.detach().numpy(), g3.detach().numpy(),
         _vector(weight, groups * cg, 1.0).reshape(groups, cg), mu.reshape(sets).numpy(),
         r.reshape(sets).numpy(), dx3.numpy(), parts.numpy(), chunk)
    return parts.sum(1).reshape(2, groups * cg)


def _spans(x3: torch.Tensor) -> tuple[int, int]:
    """``(positions per job, jobs per sample)`` of a ``(N, P, C)`` view: about
    :data:`CHUNK_ELEMENTS` per job, at least one position."""
    _, positions, channels = x3.shape
    span = max(1, CHUNK_ELEMENTS // max(channels, 1))
    return span, -(-positions // span)


def _position_moments(x3, m, span: int, chunks: int):
    """Per sample and channel, float64 ``(N, C)``: the sum of :math:`x - m` and of its square."""
    N, _, C = x3.shape
    parts = torch.zeros(2, N, chunks, C, dtype=torch.float64)
    xa = x3.detach().numpy()
    _run(_kernel(position_sums), N * chunks, xa, m.numpy(), xa, False, parts.numpy(), span)
    return parts.sum(2)


def forward_positions(x3: torch.Tensor, eps: float, weight, bias, per_group: int,
                      y3: torch.Tensor):
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
    if N > 1:                 # GN, IN: sample by sample (by N alone: the same on any threads)
        stats = torch.empty(3, N * G, dtype=torch.float64)
        _run(_kernel(sample_forward), N, x3.detach().numpy(), _vector(weight, C, 1.0),
             _vector(bias, C, 0.0), float(eps), per_group, y3.numpy(), stats.numpy())
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
    parts = torch.zeros(2, N, chunks, C, dtype=torch.float64)
    xa, ga = x3.detach().numpy(), g3.detach().numpy()
    _run(_kernel(position_sums), N * chunks, xa, mu_c.numpy(), ga, True, parts.numpy(), span)
    sgc, sg = parts.sum(2)
    sgx = sgc * r_c                                                   # sum_P g x_hat
    w = torch.from_numpy(_vector(weight, C, 1.0))
    n = P * per_group
    sd = _expand((sg * w).view(N, G, per_group).sum(2), per_group)          # sum_S d
    sdx = _expand((sgx * w).view(N, G, per_group).sum(2), per_group)       # sum_S d x_hat
    slope = (-r_c * r_c * sdx / n).contiguous()
    shift = (-r_c * sd / n).contiguous()
    q = (r_c * w).contiguous()
    _run(_kernel(position_affine), N * chunks, xa, mu_c.numpy(), slope.numpy(), shift.numpy(),
         ga, q.numpy(), True, dx3.numpy(), span, chunks)
    return torch.stack([sgx.sum(0), sg.sum(0)])


def positions(t: torch.Tensor, samples: int) -> torch.Tensor:
    """``t`` on ``channels_last`` memory as its ``(samples, P, C)`` view: samples, positions,
    channels (BatchNorm: one sample of every position), with no copy, so that a kernel can
    write into it."""
    view = t.movedim(1, -1).reshape(samples, -1, t.shape[1])
    if view.data_ptr() != t.data_ptr() or not view.is_contiguous():
        raise RuntimeError(f"normcore.loops: a tensor of strides {tuple(t.stride())} is not "
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


def forward(x2: torch.Tensor, eps: float, centered: bool, weight, bias, y2: torch.Tensor):
    """``y2`` (rows, n) from ``x2`` (rows, n, contiguous, on the CPU, in :data:`DTYPES`);
    returns the float64 ``(3, rows)`` statistics: mean, variance, r."""
    rows, n = x2.shape
    stats = torch.empty(3, rows, dtype=torch.float64)
    chunk = _chunk(rows, n)
    _run(_kernel(forward_rows), -(-rows // chunk), x2.detach().numpy(), _vector(weight, n, 1.0),
         _vector(bias, n, 0.0), float(eps), centered, y2.numpy(), stats.numpy(), chunk)
    return stats


def backward(g2: torch.Tensor, x2: torch.Tensor, weight, mu: torch.Tensor, r: torch.Tensor,
             centered: bool, dx2: torch.Tensor):
    r"""``dx2`` from ``g2`` and ``x2`` (rows, n, contiguous, in the same dtype), the float64
    per-row ``mu`` and ``r``; returns the float64 ``(2, n)`` sums of :math:`g\hat x` and
    :math:`g` over the rows (dL/dgamma, dL/dbeta)."""
    rows, n = x2.shape
    chunk = _chunk(rows, n)
    chunks = -(-rows // chunk)
    parts = torch.zeros(2, chunks, n, dtype=torch.float64)
    _run(_kernel(backward_rows), chunks, x2.detach().numpy(), g2.detach().numpy(),
         _vector(weight, n, 1.0), mu.reshape(rows).numpy(), r.reshape(rows).numpy(), centered,
         dx2.numpy(), parts.numpy(), chunk)
    return parts.sum(1)
