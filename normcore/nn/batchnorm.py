"""BatchNorm modules: ``BatchNorm1d/2d/3d`` and ``SyncBatchNorm``.

``BatchNorm1d/2d/3d`` subclass the ``torch.nn`` class they replace (``normcore.nn.BatchNorm2d``
is a ``torch.nn.BatchNorm2d``), and all four are a ``torch.nn.modules.batchnorm._BatchNorm``,
so torch's utilities (``convert_sync_batchnorm``, ``fuse_conv_bn_eval``, the freeze-BN idiom,
``torch.func.replace_all_batch_norm_modules_``) treat them as theirs.  ``SyncBatchNorm`` is
not a ``torch.nn.SyncBatchNorm``: ``DistributedDataParallel`` refuses every
``torch.nn.SyncBatchNorm`` in a model on CPU (an ``isinstance`` check: torch's runs on
accelerators only), and normcore's trains on CPU.  torch's ``__init__``,
buffers, ``reset_*``, ``extra_repr`` and ``_load_from_state_dict`` are reused; normcore
overrides the forward (its own math), the input checks (clearer errors) and checks the
constructor's arguments first (torch does not reject ``eps <= 0`` or a momentum outside
[0, 1]).  The base class is shared with InstanceNorm, as in torch.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.modules import batchnorm as torch_bn

from .. import _checks as checks
from .. import functional as F
from .. import sync
from ..defaults import EPS, MOMENTUM, fill_defaults
from . import _doc
from ._fx import traced_as_leaf

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"]

_BN = r"""Batch normalization over <<INPUT>>.

The elements that share statistics with an element :math:`x_i` of channel :math:`c` are all
of that channel's elements in the batch: :math:`S_i = \{(n, c, s)\}` over every sample
:math:`n` and position :math:`s`<<K>>.  With :math:`\mu_i` the mean and
:math:`\sigma_i^2` the **biased** variance (divided by :math:`K`) of :math:`S_i`,

.. math::

    y_i = \frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} \, \gamma_c + \beta_c

where :math:`\gamma, \beta` (``weight``, ``bias``, shape :math:`(C,)`) start at 1 and 0.
Which statistics are used depends on the mode (``module.training``):

- ``train()`` with ``track_running_stats=True``: the batch's :math:`\mu_i, \sigma_i^2`; then
  ``num_batches_tracked`` (:math:`t`) counts the batch and the buffers are updated,
  :math:`\hat\mu \leftarrow (1 - \alpha)\,\hat\mu + \alpha\,\mu_i` and
  :math:`\hat\sigma^2 \leftarrow (1 - \alpha)\,\hat\sigma^2 + \alpha\,\frac{K}{K - 1}\,
  \sigma_i^2` (the **unbiased** variance), with :math:`\alpha` = ``momentum``, or
  :math:`\alpha = 1/t` (a cumulative average) when ``momentum`` is ``None``.
- ``eval()`` with ``track_running_stats=True``: the buffers :math:`\hat\mu, \hat\sigma^2`
  (``running_mean``, ``running_var``) in place of :math:`\mu_i, \sigma_i^2`; nothing is
  updated.
- ``track_running_stats=False``: no buffers (they are ``None``); the batch's statistics in
  both modes.

The parameter and buffer names, ``extra_repr`` and ``state_dict`` are torch's (the class
subclasses ``torch.nn.<<NAME>>``), so a ``state_dict`` moves between the two both ways.<<MORE>>

Args:
    num_features (int): :math:`C`, the number of channels (dim 1 of the input).
    eps (float): :math:`\epsilon`, added to the variance under the square root; must be
        positive. Default: {default}
    momentum (float or None): :math:`\alpha`, the weight of the new batch in the running
        statistics, in [0, 1]; ``None`` for the cumulative average. Default: {default}
    affine (bool): learn :math:`\gamma` (``weight``) and :math:`\beta` (``bias``); without,
        both are ``None``. Default: {default}
    track_running_stats (bool): keep the buffers ``running_mean``, ``running_var`` and
        ``num_batches_tracked``, and normalize with them in eval mode. Default: {default}
<<PROCESS_GROUP>><<DEVICE_ARGS>>
    bias (bool): with ``affine``, also learn :math:`\beta`; ``False`` leaves ``bias``
        ``None``. Default: {default}

Shape:
    - Input: <<SHAPE>>
    - Output: same shape as input

Differs from torch:
<<DIFFERS>>
<<PAGE>>

