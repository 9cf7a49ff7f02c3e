"""Drop-in modules: the bookkeeping around :mod:`normcore.functional`.

The math lives in :mod:`normcore.functional`; a module only holds parameters and buffers and
decides, from ``self.training`` and ``track_running_stats``, which statistics to use.  The
constructor arguments, defaults, parameter and buffer names (``weight``, ``bias``,
``running_mean``, ``running_var``, ``num_batches_tracked``) and ``extra_repr`` are those of
``torch.nn``, so a ``state_dict`` moves between ``torch.nn.BatchNorm2d`` and
``normcore.nn.BatchNorm2d`` in both directions.

Train or eval is read from ``module.training`` (``model.train()`` / ``model.eval()``), never
from whether gradients are enabled.
"""
from __future__ import annotations

import numbers
import warnings

import torch
from torch import Tensor
from torch.nn import Module, Parameter, init

from . import axes
from . import functional as F
from . import stats

__all__ = [
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "InstanceNorm1d",
    "InstanceNorm2d", "InstanceNorm3d", "GroupNorm", "WSConv2d", "SyncBatchNorm", "RMSNorm",
]


def _check_positive_int(value, name: str, cls: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{cls}: {name} must be a positive int, got {value!r}")


def _affine_parameters(module: Module, shape, affine: bool, bias: bool, factory) -> None:
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


def _reset_affine(module: Module) -> None:
    """gamma = 1, beta = 0: the norm starts as a plain standardization."""
    if module.weight is not None:
        init.ones_(module.weight)
    if module.bias is not None:
        init.zeros_(module.bias)


class _NormBase(Module):
    """Parameters and running buffers shared by BatchNorm and InstanceNorm (as in torch)."""

    _version = 2

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None,
                 *, bias: bool = True):
        super().__init__()
        cls = type(self).__name__
        _check_positive_int(num_features, "num_features", cls)
        F.check_eps(eps, cls)
        stats.check_momentum(momentum)
        factory = {"device": device, "dtype": dtype}
        self.num_features = int(num_features)
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        _affine_parameters(self, num_features, affine, bias, factory)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **factory))
            self.register_buffer("running_var", torch.ones(num_features, **factory))
            self.register_buffer("num_batches_tracked",
                                 torch.tensor(0, dtype=torch.long, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        _reset_affine(self)

    def _check_input_dim(self, input: Tensor) -> None:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return ("{num_features}, eps={eps}, momentum={momentum}, affine={affine}, "
                "bias={use_bias}, track_running_stats={track_running_stats}"
                .format(**self.__dict__, use_bias=self.bias is not None))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # state dicts saved before num_batches_tracked existed (version < 2) lack it
        version = local_metadata.get("version", None)
        if (version is None or version < 2) and self.track_running_stats:
            key = prefix + "num_batches_tracked"
            if key not in state_dict:
                state_dict[key] = (self.num_batches_tracked if self.num_batches_tracked is not None
                                   and self.num_batches_tracked.device != torch.device("meta")
                                   else torch.tensor(0, dtype=torch.long))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)


# ---------------------------------------------------------------------------------------
# BatchNorm
# ---------------------------------------------------------------------------------------
class _BatchNorm(_NormBase):
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
            raise ValueError(
                f"{type(self).__name__}({self.num_features}) got an input with "
                f"{input.shape[1]} channels at dim 1 (shape {tuple(input.shape)})")

    def _averaging_factor(self) -> float:
        """Count this batch and return the weight of its statistics in the running ones."""
        if self.momentum is None:
            factor = 0.0
        else:
            factor = self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = stats.averaging_factor(self.momentum, int(self.num_batches_tracked))
        return factor

    def _batch_norm(self, input: Tensor, factor: float, use_batch_stats: bool,
                    running_mean, running_var) -> Tensor:
        return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                            use_batch_stats, factor, self.eps)

    def forward(self, input: Tensor) -> Tensor:
        F.check_float(input, "input", type(self).__name__)
        self._check_input_dim(input)
        factor = self._averaging_factor()
        # batch statistics in training, and in eval when there are no buffers
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # buffers are passed when they are to be read (eval) or updated (train, tracking)
        pass_buffers = not self.training or self.track_running_stats
        return self._batch_norm(input, factor, use_batch_stats,
                                self.running_mean if pass_buffers else None,
                                self.running_var if pass_buffers else None)


