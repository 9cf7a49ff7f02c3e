"""Swap a model's norm layers between ``torch.nn`` and ``normcore.nn``, in place.

``from_torch(model)`` turns every torch norm layer (BatchNorm1d/2d/3d, SyncBatchNorm,
InstanceNorm1d/2d/3d, LayerNorm, RMSNorm, GroupNorm) into normcore's, ``to_torch(model)``
does the reverse.  The swap changes the *class* of each layer object (``m.__class__``) and
nothing else: normcore's classes subclass torch's (``SyncBatchNorm`` torch's ``_BatchNorm``,
with the attributes of ``torch.nn.SyncBatchNorm``) and add no attribute, so the object keeps
its parameters (the same ``Parameter`` objects: an optimizer built before still holds them),
buffers, hooks, training flag, device, dtype and ``requires_grad``, and its parent needs no
new child.

A *subclass* of a torch norm (timm's ``LayerNorm2d``, which permutes NCHW to NHWC around
``F.layer_norm``; ``BatchNormAct2d`` and ``GroupNormAct``, a norm followed by drop and
activation) keeps its own forward: its object gets a twin class, made once per class, that
inherits from (the user's class, normcore's class).  If the user's class keeps torch's
forward, the twin runs normcore's.  If it overrides forward, the twin runs that forward under
a ``TorchFunctionMode`` that hands the calls to ``torch.nn.functional.batch_norm`` /
``instance_norm`` / ``layer_norm`` / ``group_norm`` / ``rms_norm`` to normcore's functions
of the same signature, so the permutes, drops and activations are the user's and the
normalization is normcore's.  A forward that calls none of them (a fused kernel, say) is
reported by a warning on its first call: its output is still torch's math.  A layer with a
``torch.nn.utils.parametrize`` parametrization (whose class is ``Parametrized<class>``) gets
``Parametrized<new class>``, so the parametrization stays and can still be removed.

timm's convolutions with standardized weights (``StdConv2d``, ``ScaledStdConv2d`` and their
``Same`` variants), which standardize each filter with ``F.batch_norm`` in their forward, get
a twin of (normcore's :class:`~normcore.nn.WSConv2d` or
:class:`~normcore.nn.ScaledStdConv2d`, timm's class): normcore's forward, on the attributes
of timm's layer, which compute the same weights (the ``"timm"`` convention).

Layers from_torch cannot swap are left as they are and listed, both in a warning (a silent
skip is how a model ends up half converted) and in the report that ``report=True`` returns:
modules whose class name contains ``Norm``, that do not subclass a torch norm and are no
block of layers (torchvision's ``FrozenBatchNorm2d``, a hand-written ``RmsNorm``; not timm's
``NormFreeBlock``, whose layers the walk reaches), and layers whose settings torch accepts and
normcore's layers refuse (``eps <= 0``, ``momentum`` outside [0, 1]), which stay torch's.
``to_torch`` lists normcore modules without a torch twin (WSConv*d, ScaledStdConv2d, DyT);
a layer from_torch swapped gets its own class back.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Literal, NamedTuple, TypeVar, overload

import torch
from torch.nn import Module
from torch.nn import functional as TF
from torch.nn.utils import parametrize
from torch.overrides import TorchFunctionMode

from .. import _checks as checks
from .. import functional as F
from ..defaults import fill_defaults
from . import batchnorm, conv, instancenorm, normalization
from ._fx import traced_as_leaf

__all__ = ["from_torch", "to_torch", "Swap"]

# torch class -> normcore class (normcore's subclasses torch's)
TORCH_TO_NORMCORE: dict[type[Module], type[Module]] = {
    torch.nn.BatchNorm1d: batchnorm.BatchNorm1d,
    torch.nn.BatchNorm2d: batchnorm.BatchNorm2d,
    torch.nn.BatchNorm3d: batchnorm.BatchNorm3d,
    torch.nn.SyncBatchNorm: batchnorm.SyncBatchNorm,
    torch.nn.InstanceNorm1d: instancenorm.InstanceNorm1d,
    torch.nn.InstanceNorm2d: instancenorm.InstanceNorm2d,
    torch.nn.InstanceNorm3d: instancenorm.InstanceNorm3d,
    torch.nn.LayerNorm: normalization.LayerNorm,
    torch.nn.RMSNorm: normalization.RMSNorm,
    torch.nn.GroupNorm: normalization.GroupNorm,
}
NORMCORE_TO_TORCH: dict[type[Module], type[Module]] = {n: t for t, n in TORCH_TO_NORMCORE.items()}

# torch.nn.functional's norms -> normcore.functional's (same signatures)
FUNCTIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    TF.batch_norm: F.batch_norm, TF.instance_norm: F.instance_norm,
    TF.layer_norm: F.layer_norm, TF.group_norm: F.group_norm, TF.rms_norm: F.rms_norm,
}


# timm's convolutions with standardized weights (timm.layers.std_conv), by class name, and
# normcore's class that computes the same.  timm's forward standardizes each filter with
# F.batch_norm(weight.reshape(1, C_out, -1), training=True, eps=self.eps): the biased
# variance, eps under the root, i.e. the "timm" convention of WS_CONVENTIONS; the scaled ones
# pass weight=gain * scale to it, as normcore's ScaledStdConv2d multiplies.
TIMM_WS: dict[str, type[Module]] = {
    "StdConv2d": conv.WSConv2d, "StdConv2dSame": conv.WSConv2d,
    "ScaledStdConv2d": conv.ScaledStdConv2d, "ScaledStdConv2dSame": conv.ScaledStdConv2d,
}


class Swap(NamedTuple):
    """What :func:`from_torch` or :func:`to_torch` did, returned with ``report=True``.

    Attributes:
        swapped (list of tuple): ``(path, old class, new class)`` per layer whose class
            changed, ``path`` as in ``model.named_modules()`` (``""`` for the model itself).
        skipped (list of tuple): ``(path, class)`` per layer left as it was: one with no
            twin in the other library, or whose settings normcore refuses (they are also
            named in a warning, with the reason).

    Examples:
        >>> import normcore.nn as nnc
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> model, swap = nnc.from_torch(model, report=True)
        >>> swap.swapped
        [('1', <class 'torch.nn.modules.normalization.LayerNorm'>,
          <class 'normcore.nn.LayerNorm'>)]
        >>> swap.skipped
        []
    """

    swapped: list[tuple[str, type, type]]
    skipped: list[tuple[str, type]]


class NormcoreFunctions(TorchFunctionMode):
    """Inside this mode, ``torch.nn.functional``'s norm functions run normcore's; every other
    torch function runs as usual.  ``routed`` counts the calls handed over."""

    def __init__(self) -> None:
        super().__init__()
        self.routed = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        target = FUNCTIONS.get(func)
        if target is not None:
            self.routed += 1
            func = target
        return func(*args, **(kwargs or {}))


def _torch_base(cls: type) -> type[Module] | None:
    """The torch norm class ``cls`` is, or derives from (first in its MRO), or None."""
    return next((k for k in cls.__mro__ if k in TORCH_TO_NORMCORE), None)


def _timm_ws(cls: type) -> type[Module] | None:
    """normcore's class for ``cls`` if it is one of timm's WS convolutions (the class itself,
    in a ``timm`` module: a subclass may compute something else), or None."""
    if cls.__module__.partition(".")[0] != "timm" or not issubclass(cls, torch.nn.Conv2d):
        return None
    return TIMM_WS.get(cls.__name__)


def _is_normcore(cls: type) -> bool:
    return any(k in NORMCORE_TO_TORCH or k in (conv.WSConv2d, conv.ScaledStdConv2d)
               for k in cls.__mro__)


_TWINS: dict[type[Module], type[Module]] = {}
_WARNED: set[type] = set()
_MODE: ContextVar[NormcoreFunctions | None] = ContextVar("normcore_twin_mode", default=None)


class _Route(TorchFunctionMode):
    """:class:`NormcoreFunctions` without the count (under ``torch.compile``)."""

    def __torch_function__(self, func: Callable[..., Any], types: Any,
                           args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return FUNCTIONS.get(func, func)(*args, **(kwargs or {}))


_COMPILED_MODE = _Route()


class _ReachesNormcore(Module):
    """Between the user's class and normcore's in a twin's MRO: a ``super().forward()`` from
    the user's forward lands here, on its way to normcore's forward, and is counted."""

    _normcore_twin_of: type[Module]    # set on each twin class: the user's class

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return super().forward(*args, **kwargs)
        mode = _MODE.get()
        if mode is not None:
            mode.routed += 1
        return super().forward(*args, **kwargs)


def _twin_forward(self: _ReachesNormcore, *args: Any, **kwargs: Any) -> Any:
    if args and (leaf := traced_as_leaf(self, args[0])) is not None:
        return leaf
    user = type(self)._normcore_twin_of
    if torch.compiler.is_compiling():
        # dynamo traces the mode but not a ContextVar: route, without counting or warning
        with _COMPILED_MODE:
            return user.forward(self, *args, **kwargs)
    mode = NormcoreFunctions()
    with mode:
        token = _MODE.set(mode)
        try:
            out = user.forward(self, *args, **kwargs)
        finally:
            _MODE.reset(token)
    if not mode.routed and user not in _WARNED:
        _WARNED.add(user)
        warnings.warn(f"{user.__qualname__}.forward called no torch.nn.functional norm that "
                      f"normcore could take over; its output is torch's math, not normcore's",
                      stacklevel=2)
    return out


def _twin_reduce(self: _ReachesNormcore, protocol: int) -> tuple[Any, ...]:
    # the twin class is made at run time: pickle and deepcopy rebuild it from the user's class
    return (_new_twin, (type(self)._normcore_twin_of,), self.__getstate__())


def _new_twin(user: type[Module]) -> Module:
    cls = twin_class(user)
    return cls.__new__(cls)


def _ws_eps(self: Any) -> float:
    return float(self.eps)     # timm's attribute, read at each call: the layer's one value


def _ws_gamma(self: Any) -> float:
    return float(self.scale * self.weight[0].numel() ** 0.5)   # timm keeps gamma / sqrt(F)


def _ws_twin(user: type[Module], ours: type[Module]) -> type[Module]:
    """normcore's WS conv ``ours`` first, then timm's class ``user``: normcore's forward and
    standardized weight, on the attributes of timm's layer (``eps``; ``gain``, ``scale``,
    ``gain_init``), and ``isinstance`` of both classes."""
    namespace: dict[str, Any] = {"_normcore_twin_of": user, "__reduce_ex__": _twin_reduce,
                                 "__module__": user.__module__, "__qualname__": user.__qualname__}
    if ours is conv.WSConv2d:
        namespace.update(convention="timm", ws_eps=property(_ws_eps))
    else:
        namespace.update(gamma=property(_ws_gamma))
    return type(user.__name__, (ours, user), namespace)


def twin_class(user: type[Module]) -> type[Module]:
    """The class that inherits from ``user`` (a subclass of a torch norm) and from normcore's
    class for that norm, running ``user``'s forward on normcore's functions; for one of
    timm's WS convolutions, normcore's WS conv and ``user``, running normcore's (made once)."""
    twin = _TWINS.get(user)
    if twin is None and (ours := _timm_ws(user)) is not None:
        twin = _TWINS[user] = _ws_twin(user, ours)
    if twin is None:
        torch_cls = _torch_base(user)
        if torch_cls is None:
            raise TypeError(f"twin_class: {user.__qualname__} does not subclass a torch.nn "
                            f"norm layer and is none of timm's WS convolutions, so normcore "
                            f"has no class to pair it with")
        namespace = {"_normcore_twin_of": user, "__reduce_ex__": _twin_reduce,
                     "__module__": user.__module__, "__qualname__": user.__qualname__}
        if user.forward is not torch_cls.forward:   # the user's forward, normcore's norms
            namespace["forward"] = _twin_forward
        twin = type(user.__name__, (user, _ReachesNormcore, TORCH_TO_NORMCORE[torch_cls]),
                    namespace)
        _TWINS[user] = twin
    return twin