Examples:
<<EXAMPLES>>
"""

_BN_DIFFERS = _doc.differs(_doc.EPS, _doc.MOMENTUM, _doc.SIZES, _doc.ERRORS, _doc.SCRIPT,
                         _doc.FX, _doc.FUSE)
_BN_PIECES = {"DIFFERS": _BN_DIFFERS, "PAGE": _doc.PAGE, "DEVICE_ARGS": _doc.DEVICE_ARGS,
              "PROCESS_GROUP": "", "MORE": "", "SIZE_ARGS": "``num_features``",
              "EPS_TORCH": "torch's BatchNorm refuses it only at a training forward"}


class _NormBase(torch_bn._NormBase):
    """torch's ``_NormBase`` (parameters, running buffers, ``reset_*``, ``extra_repr``,
    ``_load_from_state_dict``), with normcore's checks of the constructor's arguments."""

    def __init__(self, num_features: int, eps: float = EPS, momentum: float | None = MOMENTUM,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None, *, bias: bool = True) -> None:
        cls = type(self).__name__
        checks.check_positive_int(num_features, "num_features", cls)
        checks.check_eps(eps, cls)
        checks.check_momentum(momentum)
        # keywords after track_running_stats: SyncBatchNorm's signature puts process_group there
        super().__init__(int(num_features), eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype, bias=bias)


class _BatchNorm(_NormBase, torch_bn._BatchNorm):
    """BatchNorm over ``(N, C, *)``: batch statistics in training, running ones in eval (the
    public classes' docstrings, built from ``_BN``, say it in full)."""

    _shape_hint: str = "(N, C, *)"

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
                    running_mean: Tensor | None, running_var: Tensor | None) -> Tensor:
        return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                            use_batch_stats, factor, self.eps)

    def forward(self, input: Tensor) -> Tensor:
        """Normalize ``input`` (see the class's docstring)."""
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


@fill_defaults
class BatchNorm1d(_BatchNorm, torch_bn.BatchNorm1d):
    __doc__ = _doc.fill(
        _BN, NAME="BatchNorm1d",
        INPUT="a 2-D input :math:`(N, C)` or a 3-D input :math:`(N, C, L)`",
        K=r", :math:`K = N` or :math:`K = N L` values",
        SHAPE=r":math:`(N, C)` or :math:`(N, C, L)`",
        EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m, ref = nnc.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    >>> x = torch.randn(16, 4, 10)                     # (N, C, L); (N, C) works too
    >>> torch.allclose(m(x), ref(x), atol=1e-5)        # training: the batch's statistics
    True
    >>> torch.allclose(m.running_var, ref.running_var, atol=1e-6)   # the unbiased variance
    True
    >>> m.eval()(x[:1]).shape                          # eval: the running statistics
    torch.Size([1, 4, 10])""", **_BN_PIECES)

    _expected_dims = (2, 3)
    _shape_hint = "(N, C) or (N, C, L)"


@fill_defaults
class BatchNorm2d(_BatchNorm, torch_bn.BatchNorm2d):
    __doc__ = _doc.fill(
        _BN, NAME="BatchNorm2d", INPUT=r"a 4-D input :math:`(N, C, H, W)`",
        K=r", :math:`K = N H W` values", SHAPE=r":math:`(N, C, H, W)`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m, ref = nnc.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    >>> x = torch.randn(8, 3, 5, 5)
    >>> torch.allclose(m(x), ref(x), atol=1e-5)
    True
    >>> torch.nn.BatchNorm2d(3).load_state_dict(m.state_dict())   # the same names
    <All keys matched successfully>
    >>> torch.allclose(m.eval()(x), ref.eval()(x), atol=1e-5)     # eval: the buffers
    True""", **_BN_PIECES)

    _expected_dims = (4,)
    _shape_hint = "(N, C, H, W)"


