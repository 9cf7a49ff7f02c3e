r"""The compiled kernels' loops for contiguous memory: LayerNorm and RMSNorm over the rows of a
``(sets, |S|)`` view; GroupNorm and InstanceNorm over their sets, one set (C/G channels of P
positions) at a time; BatchNorm one channel (every sample's P positions) at a time, and with
the running statistics (eval mode) as one pass.  :mod:`normcore.positions` has the loops for ``channels_last`` memory;
:mod:`normcore.kernels` calls both, when :func:`normcore.dispatch.family` says so.

In eager PyTorch every step of the formula is one pass of a torch op over its tensors.  Here a
row is read from memory once, stays in the cache for the loops after the first, and each value
of the output is written once, as in torch's fused kernels.  The sums are in float64, and
each output is formed in float64 and rounded once.

The kernels are plain Python: read them as the formula, one row at a time, or run them
uncompiled on a small input (tests/test_kernels.py does, against the compiled ones).
Compiled (:func:`compiled`), they release the GIL, and :func:`forward`, :func:`backward`,
:func:`forward_by_sets` and :func:`backward_by_sets` split the rows among torch's threads in
chunks of about :data:`CHUNK_ELEMENTS`.  Each row is computed whole by one thread, so a row's
output does not depend on the other rows, the batch size or the thread count; the chunks'
column sums (dgamma, dbeta) are added in a fixed order.

Forward, for each row :math:`x` of :math:`n` values (:math:`\mu = 0` for RMSNorm), the
sums of :math:`x - k` and :math:`(x - k)^2` in one pass, about the row's first value
:math:`k` (then :math:`\sum (x-k)^2 \le (n+1) \sum (x-\mu)^2`: the variance loses at most
:math:`\log_{10}(n+1)` of float64's 16 digits; past :data:`ONE_PASS_RATIO` the sums are
taken again about the mean), which give:

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

import torch

__all__ = ["CHUNK_ELEMENTS", "PARTS_BYTES", "ONE_PASS_RATIO", "FASTMATH", "compiled",
           "forward", "backward", "forward_by_sets", "backward_by_sets", "forward_by_channels",
           "backward_by_channels", "fixed_by_channels", "forward_rows", "backward_rows",
           "forward_sets", "backward_sets", "forward_channels", "backward_channels",
           "fixed_channels", "fixed_channels_backward"]

#: rows per chunk: about this many elements (256 KB of float32, the L2 cache of a core)
CHUNK_ELEMENTS = 1 << 16
#: at most this much memory for the backward's column sums per chunk (a long row, as in a
#: LayerNorm over (C, H, W), makes bigger chunks: 32 rows of 65536 values, 4 chunks)
PARTS_BYTES = 1 << 22
#: a row (set, channel) is summed twice (about its first value, then about its mean) when the
#: first pass's sum of squares is more than this times the sum of squared deviations: the
#: one pass then loses more than 4 of float64's 16 digits to cancellation
ONE_PASS_RATIO = 1e4
#: numba's fast-math flags for every kernel: ``reassoc`` lets the float64 sums be reordered
#: so that they vectorize (benchmarks/speed.py measures the kernels); the order changes a float64 sum of a few
#: thousand values by far less than one float32 rounding, and tests/test_kernels.py holds
#: the kernels compiled with and without it to the same float32 results
FASTMATH = frozenset({"reassoc"})


def forward_rows(x, w, b, eps, centered, ratio, y, stats, chunk, lo, hi):
    """Rows ``chunk * lo`` to ``chunk * hi`` of ``x`` normalized into ``y``; per row
    ``stats[0]`` the mean, ``stats[1]`` the variance, ``stats[2]`` r, in float64; a row is
    summed again about its mean when the first pass cancelled past ``ratio``
    (:data:`ONE_PASS_RATIO`)."""
    rows, n = x.shape
    for i in range(chunk * lo, min(chunk * hi, rows)):
        # one pass for both sums, about the row's first value k0 (0 for RMSNorm): then
        # sum (x - k0)^2 is at most n + 1 times n sigma^2, and the variance loses at most
        # log10(n + 1) of float64's 16 digits; past `ratio`, again about the mean
        k0 = float(x[i, 0]) if centered else 0.0
        for attempt in range(2):
            t = 0.0
            q = 0.0
            for j in range(n):
                d = float(x[i, j]) - k0
                t += d
                q += d * d
            if not centered or q <= ratio * (q - t * t / n) or attempt == 1:
                break
            k0 += t / n
        mu = k0 + t / n if centered else 0.0                                    # (1)
        var = max(q - t * t / n, 0.0) / n if centered else q / n                # (2)
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


def forward_sets(x, w, b, eps, ratio, y, stats, chunk, lo, hi):
    """GroupNorm and InstanceNorm on contiguous memory: sets ``chunk * lo`` to ``chunk * hi``
    of ``x`` (``(N G, C/G, P)``: a set's channels, each of ``P`` positions) normalized into
    ``y``, with gamma and beta ``(G, C/G)``; per set the mean, variance and r into ``stats``."""
    sets, cg, p = x.shape
    groups = w.shape[0]
    n = cg * p
    for s in range(chunk * lo, min(chunk * hi, sets)):
        k0 = float(x[s, 0, 0])          # the sums about the set's first value (forward_rows)
        for attempt in range(2):
            t = 0.0
            q = 0.0
            for c in range(cg):
                for j in range(p):
                    d = float(x[s, c, j]) - k0
                    t += d
                    q += d * d
            if q <= ratio * (q - t * t / n) or attempt == 1:
                break
            k0 += t / n                                       # about the mean, again
        mu = k0 + t / n                                                         # (1)
        var = max(q - t * t / n, 0.0) / n                                       # (2)
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


def forward_channels(x, w, b, eps, ratio, y, stats, lo, hi):
    """BatchNorm on contiguous memory, ``x`` of ``(N, C, P)``: channels ``lo`` to ``hi``, each
    over every sample and position (one thread a channel), normalized into ``y``; per channel
    the mean, variance and r into ``stats``, as :func:`forward_rows`."""
    N, _, P = x.shape
    n = N * P
    for c in range(lo, hi):
        k0 = float(x[0, c, 0])          # the sums about the channel's first value
        for attempt in range(2):
            t = 0.0
            q = 0.0
            for i in range(N):
                for j in range(P):
                    d = float(x[i, c, j]) - k0
                    t += d
                    q += d * d
            if q <= ratio * (q - t * t / n) or attempt == 1:
                break
            k0 += t / n                                       # about the mean, again
        mu = k0 + t / n                                                         # (1)
        var = max(q - t * t / n, 0.0) / n                                       # (2)
        r = 1.0 / math.sqrt(var + eps)                                          # (3)
        a = r * w[c]
        for i in range(N):
            for j in range(P):
                y[i, c, j] = (float(x[i, c, j]) - mu) * a + b[c]                # (4)-(5)
        stats[0, c], stats[1, c], stats[2, c] = mu, var, r


def backward_channels(x, g, w, mu, r, dx, sums, lo, hi):
    r"""dL/dx of channels ``lo`` to ``hi`` (as :func:`forward_channels`) into ``dx``, and per
    channel the sums of :math:`g\hat x` and of :math:`g` into ``sums[0, c]``, ``sums[1, c]``."""
    N, _, P = x.shape
    n = N * P
    for c in range(lo, hi):
        m, rc = mu[c], r[c]
        sg = 0.0
        sgx = 0.0
        for i in range(N):
            for j in range(P):
                gj = float(g[i, c, j])
                sg += gj
                sgx += gj * ((float(x[i, c, j]) - m) * rc)
        sums[0, c], sums[1, c] = sgx, sg                                 # dL/dgamma, dL/dbeta
        a = w[c] * sgx / n                                               # mean of d x_hat
        cc = w[c] * sg / n                                               # mean of d
        for i in range(N):
            for j in range(P):
                xh = (float(x[i, c, j]) - m) * rc
                dx[i, c, j] = rc * (float(g[i, c, j]) * w[c] - cc - xh * a)


def fixed_channels(x, m, s, t, out, lo, hi):
    """BatchNorm and InstanceNorm with fixed statistics (eval mode) on contiguous memory,
    ``x`` of ``(N, C, P)``, channels ``lo`` to ``hi``: ``out = (x - m) s + t``, in float64,
    rounded once."""
    N, _, P = x.shape
    for c in range(lo, hi):
        for i in range(N):
            for j in range(P):
                out[i, c, j] = (float(x[i, c, j]) - m[c]) * s[c] + t[c]


def fixed_channels_backward(x, g, m, s, dx, sums, lo, hi):
    r"""Its backward, one pass: ``dx = g s`` (``s`` = gamma r) and the sums per channel of
    :math:`g\,(x - m)` and of :math:`g` into ``sums``."""
    N, _, P = x.shape
    for c in range(lo, hi):
        a = 0.0
        b = 0.0
        for i in range(N):
            for j in range(P):
                gv = float(g[i, c, j])
                a += gv * (float(x[i, c, j]) - m[c])
                b += gv
                dx[i, c, j] = gv * s[c]
        sums[0, c], sums[1, c] = a, b

_compiled: dict = {}
_pool: list = []
# a forked child (a DataLoader worker) has none of the pool's threads: it makes its own
os.register_at_fork(after_in_child=_pool.clear)


def compiled(func, fastmath=FASTMATH):
    """``func`` compiled by numba: without the GIL, with :data:`FASTMATH`, and cached on disk.
    A kernel reads no module constant (each is an argument), so numba's cache, keyed by the
    kernel's own source file, cannot serve a kernel built from an older value; the kernels'
    globals are checked against that by tests/test_kernels.py."""
    key = (func.__module__, func.__name__, frozenset(fastmath))
    if key not in _compiled:
        try:
            import numba
        except ImportError as err:      # normcore.dispatch sends nothing here without numba
            raise ImportError("normcore's compiled kernels need numba: install the extra "
                              "normcore[fast], or switch them off: normcore.use_kernels(False)"
                              ) from err
        # numba's disk cache does not key on the flags: only the default flags use it
        _compiled[key] = numba.njit(nogil=True, cache=fastmath == FASTMATH,
                                    error_model="numpy", fastmath=set(fastmath))(func)
    return _compiled[key]


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


def _chunks(rows: int, n: int) -> tuple[int, int]:
    """``(rows per chunk, chunks)``: :data:`CHUNK_ELEMENTS` elements a chunk, or more where the
    chunks' column sums (two float64 rows of n each) would take more than :data:`PARTS_BYTES`."""
    chunks = max(1, min(-(-rows * n // CHUNK_ELEMENTS), PARTS_BYTES // (16 * max(n, 1))))
    chunk = -(-rows // chunks)
    return chunk, -(-rows // chunk)


def _vector(t, n: int, fill: float):
    """gamma or beta as a float64 numpy vector of ``n`` values (``fill`` when None)."""
    if t is None:
        return torch.full((n,), fill, dtype=torch.float64).numpy()
    return t.detach().reshape(n).to(torch.float64).contiguous().numpy()


def forward_by_sets(x3: torch.Tensor, eps: float, weight, bias, groups: int,
                    y3: torch.Tensor):
    """``y3`` from ``x3`` (``(N G, C/G, P)``, contiguous, on the CPU, in :data:`DTYPES`);
    returns the float64 ``(3, N G)`` statistics: mean, variance, r."""
    sets, cg, p = x3.shape
    stats = torch.empty(3, sets, dtype=torch.float64)
    chunk, chunks = _chunks(sets, cg * p)
    shape = (groups, cg)
    _run(compiled(forward_sets), chunks, x3.detach().numpy(),
         _vector(weight, groups * cg, 1.0).reshape(shape),
         _vector(bias, groups * cg, 0.0).reshape(shape), float(eps), ONE_PASS_RATIO, y3.numpy(),
         stats.numpy(), chunk)
    return stats


def backward_by_sets(g3: torch.Tensor, x3: torch.Tensor, weight, groups: int, mu: torch.Tensor,
                     r: torch.Tensor, dx3: torch.Tensor):
    r"""``dx3`` from ``g3`` and ``x3`` (as :func:`forward_by_sets`), the float64 per-set ``mu``
    and ``r``; returns the float64 ``(2, C)`` sums of :math:`g\hat x` and :math:`g` per
    channel (dL/dgamma, dL/dbeta)."""
    sets, cg, p = x3.shape
    chunk, chunks = _chunks(sets, cg * p)
    parts = torch.zeros(2, chunks, groups, cg, dtype=torch.float64)
    _run(compiled(backward_sets), chunks, x3.detach().numpy(), g3.detach().numpy(),
         _vector(weight, groups * cg, 1.0).reshape(groups, cg), mu.reshape(sets).numpy(),
         r.reshape(sets).numpy(), dx3.numpy(), parts.numpy(), chunk)
    return parts.sum(1).reshape(2, groups * cg)


def forward(x2: torch.Tensor, eps: float, centered: bool, weight, bias, y2: torch.Tensor):
    """``y2`` (rows, n) from ``x2`` (rows, n, contiguous, on the CPU, in :data:`DTYPES`);
    returns the float64 ``(3, rows)`` statistics: mean, variance, r."""
    rows, n = x2.shape
    stats = torch.empty(3, rows, dtype=torch.float64)
    chunk, chunks = _chunks(rows, n)
    _run(compiled(forward_rows), chunks, x2.detach().numpy(), _vector(weight, n, 1.0),
         _vector(bias, n, 0.0), float(eps), centered, ONE_PASS_RATIO, y2.numpy(), stats.numpy(),
         chunk)
    return stats


def backward(g2: torch.Tensor, x2: torch.Tensor, weight, mu: torch.Tensor, r: torch.Tensor,
             centered: bool, dx2: torch.Tensor):
    r"""``dx2`` from ``g2`` and ``x2`` (rows, n, contiguous, in the same dtype), the float64
    per-row ``mu`` and ``r``; returns the float64 ``(2, n)`` sums of :math:`g\hat x` and
    :math:`g` over the rows (dL/dgamma, dL/dbeta)."""
    rows, n = x2.shape
    chunk, chunks = _chunks(rows, n)
    parts = torch.zeros(2, chunks, n, dtype=torch.float64)
    _run(compiled(backward_rows), chunks, x2.detach().numpy(), g2.detach().numpy(),
         _vector(weight, n, 1.0), mu.reshape(rows).numpy(), r.reshape(rows).numpy(), centered,
         dx2.numpy(), parts.numpy(), chunk)
    return parts.sum(1)


def forward_by_channels(x3: torch.Tensor, eps: float, weight, bias, y3: torch.Tensor):
    """BatchNorm: ``y3`` from ``x3`` (``(N, C, P)``, contiguous); returns the float64
    ``(3, C)`` statistics: mean, variance, r."""
    C = x3.shape[1]
    stats = torch.empty(3, C, dtype=torch.float64)
    _run(compiled(forward_channels), C, x3.detach().numpy(), _vector(weight, C, 1.0),
         _vector(bias, C, 0.0), float(eps), ONE_PASS_RATIO, y3.numpy(), stats.numpy())
    return stats


def backward_by_channels(g3: torch.Tensor, x3: torch.Tensor, weight, mu: torch.Tensor,
                         r: torch.Tensor, dx3: torch.Tensor):
    r"""``dx3`` from ``g3`` and ``x3`` (as :func:`forward_by_channels`); returns the float64
    ``(2, C)`` sums of :math:`g\hat x` and :math:`g` per channel."""
    C = x3.shape[1]
    sums = torch.empty(2, C, dtype=torch.float64)
    _run(compiled(backward_channels), C, x3.detach().numpy(), g3.detach().numpy(),
         _vector(weight, C, 1.0), mu.reshape(C).numpy(), r.reshape(C).numpy(), dx3.numpy(),
         sums.numpy())
    return sums


def fixed_by_channels(x3: torch.Tensor, mean: torch.Tensor, s: torch.Tensor, t: torch.Tensor,
                      out3: torch.Tensor, g3: torch.Tensor | None = None):
    """:func:`fixed_channels` on ``(N, C, P)`` views: the eval-mode forward into ``out3``, or
    with ``g3`` the backward (:func:`fixed_channels_backward`, dx into ``out3``), whose float64
    ``(2, C)`` sums it returns; ``mean``, ``s``, ``t`` float64 ``(C,)``."""
    C = x3.shape[1]
    xa, m, sa = x3.detach().numpy(), mean.contiguous().numpy(), s.contiguous().numpy()
    if g3 is None:
        _run(compiled(fixed_channels), C, xa, m, sa, t.contiguous().numpy(), out3.numpy())
        return None
    sums = torch.empty(2, C, dtype=torch.float64)
    _run(compiled(fixed_channels_backward), C, xa, g3.detach().numpy(), m, sa, out3.numpy(),
         sums.numpy())
    return sums
