"""normcore's BatchNorms in torch's eager-mode fusion (``torch.ao.quantization.fuse_modules``).

``fuse_modules`` looks its fuser up by the exact types of the layers (``(Conv2d,
BatchNorm2d)``), so a subclass is not found.  For every pattern of torch's table with a torch
BatchNorm, the same pattern with normcore's BatchNorm is added, whose fuser hands torch's
fuser a torch-class copy of the BN (sharing its parameters and buffers): in eval the BN is
folded into the conv (``fuse_conv_bn_eval`` reads only ``running_mean``, ``running_var``,
``eps``, ``weight`` and ``bias``); in QAT the fused module holds a torch BatchNorm.  Only
keys with normcore types are added, so nothing torch fuses changes.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from torch.nn import Module

__all__ = ["register_fusions"]


def torch_copy(module: Module, torch_cls: type) -> Module:
    """A ``torch_cls`` object that shares ``module``'s parameters, buffers and children."""
    out = copy.copy(module)   # a new object with a shallow copy of the instance dict
    for key in ("_parameters", "_buffers", "_modules"):
        out.__dict__[key] = dict(module.__dict__[key])
    out.__class__ = torch_cls
    return out


Fuser = Callable[..., Any]


def _with_torch_norms(fuser: Fuser, to_torch: dict[type, type]) -> Fuser:
    def fuse(is_qat: bool, *modules: Module) -> Any:
        return fuser(is_qat, *(torch_copy(m, to_torch[type(m)]) if type(m) in to_torch else m
                               for m in modules))
    fuse.__name__ = getattr(fuser, "__name__", "fuse")
    return fuse


def register_fusions(to_torch: dict[type, type]) -> int:
    """Add normcore's twins of torch's BN fusion patterns; return how many were added (0 if
    this torch has no such table)."""
    try:
        from torch.ao.quantization import fuser_method_mappings as mappings
        table = mappings._DEFAULT_OP_LIST_TO_FUSER_METHOD
    except (ImportError, AttributeError):
        return 0
    to_normcore = {t: n for n, t in to_torch.items()}
    added = 0
    for pattern, fuser in list(table.items()):
        if any(k in to_normcore for k in pattern):
            twin = tuple(to_normcore.get(k, k) for k in pattern)
            if twin not in table:
                table[twin] = _with_torch_norms(fuser, to_torch)
                added += 1
    return added
