"""Drop-in modules: the bookkeeping around :mod:`normcore.functional`.

The math lives in :mod:`normcore.functional`; a module only holds parameters and buffers and
decides, from ``self.training`` and ``track_running_stats``, which statistics to use.  The
constructor arguments, defaults, parameter and buffer names (``weight``, ``bias``,
``running_mean``, ``running_var``, ``num_batches_tracked``) and ``extra_repr`` are those of
``torch.nn``, so a ``state_dict`` moves between ``torch.nn.BatchNorm2d`` and
``normcore.nn.BatchNorm2d`` in both directions.

Train or eval is read from ``module.training`` (``model.train()`` / ``model.eval()``), never
from whether gradients are enabled.

One module per family, as in ``torch.nn.modules``: :mod:`~normcore.nn.batchnorm`
(BatchNorm1d/2d/3d, SyncBatchNorm), :mod:`~normcore.nn.instancenorm`,
:mod:`~normcore.nn.normalization` (LayerNorm, RMSNorm, GroupNorm), :mod:`~normcore.nn.conv`
(WSConv1d/2d/3d, ScaledStdConv2d, convert_to_ws), and :mod:`~normcore.nn.dyt` (DyT, the
element-wise stand-in for LayerNorm of Zhu et al. 2025, and convert_ln_to_dyt; its
parameter names are those of the paper's code, as torch.nn has no DyT).

Each norm module subclasses the torch class it replaces (``normcore.nn.BatchNorm2d`` is a
``torch.nn.BatchNorm2d``), so torch's utilities treat it as theirs: ``isinstance`` checks,
``convert_sync_batchnorm``, ``fuse_conv_bn_eval``, ``torch.ao.quantization.fuse_modules``
(normcore's BN patterns are added to torch's table, see :mod:`~normcore.nn._fuse`), and
``torch.fx`` (a ``call_module`` leaf, see :mod:`~normcore.nn._fx`).  One exception:
``SyncBatchNorm`` is torch's ``_BatchNorm`` but not a ``torch.nn.SyncBatchNorm``, whose
instances ``DistributedDataParallel`` refuses in a model on CPU (normcore's trains there).
:func:`~normcore.nn.convert.from_torch` / :func:`~normcore.nn.convert.to_torch` swap a
model's norm layers in place, in either direction.

Compilers and transforms: ``torch.compile`` (``fullgraph=True``, every backend),
``torch.export.export`` (with a dynamic batch dim), ``torch.jit.trace`` (at any batch
size) and ``torch.func`` (``vmap``, ``grad``, ``jacrev``, through the hand-derived
backward) work on every module here, in train and eval mode.  ``torch.jit.script`` does
not, and will not: TorchScript, in maintenance mode, compiles a subset of Python that has
no ``torch.autograd.Function`` and no dataclass, and the package would have to be written
again in that subset.  So scripting a model that holds a normcore module raises a
TypeError that names the supported ways (``__prepare_scriptable__``, which
``torch.jit.script`` calls on every submodule before it compiles anything).
"""
from __future__ import annotations

from typing import NoReturn

from torch.nn import Module

from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm
from .batchnorm import _BatchNorm, _NormBase  # noqa: F401  (the base classes, as in torch.nn)
from . import _fuse
from .conv import ScaledStdConv2d, WSConv1d, WSConv2d, WSConv3d, convert_to_ws
from .dyt import DyT, convert_ln_to_dyt
from .instancenorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from .normalization import GroupNorm, LayerNorm, RMSNorm
from . import convert
from .convert import Swap, from_torch, to_torch

__all__ = [
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "RMSNorm", "InstanceNorm1d",
    "InstanceNorm2d", "InstanceNorm3d", "GroupNorm", "WSConv2d", "SyncBatchNorm",
    "ScaledStdConv2d", "WSConv1d", "WSConv3d", "convert_to_ws", "DyT", "convert_ln_to_dyt",
    "from_torch", "to_torch", "Swap",
]


def _refuse_script(self: Module) -> NoReturn:
    raise TypeError(
        f"torch.jit.script cannot compile normcore.nn.{type(self).__name__}: TorchScript "
        f"(in maintenance mode) has no torch.autograd.Function and no dataclass, which "
        f"normcore is built on. Use torch.compile(model) or torch.export.export(model, args), "
        f"the supported ways to compile and export, or torch.jit.trace(model, example) if "
        f"you need a TorchScript module (it works at any batch size)")


# the public classes answer to the public name (as in reprs, errors and pickles), and
# refuse torch.jit.script with the message above
for _cls in (BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm, WSConv2d, InstanceNorm1d,
             InstanceNorm2d, InstanceNorm3d, GroupNorm, LayerNorm, RMSNorm, ScaledStdConv2d,
             WSConv1d, WSConv3d, DyT):
    _cls.__module__ = __name__
    # a hook torch.jit.script looks up by name; Module declares no such attribute for mypy
    setattr(_cls, "__prepare_scriptable__", _refuse_script)  # noqa: B010
del _cls

# eager-mode fusion (torch.ao.quantization.fuse_modules) finds normcore's BatchNorms too
_fuse.register_fusions(convert.NORMCORE_TO_TORCH)
