"""BatchNorm modules: ``BatchNorm1d/2d/3d`` and ``SyncBatchNorm``.

Each is a subclass of the ``torch.nn`` class it replaces (``normcore.nn.BatchNorm2d`` is a
``torch.nn.BatchNorm2d``, hence a ``torch.nn.modules.batchnorm._BatchNorm``), so torch's
utilities (``convert_sync_batchnorm``, ``fuse_conv_bn_eval``, the freeze-BN idiom,
``torch.func.replace_all_batch_norm_modules_``) treat it as theirs.  torch's ``__init__``,
buffers, ``reset_*``, ``extra_repr`` and ``_load_from_state_dict`` are reused; normcore
overrides the forward (its own math), the input checks (clearer errors) and checks the
constructor's arguments first (torch does not reject ``eps <= 0`` or a momentum outside
[0, 1]).  The base class is shared with InstanceNorm, as in torch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.modules import batchnorm as torch_bn

from .. import _checks as checks
from .. import functional as F
from .. import stats
from .. import sync
from ._fx import traced_as_leaf

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"]


class _NormBase(torch_bn._NormBase):
    """torch's ``_NormBase`` (parameters, running buffers, ``reset_*``, ``extra_repr``,
    ``_load_from_state_dict``), with normcore's checks of the constructor's arguments."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None,
                 *, bias: bool = True):
        cls = type(self).__name__
        checks.check_positive_int(num_features, "num_features", cls)
        checks.check_eps(eps, cls)
        checks.check_momentum(momentum)
        # keywords after track_running_stats: SyncBatchNorm's signature puts process_group there
        super().__init__(int(num_features), eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype, bias=bias)


class _BatchNorm(_NormBase, torch_bn._BatchNorm):

    """BatchNorm over ``(N, C, *)``: batch statistics in training, running ones in eval.

    * train mode, ``track_running_stats=True``: normalize with the batch's mean and biased
      variance; update the buffers (EMA with ``momentum``; the cumulative average
      ``1 / num_batches_tracked`` when ``momentum is None``).
    * eval mode, ``track_running_stats=True``: normalize with the buffers.
    * ``track_running_stats=False``: no buffers; batch statistics in both modes.
    """

    _expected_dims: tuple[int, ...] = ()

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() not in self._expected_dims:
            want = " or ".join(f"{d}D" for d in self._expected_dims)
            raise ValueError(
                f"expected {want} input (got {input.dim()}D input); "
                f"{type(self).__name__} takes {self._shape_hint}")
        if input.shape[1] != self.num_features:
            raise checks.ShapeError(      # torch: RuntimeError (a ValueError here as well)
                f"{type(self).__name__}({self.num_features}) got an input with "
                f"{input.shape[1]} channels at dim 1 (shape {tuple(input.shape)}); num_features "
                f"must be the input's channel count")

    def _averaging_factor(self) -> float:
        """Count this batch and return the weight of its statistics in the running ones:
        ``momentum``, or ``1 / num_batches_tracked`` (the cumulative average) for None.

        As in ``torch.nn.BatchNorm2d.forward``, the count stays a tensor and is read only
        for ``momentum=None``, as ``1.0 / float(count)``: under ``torch.compile`` that is a
        value of the graph (no guard on it, no recompilation per step), and it is >= 1
        here, having just been incremented."""
        factor = 0.0 if self.momentum is None else float(self.momentum)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        return factor

    def _batch_norm(self, input: Tensor, factor: float, use_batch_stats: bool,
                    running_mean, running_var) -> Tensor:
        return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                            use_batch_stats, factor, self.eps)

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        checks.check_float(input, "input", type(self).__name__)
        self._check_input_dim(input)
        factor = self._averaging_factor()
        # batch statistics in training, and in eval when there are no buffers
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # buffers are passed when they are to be read (eval) or updated (train, tracking)
        pass_buffers = not self.training or self.track_running_stats
        return self._batch_norm(input, factor, use_batch_stats,
                                self.running_mean if pass_buffers else None,
                                self.running_var if pass_buffers else None)


class BatchNorm1d(_BatchNorm, torch_bn.BatchNorm1d):
    """BatchNorm over ``(N, C)`` or ``(N, C, L)``: one mean/variance per channel."""

    _expected_dims = (2, 3)
    _shape_hint = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm, torch_bn.BatchNorm2d):
    """BatchNorm over ``(N, C, H, W)``: one mean/variance per channel over N, H, W."""

    _expected_dims = (4,)
    _shape_hint = "(N, C, H, W)"


class BatchNorm3d(_BatchNorm, torch_bn.BatchNorm3d):
    """BatchNorm over ``(N, C, D, H, W)``."""

    _expected_dims = (5,)
    _shape_hint = "(N, C, D, H, W)"


class SyncBatchNorm(_BatchNorm, torch_bn.SyncBatchNorm):
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
            raise checks.ShapeError(
                f"SyncBatchNorm({self.num_features}) got an input with {input.shape[1]} "
                f"channels at dim 1 (shape {tuple(input.shape)})")

    def _group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def forward(self, input: Tensor) -> Tensor:
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        if self.training:  # check before _averaging_factor counts the batch
            sync.require_process_group("SyncBatchNorm")
        return super().forward(input)

    def _batch_norm(self, input: Tensor, factor: float, use_batch_stats: bool,
                    running_mean, running_var) -> Tensor:
        # eval mode (buffers, or local stats without buffers) and a world of one: plain BN
        if not (self.training and use_batch_stats) or dist.get_world_size(self._group()) == 1:
            return super()._batch_norm(input, factor, use_batch_stats, running_mean, running_var)
        return sync.SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean, running_var,
                                      factor, self.eps, self._group())

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module, process_group=None) -> torch.nn.Module:
        """Replace every BatchNorm*d (``torch.nn`` or ``normcore.nn``) in ``module`` by a
        :class:`SyncBatchNorm`, as ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` does.

        The new module takes over the *same* parameter and buffer tensors (so an optimizer
        built before the conversion still holds the right parameters, and ``requires_grad``
        carries over), and the training flag.  A BatchNorm passed directly is returned as a
        new module; otherwise ``module`` is changed in place and returned.

        ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` converts normcore's BatchNorms too
        (they are torch's ``_BatchNorm``), but into torch's ``SyncBatchNorm`` (its code names
        that class), which refuses CPU tensors in training under a process group.
        """
        out = module
        if isinstance(module, torch_bn._BatchNorm):
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
