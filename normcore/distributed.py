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

Running it: :func:`run`
-----------------------
:func:`run` starts ``world_size`` processes on 127.0.0.1, joins them in a gloo process group
and returns each rank's result to the caller::

    from normcore.distributed import run, compare_per_device_vs_sync
    results = run(compare_per_device_vs_sync, 3, 0, [4, 1, 3])   # one dict per rank

On Linux it forks (about 0.1 s for a world, against ~3 s to spawn fresh interpreters that
import torch).  Forking is safe here because the children set ``torch.set_num_threads(1)``
before any torch op (a forked child must not reuse the parent's OpenMP pool; PyTorch's
DataLoader workers do the same) and because the parent has no gloo process group of its own
(if it has one, :func:`run` spawns instead).  With fork, the function may even be defined in
a notebook; with ``start_method="spawn"`` it must be importable.
"""
from __future__ import annotations

import sys as _sys

if __package__ and f"{__package__}.nn" not in _sys.modules:  # pragma: no cover - import order
    # normcore.nn ends with ``from .distributed import SyncBatchNorm``.  When this module is
    # imported before normcore.nn, that line would meet this half-built module.  So step
    # aside: normcore.nn imports a complete copy of this file, and the import system hands
    # that copy (the one now in sys.modules) to whoever imported us.
    import importlib as _importlib

    del _sys.modules[__name__]
    _importlib.import_module(f"{__package__}.nn")

import datetime
import math
import os
import pickle
import socket
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import functional as F
from . import stats
from .nn import BatchNorm1d, BatchNorm2d, BatchNorm3d, _BatchNorm

__all__ = [
    "SyncBatchNorm", "sync_batch_norm", "local_moments", "all_gather_moments", "sync_moments",
    "run", "free_port", "compare_per_device_vs_sync", "compare", "plain_batch_norm",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------
# moments: local, gathered, merged
# ---------------------------------------------------------------------------------------
def _reduce_dims(x: Tensor) -> tuple[int, ...]:
    # BatchNorm reduces over the batch and every spatial dim: all but the channel dim 1
    return (0,) + tuple(range(2, x.dim()))


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
    var, mean = torch.var_mean(x, dim=_reduce_dims(x), correction=0)  # two-pass, stable
    return stats.Moments(count, mean, var * count)                     # M2 = n * biased var


def all_gather_moments(local: stats.Moments, group=None) -> list[stats.Moments]:
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


def _merge(parts: Sequence[stats.Moments]) -> stats.Moments:
    """Chan's merge of the ranks' moments (empty ranks skipped), with BatchNorm's size check."""
    total = sum(int(p.count) for p in parts)
    if total <= 1:
        raise ValueError(
            f"Expected more than 1 value per channel when training, got {total} value(s) per "
            f"channel over all {len(parts)} ranks (local counts {[int(p.count) for p in parts]}). "
            f"(SyncBatchNorm: a batch statistic over one value is that value; use a larger "
            f"global batch, or eval mode)")
    return stats.chan_merge_many(parts)


def sync_moments(x: Tensor, group=None) -> stats.Moments:
    """The moments of the *global* batch, from this rank's slice ``x``: local, gather, merge.

    Every rank must call it.  ``mean`` and ``m2`` are float64; ``m2 / count`` is the global
    biased variance and ``m2 / (count - 1)`` the unbiased one.
    """
    return _merge(all_gather_moments(local_moments(x), group))


# ---------------------------------------------------------------------------------------
# the autograd Function: forward with merged moments, backward with two all-reduced sums
# ---------------------------------------------------------------------------------------
class _SyncBatchNormFn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input: Tensor, weight, bias, running_mean, running_var,
                momentum: float, eps: float, group) -> Tensor:
        cdt = torch.float32 if input.dtype in _LOW_PRECISION else input.dtype
        x = input.to(cdt)
        C = x.shape[1]
        view = (1, C) + (1,) * (x.dim() - 2)                   # broadcast per channel
        # 1. (n_r, mu_r, M2_r) on this slice;  2. all_gather;  3. Chan's merge
        merged = _merge(all_gather_moments(local_moments(x), group))
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
    def backward(ctx, grad_output: Tensor):
        input, weight, mean, invstd = ctx.saved_tensors
        cdt, n = ctx.cdt, ctx.n
        C = input.shape[1]
        view = (1, C) + (1,) * (input.dim() - 2)
        dims = _reduce_dims(input)
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


