r"""The full-size passes the fast paths are made of: the sums the formula needs (of each row,
of each column, of squares, of products, by chunks and in float64 where that buys accuracy),
and :math:`y = x\,s + t` with one ``s`` and one ``t`` per row (:func:`row_affine`).

Each is one or two of torch's kernels over a large tensor, with the reasons for the chunk
sizes and dtypes measured and given in its docstring; :mod:`normcore.core` computes the
formula with them, :mod:`normcore.rows`, :mod:`normcore.groups` and :mod:`normcore.frozen`
their fast paths.
"""
from __future__ import annotations

import math

import torch

__all__ = ["sum_keep", "sum_of_products", "sum_of_squares", "row_sums", "column_sums",
           "row_affine"]


def _known(cond) -> bool:
    """``cond``, or under torch.export's symbolic sizes whether it is known true (no guard)."""
    if isinstance(cond, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true
        return statically_known_true(cond)
    return bool(cond)


def sum_keep(t: torch.Tensor, dims: tuple[int, ...], double: bool = False) -> torch.Tensor:
    """``t.sum(dims, keepdim=True)``, and ``t`` itself when there is nothing to sum;
    ``double``: a float32 ``t``'s sums in float64, not rounded back to float32.

    Over the trailing dims of a large contiguous tensor (LN, IN, GN, WS) the sum is taken
    over the rows of the ``(sets, |S|)`` view: one long row per set is 1.5-2x faster on CPU
    than the same reduction over several dims of a view (measured at (32, 32, 2, 32, 32),
    GroupNorm's view; on small tensors the few extra Python steps cost more than they save).
    """
    if not dims:
        return t.double() if double else t
    nd, k = t.dim(), len(dims)
    if t.dtype == torch.float32:
        # float32 sums as torch's BatchNorm takes them: each row of trailing dims in float32,
        # the rest (BN's batch dim, or a small tensor) in float64
        back = torch.float64 if double else t.dtype
        trailing = _trailing(dims, nd)
        rest = tuple(d for d in sorted(dims) if d not in trailing)
        if rest and trailing:
            return sum_keep(t, trailing).sum(rest, keepdim=True, dtype=torch.float64).to(back)
        if _known(t.numel() <= 1 << 16):
            return t.sum(dims, keepdim=True, dtype=torch.float64).to(back)
    if (_known(t.numel() >= 1 << 15) and tuple(dims) == tuple(range(nd - k, nd))
            and t.is_contiguous()):
        lead = t.shape[:nd - k]                 # the sets as rows of a (sets, |S|) view
        sums = t.reshape(math.prod(lead), -1).sum(1).reshape(lead + (1,) * k)
    else:
        sums = t.sum(dims, keepdim=True)
    return sums.double() if double else sums


def sum_of_products(a: torch.Tensor, b: torch.Tensor, dims: tuple[int, ...],
                    out: torch.Tensor | None = None, double: bool = False) -> torch.Tensor:
    """``(a * b).sum(dims, keepdim=True)``; the product, where it is formed, goes into ``out``
    (a spare tensor of ``a``'s shape) when given.  ``double`` (with ``out`` only): float32
    sums returned in float64 (:func:`sum_keep`).

    When ``dims`` are the trailing dims (LN, IN, GN, WS) each set is one row of a
    ``(sets, |S|)`` matrix, and the sum is a row reduction: ``torch.linalg.vecdot`` of the
    rows, or for ``a is b`` (a sum of squares) squared 2-norms (:func:`sum_of_squares`),
    fused reductions that never write the product (measured 13x faster than a batch of
    ``bmm`` dot products and 2x faster than ``(a * a).sum``, at (2048, 512) on one thread).
    ``vecdot`` writes the product to a
    temporary on CPU, so with ``out`` the product goes there instead (a fresh full-size
    temporary costs page faults).  BN's dims ``(0, 2, 3, ...)`` are not contiguous (a row
    view would need a permuted copy), so there the product is formed and summed.
    """
    nd, k = a.dim(), len(dims)
    if out is not None:
        return sum_keep(torch.mul(a, b, out=out), dims, double)
    if k == 0:
        return torch.mul(a, b)
    if tuple(dims) == tuple(range(nd - k, nd)) and a.shape == b.shape:
        lead, n = a.shape[:nd - k], math.prod(a.shape[nd - k:])
        rows = a.reshape(-1, n)
        if a is b:
            sums = sum_of_squares(rows)
        else:
            sums = torch.linalg.vecdot(rows, b.reshape(-1, n), dim=-1)
        return sums.reshape(lead + (1,) * k)
    trail = _trailing(dims, nd)
    if a is b and a.dtype == torch.float32 and trail and a.is_contiguous() \
            and _known(a.numel() >= 1 << 15):
        # BN: the squares of each row of trailing dims by chunks, the rest summed in float64
        # (the float32 sum over (0, 2, 3) was off by 3.4 roundings, the output by as much)
        lead = a.shape[:nd - len(trail)]
        sums = sum_of_squares(a.reshape(-1, math.prod(a.shape[nd - len(trail):])))
        rest = tuple(d for d in dims if d not in trail)
        return sums.reshape(lead + (1,) * len(trail)).sum(
            rest, keepdim=True, dtype=torch.float64).to(a.dtype)
    return (a * b).sum(dims, keepdim=True)


def _trailing(dims: tuple[int, ...], nd: int) -> tuple[int, ...]:
    """The dims of ``dims`` that end the shape without a gap: ``(2, 3)`` of ``(0, 2, 3)``."""
    sd, j = sorted(dims), len(dims)
    while j > 0 and sd[j - 1] == nd - (len(dims) - j) - 1:
        j -= 1
    return tuple(sd[j:])


def sum_of_squares(rows: torch.Tensor, precise: bool = False, exact: bool = False,
                   double: bool = False, chunk: int | None = None) -> torch.Tensor:
    """The sum of squares of each row of a contiguous ``(R, n)``: ``vector_norm(...) ** 2``
    over chunks of at most 256 values, whose squares are then summed (for float32 in float64:
    squaring the rounded norms and summing them in float32 was 2-3 roundings of the sum).
    ``vector_norm`` accumulates sequentially in float32 (no pairwise summation): over one long
    set (a LayerNorm over (C, H, W), 65536 values) its error was 4x torch's, over an
    InstanceNorm set of 1024 values 2x.  A long row that cannot be cut into equal chunks is
    summed by ``vecdot`` (pairwise; writes the squares).

    For float32 rows, ``precise`` takes chunks of 64 values and returns the sums in float64
    (about the time of chunks of 256; measured at (2048, 1024) and (256, 8192): 1.2 and 0.3
    roundings of the sum, where chunks of 256 were 2.3 and 0.8); ``exact`` sums each row in
    float64 (exact to a rounding of the sum, about 4x the time) and returns float64;
    ``double`` returns the sums of chunks of 256 in float64 (not rounded to float32);
    ``chunk`` sets the chunk size (GN's and IN's precise sums take 128: 0.1 ms less than 64
    at (32, 64, 32, 32); GN's y 0.61-0.87x torch's error on seeds 0-4 of
    benchmarks/accuracy.py, 0.66-0.88x under the generic kernels, where chunks of 256 were
    1.28x).  The variance is then good enough that r, and every output of its set, carries
    about one rounding."""
    n = rows.shape[-1]
    single = rows.dtype == torch.float32
    if exact and single:
        return torch.linalg.vector_norm(rows, dim=-1, dtype=torch.float64).square()
    precise = precise and single
    back = torch.float64 if (precise or double) and single else rows.dtype
    size = chunk or (64 if precise else 256)
    if n <= size:
        norms = torch.linalg.vector_norm(rows, dim=-1)
        return norms.double().square().to(back) if single else norms.square()
    cut = next((c for c in (size, 128, 64) if n % c == 0 and c <= size), None)
    if cut is None:
        return torch.linalg.vecdot(rows, rows, dim=-1).to(back)
    parts = torch.linalg.vector_norm(rows.reshape(rows.shape[0], n // cut, cut), dim=-1)
    if single:
        return parts.double().square().sum(-1).to(back)
    return parts.square().sum(-1)


def row_sums(rows: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """The sum of each row of a float32 ``(R, n)`` in float64, ``(R, 1)``: by chunks of 256 in
    float32 (or of 128, 64), then in float64 (``exact``, or a row not cut so: the whole row in
    float64, 8x the time; chunks of 64 took twice as long, for no gain in the outputs)."""
    n = rows.shape[1]
    chunk = next((c for c in (256, 128, 64) if n % c == 0), None)
    if exact or chunk is None:
        return torch.sum(rows, 1, keepdim=True, dtype=torch.float64)
    return rows.view(rows.shape[0], n // chunk, chunk).sum(-1).sum(-1, keepdim=True,
                                                                    dtype=torch.float64)


def column_sums(t: torch.Tensor, out: torch.Tensor) -> None:
    """The sums of the columns of ``t`` into ``out`` (float64 for float32 ``t``): by 32 rows
    in float32, then in ``out``'s dtype (measured at (1024, 512): a float32 sum down 1024 rows
    was 2.3 roundings of the largest sum, by 32 rows 0.7, for 1.5x its time; a float64 sum
    down the whole column, 6x)."""
    rows = t.shape[0]
    if out.dtype != t.dtype and rows % 32 == 0 and rows > 32:
        t = t.view(rows // 32, 32, -1).sum(1)
    torch.sum(t, 0, dtype=out.dtype, out=out)


#: columns of the block ``t`` is copied to in :func:`row_affine` (measured at (2048, 1024) on
#: one thread: blocks of 16, 32, 64 and 128 columns took 0.37, 0.30, 0.27 and 0.28 ms)
AFFINE_BLOCK = 64


def row_affine(x: torch.Tensor, s: torch.Tensor, t: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
    r""":math:`x\,s + t` into ``out`` (``x``'s shape, contiguous; may be ``x``), ``s`` and ``t``
    one value per row of ``x``'s last dim (broadcastable to ``x.shape[:-1] + (1,)``), in one
    pass with the multiply-add fused (``addcmul``), bit for bit ``out.copy_(t).addcmul_(x, s)``.

    Why: ``torch.addcmul(t, x, s)`` with both ``s`` and ``t`` broadcast along the last dim
    runs torch's scalar loop (its CPU kernels vectorize an op with at most one broadcast
    operand): 0.91 ms at (2048, 1024), where copying ``t`` and adding ``x s`` in place took
    0.32 ms in two passes.  Here ``t`` is copied to a small contiguous block of
    :data:`AFFINE_BLOCK` columns per row, which every block of the row reads: one broadcast
    operand, one pass, 0.27 ms.  A last dim not a multiple of the block takes the two passes
    (in place, ``out`` being ``x``: the one slow ``addcmul``)."""
    P = x.shape[-1]
    lead = x.shape[:-1]
    if P % AFFINE_BLOCK or not (x.is_contiguous() and out.is_contiguous()):
        if out is not x:
            return out.copy_(t.expand_as(out)).addcmul_(x, s)
        return torch.addcmul(t, x, s, out=out)                   # in place: one op
    R, k = x.numel() // P, AFFINE_BLOCK
    t_rows = t.expand(lead + (1,)).reshape(R, 1, 1).expand(R, 1, k).contiguous()
    torch.addcmul(t_rows, x.view(R, P // k, k), s.expand(lead + (1,)).reshape(R, 1, 1),
                  out=out.view(R, P // k, k))
    return out