_REPARAMETRIZED: dict[tuple[type, type], type] = {}


def _base_class(m: Module) -> type:
    """The layer's class before ``torch.nn.utils.parametrize`` (which gives a parametrized
    layer a class of its own, ``Parametrized<class>``, whose one base is the layer's)."""
    return type(m).__bases__[0] if parametrize.is_parametrized(m) else type(m)


def _with_base(m: Module, new: type) -> type:
    """``new`` for a plain layer; for a parametrized one, the ``Parametrized<new>`` class
    with the same parametrization properties (so ``remove_parametrizations`` and
    ``type_before_parametrizations`` find ``new``)."""
    cls = type(m)
    if not parametrize.is_parametrized(m):
        return new
    key = (cls, new)
    if key not in _REPARAMETRIZED:
        namespace = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
        _REPARAMETRIZED[key] = type(f"Parametrized{new.__name__}", (new,), namespace)
    return _REPARAMETRIZED[key]


def _refused(m: Module) -> str | None:
    """Why normcore's class would refuse the layer's settings, or None: its constructor's
    checks (normcore is stricter than torch: eps > 0, momentum in [0, 1]), and for a WS
    convolution what its forward computes alike."""
    try:
        if getattr(m, "eps", None) is not None:
            checks.check_eps(m.eps, type(m).__name__)
        if hasattr(m, "momentum"):
            checks.check_momentum(m.momentum)
    except (TypeError, ValueError) as err:
        return str(err)
    if isinstance(m, torch.nn.Conv2d):   # timm's: F.conv2d with self.padding, no padding_mode
        if getattr(m, "same_pad", False):
            return ("its forward pads the input itself ('SAME' padding for this stride and "
                    "size), which normcore's WSConv2d does not")
        if m.padding_mode != "zeros":
            return (f"padding_mode={m.padding_mode!r}, which timm's forward ignores and "
                    f"normcore's WSConv2d applies")
    return None