def sync_batch_norm(input: Tensor, running_mean=None, running_var=None, weight=None, bias=None,
                    momentum: float = 0.1, eps: float = 1e-5, process_group=None) -> Tensor:
    r"""Training-mode BatchNorm whose statistics are those of the batch over all ranks.

    ``input`` is this rank's slice ``(N_r, C, *)``.  Every rank of ``process_group`` (default:
    the world) must call it.  If given, ``running_mean`` and ``running_var`` are updated in
    place with the global mean and unbiased variance and weight ``momentum`` (a number: pass
    ``1 / num_batches_tracked`` for the cumulative average; the module does that for you).
    """
    fn = "sync_batch_norm"
    F.check_float(input, "input", fn)
    F.check_eps(eps, fn)
    stats.check_momentum(momentum)
    if momentum is None:
        momentum = F._momentum_value(momentum, fn)  # raises the explanatory TypeError
    if input.dim() < 2:
        raise ValueError(
            f"{fn}: expected an input of shape (N, C, *), got shape {tuple(input.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{fn}: give both running_mean and running_var, or neither")
    _require_process_group(fn)
    return _SyncBatchNormFn.apply(input, weight, bias, running_mean, running_var,
                                  float(momentum), float(eps), process_group)


def _require_process_group(who: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{who}: training mode needs torch.distributed's default process group to "
            f"synchronize the batch statistics, and none is initialized. Call "
            f"torch.distributed.init_process_group('gloo', rank=..., world_size=...) in every "
            f"process first (normcore.distributed.run does it for you; a world of size 1 is "
            f"fine), or use normcore.nn.BatchNorm1d/2d/3d for single-process training. "
            f"(torch.nn.SyncBatchNorm would silently fall back to per-process BatchNorm here.)")


