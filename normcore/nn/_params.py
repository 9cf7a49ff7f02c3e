"""Parameters shared by the norm modules: gamma and beta registered as torch's norms do."""
from __future__ import annotations

from typing import Any

import torch
from torch.nn import Module, Parameter, init


def affine_parameters(module: Module, shape: tuple[int, ...], affine: bool, bias: bool,
                      factory: dict[str, Any]) -> None:
    """Register ``weight`` and ``bias`` of ``shape`` (or None), as torch's norms do."""
    if affine:
        module.weight = Parameter(torch.empty(shape, **factory))
        if bias:
            module.bias = Parameter(torch.empty(shape, **factory))
        else:
            module.register_parameter("bias", None)
    else:
        module.register_parameter("weight", None)
        module.register_parameter("bias", None)


def reset_affine(module: Module) -> None:
    """gamma = 1, beta = 0: the norm starts as a plain standardization."""
    weight, bias = module.weight, module.bias     # a Parameter or None each
    if isinstance(weight, torch.Tensor):
        init.ones_(weight)
    if isinstance(bias, torch.Tensor):
        init.zeros_(bias)