def _looks_like_a_norm(m: Module) -> bool:
    """A layer whose class name says Norm, that is neither normcore's nor a block of layers:
    a module with a submodule that holds parameters (timm's NormFreeNet, NormFreeBlock,
    NormMlpClassifierHead) is a block, whose norms the walk reaches on its own."""
    cls = _base_class(m)
    return ("Norm" in cls.__name__ and not cls.__module__.startswith("normcore")
            and not any(True for child in m.children() for _ in child.parameters()))


def _check_module(model: object, caller: str) -> None:
    if not isinstance(model, Module):
        raise TypeError(f"{caller} expects a torch.nn.Module, got {type(model).__name__}; "
                        f"pass the model (e.g. nn.Sequential(*layers) for a list of layers)")


def _warn_skipped(caller: str, skipped: list[tuple[str, type]], why: str) -> None:
    if skipped:
        listed = ", ".join(f"{p or '<model>'} ({c.__name__})" for p, c in skipped)
        warnings.warn(f"{caller} left {len(skipped)} layer(s) as they were: {listed}; {why}",
                      stacklevel=3)


def _warn_refused(refused: list[tuple[str, type, str]]) -> None:
    if refused:
        listed = "; ".join(f"{p or '<model>'} ({c.__name__}): {why}" for p, c, why in refused)
        warnings.warn(
            f"from_torch left {len(refused)} layer(s) as torch's, with settings that torch "
            f"accepts and normcore's layers refuse: {listed}. The model computes what it "
            f"did; to swap such a layer, give it a setting normcore accepts before calling "
            f"from_torch (e.g. layer.eps = 1e-5), which changes its output (normcore refuses "
            f"eps <= 0 on purpose: a set of equal values would divide 0 by 0)", stacklevel=3)


