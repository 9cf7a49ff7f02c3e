r"""LayerNorm and RMSNorm over the rows of a ``(sets, |S|)`` view, one row at a time: the
formula as three loops over a row, compiled by numba when it is installed (the extra
``normcore[fast]``; without it :mod:`normcore.rows` runs its blocks of torch ops instead).

Why: in eager PyTorch every step of the formula is one pass of a torch op over its tensors,
and the blocks of :mod:`normcore.rows` make five passes where torch's fused kernel makes one
(LayerNorm over the last dim stayed at 2.3-2.6x torch's time, however the passes were cut).
Here each row (2 KB for 512 float32 values) is read from memory once and then stays in the
first-level cache for the loops after the first, as in torch's kernel, and each value of the
output is written once.  The sums are in float64, and each output is formed in float64 and
rounded once: more accurate than torch's float32 kernel (y's error about a third of
torch's), not less.

The kernels are plain Python (:func:`forward_rows`, :func:`backward_rows`): read them as the
formula, one row at a time, or run them uncompiled on a small input.  Compiled, they release
the GIL, and :func:`forward` and :func:`backward` split the rows among torch's threads.  The
rows are taken in fixed chunks of :data:`CHUNK_ELEMENTS`, whose column sums (dgamma, dbeta)
are added in a fixed order: the results do not depend on the number of threads.

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

import torch

__all__ = ["CHUNK_ELEMENTS", "available", "forward", "backward", "forward_rows",
           "backward_rows"]

#: rows per chunk: about this many elements (256 KB of float32, the L2 cache of a core)
CHUNK_ELEMENTS = 1 << 16
#: at most this much memory for the backward's column sums per chunk (a long row, as in a
#: LayerNorm over (C, H, W), makes bigger chunks: 32 rows of 65536 values, 4 chunks)
PARTS_BYTES = 1 << 22
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
    """dL/dx of rows ``chunk * lo`` to ``chunk * hi`` into ``dx``, and each chunk ``k``'s
    sums of :math:`g\\hat x` and of :math:`g` into ``parts[0, k]`` and ``parts[1, k]``; the
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


_compiled: dict = {}
_pool: list = []
# a forked child (a DataLoader worker) has none of the pool's threads: it makes its own
os.register_at_fork(after_in_child=_pool.clear)


def available() -> bool:
    """Whether the compiled kernels can run: numba is installed, and ``NORMCORE_NUMBA`` is not
    ``0`` (which keeps :mod:`normcore.rows`' torch blocks, e.g. to compare the two)."""
    if os.environ.get("NORMCORE_NUMBA", "1") == "0":
        return False
    if "numba" not in _compiled:
        try:
            import numba
        except ImportError:
            numba = None
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
    """``dx2`` from ``g2`` and ``x2`` (rows, n, contiguous, in the same dtype), the float64
    per-row ``mu`` and ``r``; returns the float64 ``(2, n)`` sums of :math:`g\\hat x` and
    :math:`g` over the rows (dL/dgamma, dL/dbeta)."""
    rows, n = x2.shape
    chunk = _chunk(rows, n)
    chunks = -(-rows // chunk)
    parts = torch.zeros(2, chunks, n, dtype=torch.float64)
    _run(_kernel(backward_rows), chunks, x2.detach().numpy(), g2.detach().numpy(),
         _vector(weight, n, 1.0), mu.reshape(rows).numpy(), r.reshape(rows).numpy(), centered,
         dx2.numpy(), parts.numpy(), chunk)
    return parts.sum(1)
