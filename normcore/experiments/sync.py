r"""Per-device, synchronized and full-batch BatchNorm side by side, over real processes.

The running-statistics chapter's comparison: :func:`compare` runs
:func:`compare_per_device_vs_sync` in one process per local batch
(:func:`normcore.launch.run`) and assembles what the ranks computed as one full batch would
see it.  The workers are importable module functions, so they work with any start method.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .. import data
from ..launch import run
from ..nn import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm
from ..nn.batchnorm import _BatchNorm
from ..sync import all_gather_moments, local_moments, merge

__all__ = ["compare_per_device_vs_sync", "compare", "plain_batch_norm"]


def plain_batch_norm(num_features: int, ndim: int, **kwargs) -> _BatchNorm:
    """The normcore BatchNorm module for an input with ``ndim`` dims (2 or 3: 1d, 4: 2d, 5: 3d)."""
    cls = {2: BatchNorm1d, 3: BatchNorm1d, 4: BatchNorm2d, 5: BatchNorm3d}.get(ndim)
    if cls is None:
        raise ValueError(f"no normcore BatchNorm for {ndim}-dim inputs; use 2 to 5 dims")
    return cls(num_features, **kwargs)


def _torch_batch_norm(num_features: int, ndim: int, **kwargs) -> torch.nn.Module:
    cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
           5: torch.nn.BatchNorm3d}[ndim]
    return cls(num_features, **kwargs)


def _step_data(seed: int, step: int, shape: tuple[int, ...], rank_shift: float,
               bounds: list[int], dtype) -> tuple[Tensor, Tensor]:
    """The global batch and the upstream gradient of one step (same on every rank)."""
    gen = data.generator(seed * 1_000_003 + step)
    # per-channel means and scales, as a real layer's inputs have
    x = data.structured(gen, shape, scale=(0.5, 2.5), shift=3.0, sample_shift=0.0)
    for r in range(len(bounds) - 1):  # non-i.i.d. shards: rank r's slice shifted by r * rank_shift
        x[bounds[r]:bounds[r + 1]] += r * rank_shift
    g = data.normal(gen, shape)
    return x.to(dtype), g.to(dtype)


def compare_per_device_vs_sync(seed: int, local_batch_sizes: Sequence[int], num_features: int = 3,
                               spatial: Sequence[int] = (), steps: int = 3,
                               momentum: float | None = 0.1, eps: float = 1e-5,
                               rank_shift: float = 0.0, dtype=torch.float64,
                               affine: bool = True, bias: bool = True,
                               track_running_stats: bool = True) -> dict:
    r"""A worker for :func:`run`: per-device BN, synchronized BN and full-batch BN, side by side.

    Call it as ``run(compare_per_device_vs_sync, len(local_batch_sizes), seed,
    local_batch_sizes, ...)``.  Every rank makes the same global batches (``steps`` of
    them, shape ``(sum(local_batch_sizes), num_features, *spatial)``, seeded, with per-channel
    means and scales; ``rank_shift`` adds ``r * rank_shift`` to rank ``r``'s slice to mimic
    non-i.i.d. shards) and an upstream gradient ``g`` per step (the loss is
    :math:`\sum_i g_i y_i`).  Rank ``r`` takes its slice, and each step runs

    * ``per_device``: a :mod:`normcore.nn` BatchNorm on the slice alone (``None`` where it
      cannot train: a slice with one value per channel, or none);
    * ``sync``: :class:`SyncBatchNorm` on the slice;
    * ``full`` and ``torch``: normcore's and torch's BatchNorm on the whole batch (the same
      on every rank), of which the rank keeps its slice of the output and input gradient.

    Returns a dict: ``rank``, ``world_size``, ``bounds`` (slice ``r`` is
    ``bounds[r]:bounds[r+1]``), ``x`` (this rank's slices, one per step), ``moments``
    (``local``: this rank's ``(count, mean, m2)`` at the last step; ``gathered``: all ranks';
    ``merged``: Chan's merge; ``two_pass``: the full batch's), and for each of
    ``per_device``, ``sync``, ``full``, ``torch`` a dict of per-step lists ``output``,
    ``grad_input`` (this rank's slice), ``grad_weight``, ``grad_bias`` (the sync and
    per-device ones are this rank's local parts: sum them over ranks), ``running_mean``,
    ``running_var``, ``num_batches_tracked`` (after each step), and ``eval_output`` (eval mode
    on this rank's slice of the last batch, after training).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(b) for b in local_batch_sizes]
    if len(sizes) != world:
        raise ValueError(f"compare_per_device_vs_sync: {len(sizes)} local batch sizes for a "
                         f"world of {world} ranks")
    if steps < 1 or any(b < 0 for b in sizes):
        raise ValueError(f"compare_per_device_vs_sync: need steps >= 1 and local batch sizes "
                         f">= 0, got steps={steps}, local_batch_sizes={sizes}")
    bounds = [0]
    for b in sizes:
        bounds.append(bounds[-1] + b)
    lo, hi = bounds[rank], bounds[rank + 1]
    spatial = tuple(int(s) for s in spatial)
    shape = (bounds[-1], num_features) + spatial
    ndim = len(shape)
    kw = dict(eps=eps, momentum=momentum, affine=affine, track_running_stats=track_running_stats,
              dtype=dtype, bias=bias)
    models = {
        "per_device": plain_batch_norm(num_features, ndim, **kw),
        "sync": SyncBatchNorm(num_features, **kw),
        "full": plain_batch_norm(num_features, ndim, **kw),
        "torch": _torch_batch_norm(num_features, ndim, **kw),
    }
    if affine:  # the same non-trivial gamma, beta everywhere
        gen = torch.Generator().manual_seed(seed)
        gamma = torch.rand(num_features, generator=gen, dtype=torch.float64) + 0.5
        beta = torch.randn(num_features, generator=gen, dtype=torch.float64)
        for m in models.values():
            with torch.no_grad():
                m.weight.copy_(gamma)
                if m.bias is not None:
                    m.bias.copy_(beta)
    keys = ("output", "grad_input", "grad_weight", "grad_bias", "running_mean", "running_var",
            "num_batches_tracked")
    rec = {name: {k: [] for k in keys} for name in models}
    local_count = (hi - lo) * math.prod(spatial)  # values per channel on this rank
    per_device_ok = local_count > 1
    xs = []
    for step in range(steps):
        x_full, g_full = _step_data(seed, step, shape, rank_shift, bounds, dtype)
        xs.append(x_full[lo:hi].clone())
        for name, model in models.items():
            whole = name in ("full", "torch")
            if name == "per_device" and not per_device_ok:
                for k in keys:
                    rec[name][k].append(None)
                continue
            x = (x_full if whole else x_full[lo:hi]).clone().requires_grad_(True)
            g = g_full if whole else g_full[lo:hi]
            for p in model.parameters():
                p.grad = None
            y = model(x)
            (y * g).sum().backward()
            r = rec[name]
            r["output"].append((y[lo:hi] if whole else y).detach().clone())
            r["grad_input"].append((x.grad[lo:hi] if whole else x.grad).clone())
            r["grad_weight"].append(None if model.weight is None else model.weight.grad.clone())
            r["grad_bias"].append(None if model.bias is None else model.bias.grad.clone())
            for k in ("running_mean", "running_var", "num_batches_tracked"):
                b = getattr(model, k)
                r[k].append(None if b is None else b.clone())
    # eval mode: no communication, the (identical) buffers on this rank's slice
    for name, model in models.items():
        model.eval()
        whole = name in ("full", "torch")
        if not whole and ((name == "per_device" and not per_device_ok)
                          or (not track_running_stats and local_count == 1)):
            rec[name]["eval_output"] = None  # BN cannot normalize one value by itself
            continue
        with torch.no_grad():
            y = model(x_full if whole else x_full[lo:hi])
        rec[name]["eval_output"] = (y[lo:hi] if whole else y).clone()
    # Chan's merge, shown on the last step's batch
    loc = local_moments(x_full[lo:hi].to(torch.float64))
    gathered = all_gather_moments(loc)
    merged = merge(gathered)
    two_pass = local_moments(x_full.to(torch.float64))
    as_tuple = lambda m: (int(m.count), m.mean.clone(), m.m2.clone())
    return {
        "rank": rank, "world_size": world, "bounds": bounds, "x": xs,
        "moments": {"local": as_tuple(loc), "gathered": [as_tuple(m) for m in gathered],
                    "merged": as_tuple(merged), "two_pass": as_tuple(two_pass)},
        **rec,
    }


def compare(local_batch_sizes: Sequence[int], seed: int = 0, *, timeout: float = 60.0,
            start_method: str | None = None, **kwargs) -> dict:
    """Run :func:`compare_per_device_vs_sync` in ``len(local_batch_sizes)`` processes and
    assemble the ranks' results as one full batch would see them.

    Returns ``{"ranks": [per-rank dicts], "per_device": ..., "sync": ..., "full": ...,
    "torch": ...}`` where each method's dict holds, per step, ``output`` and ``grad_input``
    concatenated over ranks (batch order), ``grad_weight`` / ``grad_bias`` summed over ranks
    for ``per_device`` and ``sync`` (what DDP's all-reduce would produce), and
    ``running_mean`` / ``running_var`` / ``num_batches_tracked`` as a ``(world, C)`` (or
    ``(world,)``) stack of every rank's buffers: identical rows for ``sync``, different rows
    for ``per_device``.  Entries a rank could not compute (per-device BN on a slice of one
    value) are ``None``.
    """
    ranks = run(compare_per_device_vs_sync, len(local_batch_sizes), seed, list(local_batch_sizes),
                timeout=timeout, start_method=start_method, **kwargs)
    out: dict[str, Any] = {"ranks": ranks}
    for name in ("per_device", "sync", "full", "torch"):
        steps = len(ranks[0][name]["output"])
        d: dict[str, Any] = {}
        for k in ("output", "grad_input"):
            d[k] = [None if any(r[name][k][s] is None for r in ranks)
                    else torch.cat([r[name][k][s] for r in ranks]) for s in range(steps)]
        for k in ("grad_weight", "grad_bias"):
            if name in ("full", "torch"):
                d[k] = [ranks[0][name][k][s] for s in range(steps)]
            else:
                d[k] = [None if any(r[name][k][s] is None for r in ranks)
                        else torch.stack([r[name][k][s] for r in ranks]).sum(0)
                        for s in range(steps)]
        for k in ("running_mean", "running_var", "num_batches_tracked"):
            d[k] = [None if any(r[name][k][s] is None for r in ranks)
                    else torch.stack([r[name][k][s] for r in ranks]) for s in range(steps)]
        ev = [r[name]["eval_output"] for r in ranks]
        d["eval_output"] = None if any(e is None for e in ev) else torch.cat(ev)
        out[name] = d
    return out