M = TypeVar("M", bound=Module)


@overload
def from_torch(model: M, *, report: Literal[False] = False) -> M: ...
@overload
def from_torch(model: M, *, report: Literal[True]) -> tuple[M, Swap]: ...
@fill_defaults
def from_torch(model: M, *, report: bool = False) -> M | tuple[M, Swap]:
    r"""Swap every torch norm layer of ``model`` for normcore's, in place.

    Each layer stays the same object: only its class changes, so its parameters, buffers,
    hooks, mode, device, dtype and ``requires_grad`` are kept, and an optimizer built before
    still holds the right parameters.  What happens to each kind of module, met on a walk of
    ``model.named_modules()``:

    - torch's ``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, ``InstanceNorm1d/2d/3d``,
      ``LayerNorm``, ``RMSNorm``, ``GroupNorm``: normcore's class of the same name.
    - a subclass of one of them (timm's ``LayerNorm2d``, ``BatchNormAct2d``,
      ``GroupNormAct``): a twin class of it and normcore's, which keeps the subclass's own
      forward and runs normcore's normalization in it (``isinstance`` holds for both).
    - timm's convolutions with standardized weights (``timm.layers``' ``StdConv2d``,
      ``StdConv2dSame``, ``ScaledStdConv2d``, ``ScaledStdConv2dSame``): a twin class of it
      and normcore's :class:`WSConv2d` (``convention="timm"``, ``ws_eps`` the layer's
      ``eps``) or :class:`ScaledStdConv2d`, which compute the same weights as timm's
      forward (biased variance, ``eps`` under the root; times ``gain * scale``).  A
      ``Same`` layer whose forward pads the input itself (``same_pad``) is left as it is.
    - a layer of those kinds with settings that torch accepts and normcore's layers refuse
      on purpose (``eps <= 0``: a set of equal values would divide 0 by 0; ``momentum``
      outside [0, 1]): left as torch's, so the model computes what it did, and named in a
      warning with the reason.
    - a module whose class name contains ``Norm`` and that is none of the above, not
      normcore's, and not a block of layers (torchvision's ``FrozenBatchNorm2d``, timm's
      ``RmsNorm``): left as it is and named in a warning (a silent skip is how a model ends
      up half converted).
    - anything else, normcore's modules and blocks whose name says ``Norm`` among them (a
      module with a submodule that holds parameters: timm's ``NormFreeNet``,
      ``NormFreeBlock``, ``NormMlpClassifierHead``, whose norms the walk swaps on its own):
      left as it is, without a word.

    Args:
        model (nn.Module): the model (or a single layer) to change.
        report (bool): also return a :class:`Swap` listing the swapped and skipped layers.
            Default: {default}

    Returns:
        ``model`` (the same object), or ``(model, Swap)`` with ``report=True``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.

    Examples:
        >>> import normcore.nn as nnc
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
        ...                             torch.nn.ReLU(), torch.nn.LayerNorm(6))
        >>> x = torch.randn(2, 3, 8, 8)
        >>> before = model(x)
        >>> model = nnc.from_torch(model)               # the same object, in place
        >>> type(model[1]).__module__, isinstance(model[1], torch.nn.BatchNorm2d)
        ('normcore.nn', True)
        >>> torch.allclose(model(x), before, atol=1e-5)
        True
    """
    _check_module(model, "from_torch")
    plan: list[tuple[str, Module, type]] = []
    skipped: list[tuple[str, type]] = []
    unknown: list[tuple[str, type]] = []           # norms normcore has no twin for
    refused: list[tuple[str, type, str]] = []      # settings normcore's layers refuse
    for path, m in model.named_modules():
        cls = _base_class(m)
        if _is_normcore(cls):
            continue
        torch_cls = _torch_base(cls)
        if torch_cls is None and _timm_ws(cls) is None:
            if _looks_like_a_norm(m):
                unknown.append((path, cls))
                skipped.append((path, cls))
            continue
        why = _refused(m)
        if why is not None:
            refused.append((path, cls, why))
            skipped.append((path, cls))
            continue
        new = TORCH_TO_NORMCORE[cls] if cls is torch_cls else twin_class(cls)
        plan.append((path, m, _with_base(m, new)))
    swapped = _apply(plan)
    _warn_skipped("from_torch", unknown, "they do not subclass a torch.nn norm, so normcore "
                  "has no twin for them")
    _warn_refused(refused)
    return (model, Swap(swapped, skipped)) if report else model


