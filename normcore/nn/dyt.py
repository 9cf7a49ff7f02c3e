r"""Dynamic Tanh (DyT), the drop-in for LayerNorm of "Transformers without Normalization"
(Zhu, Chen, He, LeCun & Liu 2025), and :func:`convert_ln_to_dyt`.

Matched to the official code (``dynamic_tanh.py`` of github.com/jiachenzhu/DyT):

* the parameters and their names, shapes and initial values: ``alpha`` of shape ``(1,)``
  filled with ``alpha_init_value`` (the paper's default, :data:`normcore.defaults.DYT_ALPHA`),
  ``weight`` (gamma, ones) and ``bias`` (beta, zeros) of shape ``normalized_shape``,
  registered in that order, so a ``state_dict`` moves between the official
  ``DynamicTanh`` and :class:`DyT` in both directions;
* the attributes ``normalized_shape``, ``alpha_init_value``, ``channels_last``, and the
  forward: ``tanh(alpha * x)``, then ``* weight + bias`` over the last dims
  (``channels_last=True``) or per channel of dim 1 (``channels_last=False``, the official
  ``weight[:, None, None]`` for ``(N, C, H, W)``);
* :func:`convert_ln_to_dyt` replaces every LayerNorm by a fresh DyT of the same
  ``normalized_shape`` (gamma 1, beta 0: the LayerNorm's trained gamma and beta are not
  copied, as in the official function), ``channels_last=False`` for timm's ``LayerNorm2d``.

What differs:

* the options after ``normalized_shape`` are keyword only.  The official signature is
  ``DynamicTanh(normalized_shape, channels_last, alpha_init_value=0.5)`` and
  ``torch.nn.LayerNorm``'s is ``(normalized_shape, eps, elementwise_affine, ...)``: a
  positional second argument would mean different things in each, so here it is an error
  rather than a silent misreading.  ``channels_last`` defaults to True (the official
  argument is required).
* LayerNorm's conventions are added: ``elementwise_affine=False`` (no gamma, no beta, as the
  official DiT variant has it) and ``bias=False`` (gamma only, as the official LLaMA
  variant), ``device`` and ``dtype``, and ``reset_parameters``.  :func:`convert_ln_to_dyt`
  carries ``elementwise_affine``, ``bias``, the device, dtype and train/eval mode of each
  LayerNorm over (the official function makes float32 parameters on the default device
  with gamma and beta always), and also converts :class:`normcore.nn.LayerNorm`.
* ``normalized_shape`` is kept as a tuple (as torch's LayerNorm does), the input's trailing
  dims (or channel count) are checked against it, and ``channels_last=False`` takes any
  ``(N, C, *spatial)`` input, not only 4-D ones; the channel is always dim 1 (the official
  indexing also broadcasts over an unbatched ``(C, H, W)``; here that input is read as
  ``(N, C, W)`` and rejected unless ``H == C``).
* float16 / bfloat16 inputs are computed in float32 and rounded once (the official code
  rounds after each of its four ops), and the output has the input's dtype.
* ``extra_repr`` follows ``torch.nn.LayerNorm``'s (``(768,), alpha_init_value=0.5, ...``).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module, Parameter

from .. import _checks as checks
from .. import functional as F
from ..defaults import DYT_ALPHA, fill_defaults
from ._fx import traced_as_leaf
from ._params import affine_parameters, reset_affine
from .normalization import LayerNorm

__all__ = ["DyT", "convert_ln_to_dyt"]


@fill_defaults
class DyT(Module):
    r"""Dynamic Tanh: an element-wise layer in place of LayerNorm (Zhu, Chen, He, LeCun & Liu
    2025, "Transformers without Normalization").

    No set of elements shares statistics: each element is squashed on its own,

    .. math::

        y_i = \gamma_j \tanh(\alpha_{\mathrm{DyT}}\, x_i) + \beta_j

    with one learned scalar :math:`\alpha_{\mathrm{DyT}}` (``alpha``, shape ``(1,)``) and
    :math:`\gamma, \beta` (``weight``, ``bias``, 1 and 0 at the start) of the shape
    ``normalized_shape``, :math:`j` being :math:`x_i`'s position within it.  With
    ``channels_last=False``, :math:`\gamma, \beta` are per channel of dim 1 of an
    :math:`(N, C, *)` input (ConvNeXt's layout, timm's ``LayerNorm2d``).  There are no
    statistics, so train and eval mode compute the same thing.  The parameter names, shapes,
    initial values and ``state_dict`` are those of the paper's code (``DynamicTanh``).
    float16 and bfloat16 inputs are computed in float32 and rounded once.

    Args:
        normalized_shape (int or sequence of int): the trailing dims that :math:`\gamma`
            and :math:`\beta` cover, as in ``torch.nn.LayerNorm``; ``(C,)`` with
            ``channels_last=False``.
        alpha_init_value (float): :math:`\alpha_{\mathrm{DyT}}` at the start (the paper's
            default; its language models use other values per layer). Default: {default}
        channels_last (bool): ``True``: :math:`\gamma, \beta` over the last dims.
            ``False``: one per channel of dim 1. Default: {default}
        elementwise_affine (bool): learn :math:`\gamma` (``weight``) and :math:`\beta`
            (``bias``); without, both are ``None``. Default: {default}
        bias (bool): with ``elementwise_affine``, also learn :math:`\beta`.
            Default: {default}
        device (torch.device or None): where the parameters are made. Default: {default}
        dtype (torch.dtype or None): their dtype. Default: {default}

    The arguments after ``normalized_shape`` are keyword only: the paper's signature is
    ``DynamicTanh(normalized_shape, channels_last, alpha_init_value)`` and
    ``torch.nn.LayerNorm``'s is ``(normalized_shape, eps, ...)``, so a second positional
    argument would mean different things in each.

    Shape:
        - Input: :math:`(*, \text{normalized\_shape}[0], \ldots)` whose last dims are
          ``normalized_shape``; with ``channels_last=False``, :math:`(N, C, *)`
        - Output: same shape as input

    Differs from torch:
        ``torch.nn`` has no DyT; as normcore's other modules, it is kept whole by
        ``torch.fx`` and refused by ``torch.jit.script`` (with a ``TypeError`` naming
        ``torch.compile``, ``torch.export.export`` and ``torch.jit.trace``).  Its
        differences from the paper's code are listed in :mod:`normcore.nn.dyt`.

        See the book's page "Where normcore differs from PyTorch, on purpose".

    Examples:
        >>> import normcore.nn as nnc
        >>> m = nnc.DyT(768)                            # where a LayerNorm(768) was
        >>> x = torch.randn(2, 10, 768)
        >>> torch.allclose(m(x), torch.tanh(m.alpha * x))   # gamma 1, beta 0 at the start
        True
        >>> nnc.DyT(64, channels_last=False)(torch.randn(2, 64, 7, 7)).shape
        torch.Size([2, 64, 7, 7])
    """

    # set by affine_parameters: Parameters, or None without elementwise_affine / bias
    weight: Tensor | None
    bias: Tensor | None

    def __init__(self, normalized_shape: int | Sequence[int], *,
                 alpha_init_value: float = DYT_ALPHA, channels_last: bool = True,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.normalized_shape = checks.normalized_shape_tuple(normalized_shape, "DyT")
        self.alpha_init_value = checks.check_alpha_init(alpha_init_value, "DyT")
        if not isinstance(channels_last, bool):
            raise TypeError(f"DyT: channels_last must be True or False, got {channels_last!r}")
        if not channels_last and len(self.normalized_shape) != 1:
            raise ValueError(
                f"DyT: with channels_last=False gamma and beta are per channel, so "
                f"normalized_shape must be (C,), got {self.normalized_shape}")
        self.channels_last = channels_last
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        self.alpha = Parameter(torch.empty(1, **factory))
        affine_parameters(self, self.normalized_shape, elementwise_affine, bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.alpha.fill_(self.alpha_init_value)
        reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        """``weight * tanh(alpha * input) + bias`` (see the class's docstring)."""
        if (leaf := traced_as_leaf(self, input)) is not None:   # a leaf under fx, as a norm is
            return leaf
        return F.dyt(input, self.alpha, self.weight, self.bias, channels_last=self.channels_last,
                     normalized_shape=self.normalized_shape)

    def extra_repr(self) -> str:
        return ("{normalized_shape}, alpha_init_value={alpha_init_value}, "
                "channels_last={channels_last}, elementwise_affine={elementwise_affine}, "
                "bias={use_bias}".format(**self.__dict__, use_bias=self.bias is not None))


def _is_channels_first(module: Module) -> bool:
    """timm's ``LayerNorm2d`` normalizes over dim 1 of ``(N, C, H, W)``; timm is not a
    dependency, so it is looked up only if the model's code has imported it already."""
    timm_layers = sys.modules.get("timm.layers")
    cls = getattr(timm_layers, "LayerNorm2d", None)
    return cls is not None and isinstance(module, cls)


def _turn_off_fused_path(module: Module) -> None:
    """``torch.nn.TransformerEncoderLayer`` in eval mode (batch first, no gradient) runs a
    fused kernel that computes LayerNorm from ``norm1.eps`` and ``norm1.weight`` instead of
    calling its norms; with DyT there it would fail (DyT has no ``eps``).  A layer whose
    ``activation_relu_or_gelu`` is 0 takes its ordinary path, which calls ``norm1`` and
    ``norm2``; so does a ``TransformerEncoder`` without nested tensors."""
    if isinstance(module, torch.nn.TransformerEncoderLayer):
        if isinstance(module.norm1, DyT) or isinstance(module.norm2, DyT):
            module.activation_relu_or_gelu = 0
    elif isinstance(module, torch.nn.TransformerEncoder) and \
            any(isinstance(m, DyT) for m in module.modules()):
        module.use_nested_tensor = False


@fill_defaults
def convert_ln_to_dyt(module: Module, alpha_init_value: float = DYT_ALPHA) -> Module:
    r"""Replace every LayerNorm of ``module`` by a fresh :class:`DyT`, in place, as the
    paper's ``convert_ln_to_dyt`` does.

    ``torch.nn.LayerNorm``, its subclasses and :class:`normcore.nn.LayerNorm` are replaced;
    each DyT takes the LayerNorm's ``normalized_shape``, ``elementwise_affine``, ``bias``,
    device, dtype and train/eval mode, and timm's ``LayerNorm2d`` becomes a
    ``channels_last=False`` DyT.  :math:`\gamma` and :math:`\beta` start at 1 and 0 (the
    LayerNorm's are not copied: the conversion is meant for a model about to be trained).
    A ``torch.nn.TransformerEncoderLayer`` whose norms became DyT is set to skip its fused
    inference kernel, which would compute LayerNorm.

    Args:
        module (nn.Module): the model (or a single LayerNorm) to convert.
        alpha_init_value (float): :math:`\alpha_{\mathrm{DyT}}` at the start of every new
            DyT. Default: {default}

    Returns:
        nn.Module: ``module``, converted (or the new DyT if ``module`` is a LayerNorm).

    Raises:
        ValueError: ``alpha_init_value`` is not a finite number.

    Examples:
        >>> import normcore.nn as nnc
        >>> layer = torch.nn.TransformerEncoderLayer(16, 2, batch_first=True)
        >>> layer = nnc.convert_ln_to_dyt(layer)
        >>> type(layer.norm1).__name__, layer.norm1.normalized_shape
        ('DyT', (16,))
        >>> layer.eval()(torch.randn(2, 5, 16)).shape
        torch.Size([2, 5, 16])
    """
    checks.check_alpha_init(alpha_init_value, "convert_ln_to_dyt")
    if isinstance(module, (torch.nn.LayerNorm, LayerNorm)):
        p = module.weight
        new = DyT(module.normalized_shape, alpha_init_value=alpha_init_value,
                  channels_last=not _is_channels_first(module),
                  elementwise_affine=module.elementwise_affine,
                  bias=module.bias is not None, device=None if p is None else p.device,
                  dtype=None if p is None else p.dtype)
        return new.train(module.training)
    for name, child in module.named_children():
        converted = convert_ln_to_dyt(child, alpha_init_value)
        if converted is not child:
            setattr(module, name, converted)
    _turn_off_fused_path(module)
    return module