class BatchNorm1d(_BatchNorm):
    """BatchNorm over ``(N, C)`` or ``(N, C, L)``: one mean/variance per channel."""

    _expected_dims = (2, 3)
    _shape_hint = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """BatchNorm over ``(N, C, H, W)``: one mean/variance per channel over N, H, W."""

    _expected_dims = (4,)
    _shape_hint = "(N, C, H, W)"


class BatchNorm3d(_BatchNorm):
    """BatchNorm over ``(N, C, D, H, W)``."""

    _expected_dims = (5,)
    _shape_hint = "(N, C, D, H, W)"


# ---------------------------------------------------------------------------------------
# InstanceNorm
# ---------------------------------------------------------------------------------------
class _InstanceNorm(_NormBase):
    """InstanceNorm: statistics per sample and channel over the spatial dims.

    Defaults differ from BatchNorm, as in torch: ``affine=False, track_running_stats=False``.
    An unbatched input ``(C, *spatial)`` is accepted.  As in torch, ``momentum=None`` does
    not mean a cumulative average here: the factor passed on is 0, so the buffers stay put,
    and ``num_batches_tracked`` is never incremented.
    """

    _no_batch_dim = 0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device=None, dtype=None,
                 *, bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype,
                         bias=bias)

    def _check_input_dim(self, input: Tensor) -> None:
        ok = (self._no_batch_dim, self._no_batch_dim + 1)
        if input.dim() not in ok:
            raise ValueError(
                f"expected {ok[0]}D or {ok[1]}D input (got {input.dim()}D input); "
                f"{type(self).__name__} takes {self._shape_hint}")

    def forward(self, input: Tensor) -> Tensor:
        cls = type(self).__name__
        F.check_float(input, "input", cls)
        self._check_input_dim(input)
        feature_dim = input.dim() - self._no_batch_dim
        if input.shape[feature_dim] != self.num_features:
            if self.affine or self.track_running_stats:
                raise ValueError(
                    f"expected input's size at dim={feature_dim} to match num_features "
                    f"({self.num_features}), but got: {input.shape[feature_dim]}.")
            warnings.warn(
                f"input's size at dim={feature_dim} does not match num_features "
                f"({self.num_features}); with affine=False and track_running_stats=False "
                f"num_features is not used", stacklevel=2)
        unbatched = input.dim() == self._no_batch_dim
        x = input.unsqueeze(0) if unbatched else input
        y = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats,
                            self.momentum if self.momentum is not None else 0.0, self.eps)
        return y.squeeze(0) if unbatched else y


class InstanceNorm1d(_InstanceNorm):
    """InstanceNorm over ``(N, C, L)`` or ``(C, L)``."""

    _no_batch_dim = 2
    _shape_hint = "(N, C, L) or (C, L)"


class InstanceNorm2d(_InstanceNorm):
    """InstanceNorm over ``(N, C, H, W)`` or ``(C, H, W)``."""

    _no_batch_dim = 3
    _shape_hint = "(N, C, H, W) or (C, H, W)"


class InstanceNorm3d(_InstanceNorm):
    """InstanceNorm over ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""

    _no_batch_dim = 4
    _shape_hint = "(N, C, D, H, W) or (C, D, H, W)"


# ---------------------------------------------------------------------------------------
# LayerNorm, GroupNorm
# ---------------------------------------------------------------------------------------
class LayerNorm(Module):
    """LayerNorm over the trailing ``normalized_shape`` dims; gamma/beta of that shape."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        F.check_eps(eps, "LayerNorm")
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        if not self.normalized_shape or any(s <= 0 for s in self.normalized_shape):
            raise ValueError(f"LayerNorm: normalized_shape must be non-empty and positive, "
                             f"got {normalized_shape!r}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        _affine_parameters(self, self.normalized_shape, elementwise_affine, bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return ("{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}, "
                "bias={use_bias}".format(**self.__dict__, use_bias=self.bias is not None))