@fill_defaults
class BatchNorm3d(_BatchNorm, torch_bn.BatchNorm3d):
    __doc__ = _doc.fill(
        _BN, NAME="BatchNorm3d", INPUT=r"a 5-D input :math:`(N, C, D, H, W)`",
        K=r", :math:`K = N D H W` values", SHAPE=r":math:`(N, C, D, H, W)`", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> m = nnc.BatchNorm3d(2, momentum=None)          # the cumulative average
    >>> ref = torch.nn.BatchNorm3d(2, momentum=None)
    >>> for _ in range(3):
    ...     x = torch.randn(4, 2, 3, 5, 5)
    ...     same = torch.allclose(m(x), ref(x), atol=1e-5)
    >>> same, int(m.num_batches_tracked)
    (True, 3)
    >>> torch.allclose(m.running_mean, ref.running_mean, atol=1e-6)
    True""", **_BN_PIECES)

    _expected_dims = (5,)
    _shape_hint = "(N, C, D, H, W)"


# Not a subclass of torch.nn.SyncBatchNorm: DistributedDataParallel raises "SyncBatchNorm
# layers only work with GPU modules" for every module of a CPU model that is an instance of
# torch's class (torch/nn/parallel/distributed.py, _passing_sync_batchnorm_handle), while
# this one merges the processes' moments over gloo on CPU.  It takes nothing from torch's
# class but the signature, written out below; torch's _BatchNorm gives the rest.
@fill_defaults
class SyncBatchNorm(_BatchNorm):
    __doc__ = _doc.fill(
        _BN, NAME="SyncBatchNorm", INPUT=r"an input :math:`(N, C, *)` split over processes",
        K=r""" and
process of the group (in training, :math:`K` counts the values of channel :math:`c` in all
the processes' batches)""",
        SHAPE=r":math:`(N, C, *)`", MORE=r"""

In training the processes' moments (count, mean, sum of squared deviations) are gathered
and merged exactly (Chan's formula, see :mod:`normcore.sync`), so the processes together
compute what one BatchNorm computes on the whole batch: the same outputs, gradients and
buffers.  Training needs an initialized process group
(``torch.distributed.init_process_group``); the gloo backend and CPU tensors work (torch's
``SyncBatchNorm`` refuses CPU tensors in training), and without a group normcore raises a
``RuntimeError`` where torch's falls back to per-process BatchNorm.  Eval mode, and a world
of one process, compute plain BatchNorm.

The class is a ``torch.nn.modules.batchnorm._BatchNorm`` with the arguments, parameters,
buffers and ``state_dict`` of ``torch.nn.SyncBatchNorm``, but not a subclass of it:
``torch.nn.parallel.DistributedDataParallel`` refuses any ``torch.nn.SyncBatchNorm`` in a
model on CPU, and wraps a model with this one (its parameter gradients, the local sums,
are then averaged over the processes by DDP as usual).""",
        PROCESS_GROUP="""\
    process_group (ProcessGroup or None): the processes whose batches are normalized
        together; ``None`` for the default group (``WORLD``). Default: {default}
""", EXAMPLES="""\
    >>> import normcore.nn as nnc
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    >>> model = nnc.SyncBatchNorm.convert_sync_batchnorm(model)   # the same tensors
    >>> type(model[1]).__module__, type(model[1]).__name__
    ('normcore.nn', 'SyncBatchNorm')
    >>> model.eval()(torch.randn(2, 3, 8, 8)).shape    # eval: no process group needed
    torch.Size([2, 4, 6, 6])""",
        DIFFERS=_doc.differs(_BN_DIFFERS, """\
    - Not a subclass of ``torch.nn.SyncBatchNorm`` (a torch ``_BatchNorm`` all the same), so
      that ``DistributedDataParallel`` wraps it in a model on CPU, where it refuses torch's
      class; convert with this class's ``convert_sync_batchnorm`` (torch's turns every
      BatchNorm into torch's ``SyncBatchNorm``)."""),
        **{k: v for k, v in _BN_PIECES.items() if k not in ("PROCESS_GROUP", "MORE", "DIFFERS")})

    def __init__(self, num_features: int, eps: float = EPS, momentum: float | None = MOMENTUM,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None, device: Any = None,
                 dtype: torch.dtype | None = None, *, bias: bool = True) -> None:
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

    def _group(self) -> Any:
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def forward(self, input: Tensor) -> Tensor:
        """Normalize ``input`` (see the class's docstring)."""
        if (leaf := traced_as_leaf(self, input)) is not None:
            return leaf
        if self.training:  # check before _averaging_factor counts the batch
            sync.require_process_group("SyncBatchNorm")
        return super().forward(input)

    def _batch_norm(self, input: Tensor, factor: float, use_batch_stats: bool,
                    running_mean: Tensor | None, running_var: Tensor | None) -> Tensor:
        # eval mode (buffers, or local stats without buffers) and a world of one: plain BN
        if not (self.training and use_batch_stats) or dist.get_world_size(self._group()) == 1:
            return super()._batch_norm(input, factor, use_batch_stats, running_mean, running_var)
        return sync.SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                                running_var, factor, self.eps, self._group())

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_group: Any = None) -> torch.nn.Module:
        """Replace every BatchNorm*d (``torch.nn`` or ``normcore.nn``) in ``module`` by a
        :class:`SyncBatchNorm`, as ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` does.

        The new module takes over the *same* parameter and buffer tensors (so an optimizer
        built before the conversion still holds the right parameters, and ``requires_grad``
        carries over), and the training flag.  A BatchNorm passed directly is returned as a
        new module; otherwise ``module`` is changed in place and returned.

        ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` converts normcore's BatchNorms too
        (they are torch's ``_BatchNorm``), but into torch's ``SyncBatchNorm`` (its code names
        that class): normcore's math is gone, and torch's module refuses CPU tensors in
        training under a process group, as ``DistributedDataParallel`` refuses it in a model
        on CPU.
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