# ---------------------------------------------------------------------------------------
# the module
# ---------------------------------------------------------------------------------------
class SyncBatchNorm(_BatchNorm):
    r"""BatchNorm whose training statistics are synchronized over a process group.

    Same constructor, parameters, buffers and ``state_dict`` as ``torch.nn.SyncBatchNorm``
    (torch 2.13), and it works on CPU tensors with the gloo backend.  Takes ``(N, C, *)``.
    See the module docstring for the math, and for what happens with an empty local batch,
    a world of size 1, eval mode and a missing process group.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, process_group=None,
                 device=None, dtype=None, *, bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype,
                         bias=bias)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input); "
                             f"SyncBatchNorm takes (N, C, *)")
        if input.shape[1] != self.num_features:
            raise ValueError(
                f"SyncBatchNorm({self.num_features}) got an input with {input.shape[1]} "
                f"channels at dim 1 (shape {tuple(input.shape)})")

    def _group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def forward(self, input: Tensor) -> Tensor:
        if self.training:  # check before _averaging_factor counts the batch
            _require_process_group("SyncBatchNorm")
        return super().forward(input)

    def _batch_norm(self, input: Tensor, factor: float, use_batch_stats: bool,
                    running_mean, running_var) -> Tensor:
        # eval mode (buffers, or local stats without buffers) and a world of one: plain BN
        if not (self.training and use_batch_stats) or dist.get_world_size(self._group()) == 1:
            return super()._batch_norm(input, factor, use_batch_stats, running_mean, running_var)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias, running_mean, running_var,
                                      factor, self.eps, self._group())

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_group=None) -> torch.nn.Module:
        """Replace every BatchNorm*d (``torch.nn`` or ``normcore.nn``) in ``module`` by a
        :class:`SyncBatchNorm`, as ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` does.

        The new module takes over the *same* parameter and buffer tensors (so an optimizer
        built before the conversion still holds the right parameters, and ``requires_grad``
        carries over), and the training flag.  A BatchNorm passed directly is returned as a
        new module; otherwise ``module`` is changed in place and returned.
        """
        out = module
        if isinstance(module, (torch.nn.modules.batchnorm._BatchNorm, _BatchNorm)):
            ref = module.weight if module.weight is not None else module.running_mean
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_group,
                      device=None if ref is None else ref.device,
                      dtype=None if ref is None else ref.dtype,
                      bias=module.bias is not None)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


# ---------------------------------------------------------------------------------------
# run(fn, world_size, *args): k processes on 127.0.0.1, results back to the caller
# ---------------------------------------------------------------------------------------
class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (shown as the ``__cause__``)."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (bind port 0, let the OS choose, release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write(path: str, obj) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic: the parent never reads half a file


def _bootstrap(rank: int, world_size: int, port: int, fn: Callable, args: tuple, kwargs: dict,
               out_dir: str, timeout: float, backend: str = "gloo", threads: int = 1) -> None:
    """One rank: join the group, run ``fn``, leave the group (always), write the result."""
    # Before any torch op: one intra-op thread per rank.  A forked child must not use the
    # parent's OpenMP thread pool (it hangs), and W ranks share the cores anyway.
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    path = os.path.join(out_dir, f"rank{rank}.pt")
    failed_at = None  # when this rank failed: the earliest failure is the root cause
    try:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        try:
            result = fn(*args, **kwargs)
            dist.barrier()  # nobody tears down the store (hosted by rank 0) while others use it
        except BaseException:
            # stamped before destroy_process_group, which makes the other ranks fail
            failed_at = time.time()
            raise
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()  # destroys every group, even if fn raised
        envelope = {"ok": True, "result": result, "initialized": dist.is_initialized()}
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        try:
            blob = pickle.dumps(exc)
            pickle.loads(blob)
        except Exception:  # noqa: BLE001 - an exception that does not survive pickling
            blob = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
        envelope = {"ok": False, "exc": blob, "tb": traceback.format_exc(),
                    "time": failed_at or time.time()}
    _write(path, envelope)
    if not envelope["ok"]:
        _sys.exit(1)


def _default_start_method() -> str:
    if _sys.platform.startswith("linux") and not (dist.is_available() and dist.is_initialized()):
        return "fork"
    return "spawn"


def run(fn: Callable, world_size: int, *args, timeout: float = 60.0,
        start_method: str | None = None, backend: str = "gloo", **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` in ``world_size`` processes joined in a process group.

    Each process is one rank of a ``backend`` (gloo) group on 127.0.0.1 with a free port
    chosen now (``MASTER_ADDR``, ``MASTER_PORT``, ``env://``).  Returns the ranks' return
    values, in rank order (they travel back with ``torch.save``: tensors, dicts, lists...).

    * ``destroy_process_group`` always runs, in a ``finally`` in the worker.
    * An exception in a worker is re-raised here, the same type and message, with the
      worker's traceback chained as ``__cause__``; the other ranks are stopped.
    * ``timeout`` (seconds) bounds the whole run, and is the process group's timeout too: a
      rank waiting for a collective that another rank never joins fails, it does not hang.
      The children are always gone when ``run`` returns or raises.
    * ``start_method``: ``None`` forks on Linux (fast; see the module docstring) unless this
      process has a process group of its own, then spawns.  ``"spawn"`` and ``"forkserver"``
      need ``fn`` importable (a notebook-defined function is not: use the ready-made
      workers of this module, e.g. :func:`compare_per_device_vs_sync`).
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"run: world_size must be a positive int, got {world_size!r}")
    if not timeout > 0:
        raise ValueError(f"run: timeout must be > 0 seconds, got {timeout!r}")
    ctx = mp.get_context(start_method or _default_start_method())
    for attempt in range(3):  # retry only if someone took the free port in between
        with tempfile.TemporaryDirectory(prefix="normcore-dist-") as out_dir:
            port = free_port()
            procs = [ctx.Process(target=_bootstrap, name=f"normcore-rank{r}",
                                 args=(r, world_size, port, fn, args, kwargs, out_dir, timeout,
                                       backend))
                     for r in range(world_size)]
            try:
                for p in procs:
                    p.start()
                deadline = time.monotonic() + timeout
                failed = False
                while not failed and any(p.exitcode is None for p in procs):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        waiting = [r for r, p in enumerate(procs) if p.exitcode is None]
                        raise TimeoutError(
                            f"run({getattr(fn, '__name__', fn)}, {world_size}): rank(s) {waiting} "
                            f"did not finish within timeout={timeout} s. Usually a rank waits "
                            f"in a collective that another rank never joins (e.g. different "
                            f"numbers of forward or backward calls in training mode).")
                    wait([p.sentinel for p in procs if p.exitcode is None], timeout=min(left, 1.0))
                    failed = any(p.exitcode not in (None, 0) for p in procs)
            finally:
                for p in procs:  # stop whatever still runs (after a failure or a timeout)
                    if p.exitcode is None and p.pid is not None:
                        p.terminate()
                for p in procs:
                    if p.pid is not None:
                        p.join(5)
                        if p.exitcode is None:
                            p.kill()
                            p.join()
            envelopes = {}
            for r in range(world_size):
                path = os.path.join(out_dir, f"rank{r}.pt")
                if os.path.exists(path):
                    envelopes[r] = torch.load(path, weights_only=False)
        errors = {r: e for r, e in envelopes.items() if not e["ok"]}
        if errors:
            if attempt < 2 and any("EADDRINUSE" in e["tb"] or "address already in use"
                                   in e["tb"].lower() for e in errors.values()):
                continue
            rank, first = min(errors.items(), key=lambda kv: kv[1]["time"])  # the root cause
            exc = pickle.loads(first["exc"])
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised on rank {rank} of {world_size} in "
                             f"normcore.distributed.run({getattr(fn, '__name__', fn)}, ...))")
            raise exc from RemoteTraceback(f'\n"""\n[rank {rank}] {first["tb"]}"""')
        missing = [r for r in range(world_size) if r not in envelopes]
        if missing:
            codes = {r: procs[r].exitcode for r in missing}
            raise RuntimeError(f"run: rank(s) {missing} exited without a result "
                               f"(exit codes {codes}); a crash, or os._exit in the worker")
        leaked = [r for r, e in envelopes.items() if e["initialized"]]
        if leaked:  # cannot happen with the finally above; checked so a regression is loud
            raise RuntimeError(f"run: rank(s) {leaked} still had a process group at exit")
        return [envelopes[r]["result"] for r in range(world_size)]
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------
# ready-made workers for the chapter (importable, so they work with any start method)
# ---------------------------------------------------------------------------------------
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
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    C = shape[1]
    view = (1, C) + (1,) * (len(shape) - 2)
    scale = torch.rand(C, generator=gen, dtype=torch.float64) * 2 + 0.5      # per-channel std
    shift = torch.randn(C, generator=gen, dtype=torch.float64) * 3           # per-channel mean
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale.view(view) + shift.view(view)
    for r in range(len(bounds) - 1):  # non-i.i.d. shards: rank r's slice shifted by r * rank_shift
        x[bounds[r]:bounds[r + 1]] += r * rank_shift
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
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
        if not whole and (name == "per_device" and not per_device_ok
                          or not track_running_stats and local_count == 1):
            rec[name]["eval_output"] = None  # BN cannot normalize one value by itself
            continue
        with torch.no_grad():
            y = model(x_full if whole else x_full[lo:hi])
        rec[name]["eval_output"] = (y[lo:hi] if whole else y).clone()
    # Chan's merge, shown on the last step's batch
    loc = local_moments(x_full[lo:hi].to(torch.float64))
    gathered = all_gather_moments(loc)
    merged = _merge(gathered)
    two_pass = local_moments(x_full.to(torch.float64))
    as_tuple = lambda m: (int(m.count), m.mean.clone(), m.m2.clone())  # noqa: E731
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