class GroupNorm(Module):
    """GroupNorm: ``num_groups`` groups of contiguous channels; gamma/beta per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        _check_positive_int(num_groups, "num_groups", "GroupNorm")
        _check_positive_int(num_channels, "num_channels", "GroupNorm")
        if num_channels % num_groups != 0:
            raise ValueError(
                f"num_channels must be divisible by num_groups: num_channels={num_channels}, "
                f"num_groups={num_groups}; choose num_groups among "
                f"{axes.divisors(num_channels)}")
        F.check_eps(eps, "GroupNorm")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        factory = {"device": device, "dtype": dtype}
        _affine_parameters(self, num_channels, affine, bias, factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return ("{num_groups}, {num_channels}, eps={eps}, affine={affine}, "
                "bias={use_bias}".format(**self.__dict__, use_bias=self.bias is not None))


# ---------------------------------------------------------------------------------------
# Weight-standardized convolution
# ---------------------------------------------------------------------------------------
class WSConv2d(torch.nn.Conv2d):
    """A ``Conv2d`` whose weight is standardized (per output channel) in every forward.

    Same arguments as ``torch.nn.Conv2d`` plus ``ws_eps`` (``None``: the convention's
    default) and ``convention`` (``"original"``, ``"bit"`` or ``"timm"``; see
    :func:`normcore.functional.weight_standardize`).  The stored ``weight`` is the raw one;
    the standardized weight is recomputed each call, so gradients flow through it.
    """

    def __init__(self, *args, ws_eps: float | None = None, convention: str = "original", **kwargs):
        super().__init__(*args, **kwargs)
        if convention not in F.WS_CONVENTIONS:
            raise ValueError(f"WSConv2d: unknown convention {convention!r}; "
                             f"choose one of {sorted(F.WS_CONVENTIONS)}")
        if ws_eps is not None:
            F.check_eps(ws_eps, "WSConv2d")
        self.ws_eps = ws_eps
        self.convention = convention

    def standardized_weight(self) -> Tensor:
        return F.weight_standardize(self.weight, self.ws_eps, convention=self.convention)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, self.standardized_weight(), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", convention={self.convention!r}, ws_eps={self.ws_eps}"


# ---------------------------------------------------------------------------------------
# RMSNorm: BEGIN RMSNorm block
# ---------------------------------------------------------------------------------------
class RMSNorm(Module):
    r"""LayerNorm without centering and without beta (Zhang & Sennrich 2019).

    .. math:: y = \gamma \, x / \sqrt{\operatorname{mean}_{S}(x^2) + \epsilon}

    Args:
        normalized_shape: the trailing dims that form :math:`S` (an int, a list or a
            ``torch.Size``).
        eps: added to the mean square; ``None`` (the default, as in ``torch.nn.RMSNorm``)
            is the machine epsilon of the compute dtype: ``finfo(float32).eps`` for
            float32, float16 and bfloat16 inputs, ``finfo(float64).eps`` for float64.
        elementwise_affine: learn ``weight`` (gamma), one per element of
            ``normalized_shape``, initialized to ones.
    Shape:
        input ``(*, *normalized_shape)``; output the same.

    The constructor, the parameter name ``weight``, ``extra_repr`` and the ``state_dict``
    are those of ``torch.nn.RMSNorm``, so a state_dict moves between the two both ways.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        if eps is not None:
            F.check_eps(eps, "RMSNorm")
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        if not self.normalized_shape or any(s <= 0 for s in self.normalized_shape):
            raise ValueError(f"RMSNorm: normalized_shape must be non-empty and positive, "
                             f"got {normalized_shape!r}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(torch.empty(self.normalized_shape, device=device,
                                                dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return ("{normalized_shape}, eps={eps}, "
                "elementwise_affine={elementwise_affine}".format(**self.__dict__))
# ---------------------------------------------------------------------------------------
# END RMSNorm block
# ---------------------------------------------------------------------------------------


from .distributed import SyncBatchNorm  # noqa: E402
