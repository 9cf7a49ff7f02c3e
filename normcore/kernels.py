r"""The compiled kernels as :class:`normcore.grad.Normalize` calls them: a family of
:data:`normcore.dispatch.TABLE` on the view of the input's memory that its loops read.

* ``"rows"``, LN and RMSNorm: the ``(sets, |S|)`` view (:func:`normcore.loops.forward`);
* ``"sets"``, GN and IN on contiguous memory: ``(N G, C/G, P)``
  (:func:`normcore.loops.forward_by_sets`);
* ``"channels"``, BN on contiguous memory: ``(N, C, P)`` (:func:`normcore.loops.forward_by_channels`);
* ``"positions"``, GN, IN and BN on ``channels_last`` memory: ``(N, P, C)``, BN as one sample
  of ``N P`` positions (:func:`normcore.positions.forward_positions`).

The forward keeps, for the backward, each set's mean and r in float64 (a value per set): the
backward recomputes :math:`\hat x` from x, and nothing full-size but the output and the
input's gradient is made, as in torch's kernels.
"""
from __future__ import annotations

import torch

from . import dispatch, loops, positions
from .axes import Layout
from .core import output_format

__all__ = ["forward", "backward", "fixed_forward", "fixed_backward"]


def _sets(lay: Layout) -> tuple[int, int, int, int]:
    """``(N, G, C/G, P)`` of GN (IN: one channel per group) on contiguous memory."""
    N, C = lay.shape[0], lay.shape[1]
    G = lay.num_groups if lay.norm == "group" else C
    return N, G, C // G, lay.set_size * G // C


def _positions(t: torch.Tensor, lay: Layout) -> torch.Tensor:
    """``t`` on ``channels_last`` memory as its ``(N, P, C)`` view, BN's as ``(1, N P, C)``."""
    return positions.as_positions(t, 1 if lay.norm == "batch" else t.shape[0])


def _format(x: torch.Tensor) -> torch.memory_format:
    """The ``channels_last`` format of x's dims (an ``(N, C)`` input: contiguous is that)."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim(),
                                                                  torch.contiguous_format)


def _per_group(lay: Layout) -> int:
    """Channels per set on ``channels_last`` memory: C/G for GN, 1 for IN and BN."""
    return lay.shape[1] // lay.num_groups if lay.norm == "group" else 1


def forward(family: str, x: torch.Tensor, weight, bias, lay: Layout, eps: float):
    """``(y, mean, var, mu, r)``: the output in torch's memory format, the statistics in x's
    dtype and ``lay.stat_shape``, and the float64 mean and r per set for :func:`backward`."""
    y = torch.empty_like(x, memory_format=torch.preserve_format)
    if family == "rows":
        sets, n = lay.num_sets, lay.set_size
        stats = loops.forward(x.reshape(sets, n), eps, lay.centered, weight, bias,
                              y.view(sets, n))
    elif family == "sets":
        N, G, Cg, P = _sets(lay)
        stats = loops.forward_by_sets(x.reshape(N * G, Cg, P), eps, weight, bias, G,
                                      y.view(N * G, Cg, P))
    elif family == "channels":
        N, C = x.shape[:2]
        stats = loops.forward_by_channels(x.reshape(N, C, -1), eps, weight, bias,
                                          y.view(N, C, -1))
    else:
        stats = positions.forward_positions(_positions(x, lay), eps, weight, bias,
                                            _per_group(lay), _positions(y, lay),
                                            lay.norm != "batch")
    mu, var, r = stats
    y = y.contiguous(memory_format=output_format(lay, x))
    return (y, mu.to(x.dtype).reshape(lay.stat_shape), var.to(x.dtype).reshape(lay.stat_shape),
            mu, r)


def backward(family: str, g: torch.Tensor, x: torch.Tensor, weight, mu: torch.Tensor,
             r: torch.Tensor, lay: Layout):
    """``(dL/dx, dL/dgamma, dL/dbeta)``: dx in x's dtype and torch's memory format, the sums
    in float64 (``(C,)`` or ``normalized_shape``), from the forward's float64 ``mu`` and ``r``."""
    dx = torch.empty_like(x, memory_format=torch.preserve_format)
    g = g.to(x.dtype).contiguous(memory_format=_format(x) if family == "positions"
                                 else torch.contiguous_format)
    if family == "rows":
        sets, n = lay.num_sets, lay.set_size
        sums = loops.backward(g.reshape(sets, n), x.reshape(sets, n), weight, mu, r,
                              lay.centered, dx.view(sets, n))
    elif family == "sets":
        N, G, Cg, P = _sets(lay)
        sums = loops.backward_by_sets(g.reshape(N * G, Cg, P), x.reshape(N * G, Cg, P), weight,
                                      G, mu, r, dx.view(N * G, Cg, P))
    elif family == "channels":
        N, C = x.shape[:2]
        sums = loops.backward_by_channels(g.reshape(N, C, -1), x.reshape(N, C, -1), weight, mu,
                                          r, dx.view(N, C, -1))
    else:
        sums = positions.backward_positions(_positions(g, lay), _positions(x, lay), weight,
                                            _per_group(lay), mu, r, _positions(dx, lay))
    shape = lay.affine_shape
    dx = dx.contiguous(memory_format=output_format(lay, x))
    return dx, sums[0].reshape(shape), sums[1].reshape(shape)


def fixed_forward(x: torch.Tensor, mean: torch.Tensor, s: torch.Tensor, t: torch.Tensor,
                  lay: Layout) -> torch.Tensor:
    """BN and IN with the running statistics: ``(x - mean) s + t`` per channel, in float64 and
    rounded once (``mean``, ``s``, ``t`` float64 ``(C,)``), in torch's memory format."""
    y = torch.empty_like(x, memory_format=torch.preserve_format)
    if dispatch.memory_format(x, lay.norm) == "contiguous":
        N, C = x.shape[:2]
        loops.fixed_by_channels(x.reshape(N, C, -1), mean, s, t, y.view(N, C, -1))
    else:
        positions.fixed_forward(positions.as_positions(x, 1), mean, s, t,
                                positions.as_positions(y, 1))
    return y.contiguous(memory_format=output_format(lay, x))


def fixed_backward(g: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, s: torch.Tensor,
                   lay: Layout):
    r"""Its backward: ``(dL/dx, sums)``, dx = g s rounded once, the float64 ``(2, C)`` sums of
    :math:`g\,(x - \mu)` and of :math:`g` per channel, in one pass over x and g."""
    if dispatch.memory_format(x, lay.norm) == "contiguous":
        N, C = x.shape[:2]
        g = g.to(x.dtype).contiguous()
        dx = torch.empty_like(x)
        sums = loops.fixed_by_channels(x.reshape(N, C, -1), mean, s, s, dx.view(N, C, -1),
                                       g.reshape(N, C, -1))
        return dx, sums
    g = g.to(x.dtype).contiguous(memory_format=_format(x))
    dx = torch.empty_like(x, memory_format=_format(x))
    sums = positions.backward_fixed(positions.as_positions(g, 1), positions.as_positions(x, 1),
                                    mean, s, positions.as_positions(dx, 1))
    return dx, sums