@overload
def to_torch(model: M, *, report: Literal[False] = False) -> M: ...
@overload
def to_torch(model: M, *, report: Literal[True]) -> tuple[M, Swap]: ...
@fill_defaults
def to_torch(model: M, *, report: bool = False) -> M | tuple[M, Swap]:
    r"""Swap every normcore norm layer of ``model`` back to torch's, in place.

    The reverse of :func:`from_torch`: ``normcore.nn.BatchNorm2d`` becomes
    ``torch.nn.BatchNorm2d`` (and so on), and a layer :func:`from_torch` gave a twin class
    gets its own class back.  Each layer stays the same object, with the same parameters,
    buffers, hooks, mode, device, dtype and ``requires_grad``.  normcore layers without a
    torch twin (``WSConv*d``, ``ScaledStdConv2d``, ``DyT``, subclasses of normcore's classes)
    are left as they are and named in a warning.

    Args:
        model (nn.Module): the model (or a single norm layer) to change.
        report (bool): also return a :class:`Swap` listing the swapped and skipped layers.
            Default: {default}

    Returns:
        ``model`` (the same object), or ``(model, Swap)`` with ``report=True``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.

    Examples:
        >>> import normcore.nn as nnc
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), nnc.BatchNorm2d(8))
        >>> model, swap = nnc.to_torch(model, report=True)
        >>> type(model[1]), len(swap.swapped)
        (<class 'torch.nn.modules.batchnorm.BatchNorm2d'>, 1)
    """
    _check_module(model, "to_torch")
    plan: list[tuple[str, Module, type]] = []
    skipped: list[tuple[str, type]] = []
    for path, m in model.named_modules():
        cls = _base_class(m)
        if cls in NORMCORE_TO_TORCH:
            plan.append((path, m, _with_base(m, NORMCORE_TO_TORCH[cls])))
        elif "_normcore_twin_of" in cls.__dict__:     # a twin from_torch made: the user's class
            plan.append((path, m, _with_base(m, cls.__dict__["_normcore_twin_of"])))
        elif cls.__module__ == "normcore.nn" or _is_normcore(cls):
            skipped.append((path, cls))
    swapped = _apply(plan)
    _warn_skipped("to_torch", skipped, "torch.nn has no class that computes the same thing")
    return (model, Swap(swapped, skipped)) if report else model


def _apply(plan: list[tuple[str, Module, type]]) -> list[tuple[str, type, type]]:
    done = []
    for path, m, new in plan:
        done.append((path, type(m), new))
        m.__class__ = new
    return done
