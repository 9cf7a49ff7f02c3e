"""What an exercise forbids, and how the checker sees it being used.

An exercise's statement says what the student may not use ("without autograd", "no
``torch.nn.functional``", "one call of ``batch_norm``").  The statement's cell metadata
carries the same as *rules* (``"rules": ["no-autograd", ...]``), which the grader passes to
:func:`normcore.exercises.check` (``rules=...``), and which a student may pass too:

=========================  =====================================================================
rule                       forbids
=========================  =====================================================================
``no-autograd``            ``Tensor.backward``, ``torch.autograd.grad``/``backward``,
                           ``torch.autograd.functional`` and ``torch.func``'s transforms
``no-torch-norms``         torch's normalization ops: ``torch.nn.functional.batch_norm``,
                           ``layer_norm``, ``group_norm``, ``instance_norm``, ``rms_norm``,
                           ``local_response_norm``, their ``torch.*`` twins, and so the
                           ``torch.nn`` norm modules, which call them
``no-normcore``            normcore's own code: every function of ``normcore.functional``,
                           ``normcore.grad``, ``normcore.stats``, ``normcore.fold``,
                           ``normcore.core``, the modules of ``normcore.nn`` and
                           ``normcore.exercises.reference``
``no-group-reshape``       a ``reshape``/``view``/``unflatten`` of the input to
                           :math:`(N, G, \\ldots)` (GroupNorm written from the set, group by group)
``no-sample-loop``         a loop over the samples: the number of torch calls grows with
                           :math:`N` (the function is called on a batch and on twice that batch)
``once:NAME``              exactly one call of ``NAME`` (``normcore.functional.batch_norm``,
                           ``torch.nn.functional.layer_norm``), which the rules above then
                           allow
=========================  =====================================================================

How it sees them: :func:`watch` records, while the student's function runs, every torch call
(a :class:`torch.overrides.TorchFunctionMode`; torch's own ops and the ``torch.nn.functional``
norms go through it) and every call of a normcore function (the functions are wrapped where
the student's function can reach them: in their modules and in the function's globals, so
``from normcore.functional import batch_norm`` is seen too).  A call made *inside* a normcore
function is not the student's and is not recorded.  This catches one-line shortcuts; it is
not a sandbox against a student who sets out to hide a call.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import types
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode, resolve_name

#: rule -> what it forbids, in the words a report uses.
RULES = {
    "no-autograd": "autograd (`.backward()`, `torch.autograd.grad`, `torch.func`)",
    "no-torch-norms": "torch's normalization ops (`torch.nn.functional.batch_norm`, "
                      "`layer_norm`, `group_norm`, `instance_norm`, `rms_norm` and the "
                      "`torch.nn` norm modules)",
    "no-normcore": "normcore's own code (`normcore.functional`, `normcore.grad`, "
                   "`normcore.stats`, `normcore.fold`, `normcore.nn`, "
                   "`exercises.reference`)",
    "no-group-reshape": "a reshape or view of the input to (N, G, ...)",
    "no-sample-loop": "a loop over the samples (the work must not grow call by call with N)",
}

#: rule -> what to change, in a report's words (``once:NAME`` rules share one entry).
FIXES = {
    "no-autograd": "compute the gradients from the formula, with tensor operations; no "
                   "backward() and no torch.autograd.",
    "no-torch-norms": "compute the statistics yourself (mean, var, sqrt) instead of calling "
                      "torch's normalization op.",
    "no-normcore": "write the computation yourself; normcore's functions are the answer, "
                   "not a tool for this exercise.",
    "no-group-reshape": "follow the statement: take each group's channels by slicing, one "
                        "group at a time, instead of reshaping to (N, G, ...).",
    "no-sample-loop": "work on the whole batch at once (reduce over dims with mean/var); "
                      "no Python loop over the samples.",
    "once": "call the named function exactly once, on the whole batch.",
}

AUTOGRAD = ("torch.Tensor.backward", "torch.autograd.grad", "torch.autograd.backward",
            "torch.autograd.functional.", "torch.func.", "torch._functorch.")
_NORMS = ("batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm",
          "local_response_norm", "native_batch_norm", "native_layer_norm", "native_group_norm",
          "_batch_norm_impl_index", "_native_batch_norm_legit")
TORCH_NORMS = tuple(f"torch.nn.functional.{n}" for n in _NORMS) + tuple(
    f"torch.{n}" for n in _NORMS)
#: The normcore modules whose functions the student may be forbidden to call.
NORMCORE_MODULES = ("normcore.functional", "normcore.grad", "normcore.grad_dyt",
                    "normcore.stats", "normcore.fold", "normcore.core", "normcore.nn",
                    "normcore.exercises")
_RESHAPES = ("torch.Tensor.reshape", "torch.Tensor.view", "torch.reshape",
             "torch.Tensor.unflatten", "torch.unflatten")


class RuleError(ValueError):
    """A rule that does not exist, or is written wrongly."""


def parse_rules(rules) -> tuple[str, ...]:
    """``rules`` (a string or a sequence of them) checked against :data:`RULES` and the
    ``once:NAME`` form; a :class:`RuleError` naming the bad one otherwise."""
    if rules is None:
        return ()
    if isinstance(rules, str):
        rules = (rules,)
    out = []
    for rule in rules:
        if not isinstance(rule, str):
            raise RuleError(f"a rule is a string, got {type(rule).__name__} ({rule!r})")
        if rule.startswith("once:"):
            name = rule[5:]
            if not name.startswith(("torch.", "normcore.")) or \
                    name.count(".") < 1:
                raise RuleError(f"rule {rule!r}: write once:<qualified name>, e.g. "
                                "once:torch.nn.functional.layer_norm")
        elif rule not in RULES:
            raise RuleError(f"unknown rule {rule!r}; the rules are {', '.join(RULES)} and "
                            "once:<qualified name>")
        out.append(rule)
    return tuple(dict.fromkeys(out))


def _name(func) -> str:
    name = resolve_name(func)
    if name:
        return name
    module = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    return f"{module}.{qual}" if module else qual


@dataclass
class Calls:
    """What one run of the student's function called: ``names`` in order (torch's and
    normcore's), and the shapes it reshaped to (``reshapes``: (name, input shape, target
    shape))."""

    names: list[str] = field(default_factory=list)
    reshapes: list[tuple[str, tuple, tuple]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"names": list(self.names),
                "reshapes": [[n, list(a), list(b)] for n, a, b in self.reshapes]}

    @classmethod
    def from_dict(cls, d: dict) -> Calls:
        return cls(list(d.get("names", [])),
                   [(n, tuple(a), tuple(b)) for n, a, b in d.get("reshapes", [])])


class _Mode(TorchFunctionMode):
    def __init__(self, calls: Calls):
        super().__init__()
        self.calls, self.inside = calls, 0

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.inside:
            name = _name(func)
            if not name.endswith(".__get__") and "_set_grad_enabled" not in name:
                self.calls.names.append(name)
            if name in _RESHAPES and args and isinstance(args[0], torch.Tensor):
                self.calls.reshapes.append((name, tuple(args[0].shape), _target(name, args,
                                                                                 kwargs)))
        return func(*args, **kwargs)


def _target(name, args, kwargs) -> tuple:
    """The shape a reshape/view/unflatten call asks for (-1 and all)."""
    x = args[0]
    try:
        if "unflatten" in name:
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            sizes = args[2] if len(args) > 2 else kwargs.get("sizes")
            shape = list(x.shape)
            dim = dim % x.dim()
            return tuple(shape[:dim] + [int(s) for s in sizes] + shape[dim + 1:])
        rest = args[1:] if len(args) > 1 else (kwargs.get("shape") or kwargs.get("size"),)
        if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
            rest = tuple(rest[0])
        return tuple(int(s) for s in rest if isinstance(s, int))
    except Exception:  # noqa: BLE001 - a view by dtype, or arguments we do not read
        return ()


def _wrap(fn, qualname: str, mode_ref: list):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        mode = mode_ref[0]
        if mode is None:
            return fn(*args, **kwargs)
        if not mode.inside:
            mode.calls.names.append(qualname)
        mode.inside += 1
        try:
            return fn(*args, **kwargs)
        finally:
            mode.inside -= 1
    wrapper.__normcore_watched__ = fn
    return wrapper


def _normcore_targets():
    """(owner, attribute, function, qualified name) of every normcore function or class
    method the student could call."""
    out, seen = [], set()
    for modname in NORMCORE_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for attr, value in vars(mod).items():
            if attr.startswith("_"):
                continue
            if inspect.isfunction(value) and getattr(value, "__module__", "").startswith(
                    "normcore"):
                out.append((mod, attr, value, f"{modname}.{attr}"))
            elif inspect.isclass(value) and issubclass(value, torch.nn.Module):
                for klass in value.__mro__:   # forward may be inherited (_BatchNorm's)
                    if klass.__module__.startswith("normcore") and "forward" in vars(klass) \
                            and id(klass) not in seen:
                        seen.add(id(klass))
                        out.append((klass, "forward", vars(klass)["forward"],
                                    f"{modname}.{attr}.forward"))
    return out


def _globals_reached(fn, seen=None) -> list[tuple[dict, str]]:
    """(globals dict, name) of every global the function and the functions it reaches
    through its globals refer to (nested code objects included)."""
    seen = set() if seen is None else seen
    if not isinstance(fn, types.FunctionType) or id(fn) in seen:
        return []
    seen.add(id(fn))
    out = []

    def names(code):
        yield from code.co_names
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from names(const)
    g = fn.__globals__
    for name in set(names(fn.__code__)):
        if name in g:
            out.append((g, name))
            out += _globals_reached(g[name], seen)
    for cell in fn.__closure__ or ():
        with contextlib.suppress(ValueError):
            out += _globals_reached(cell.cell_contents, seen)
    return out


@contextlib.contextmanager
def watch(fn=None):
    """Record the torch and normcore calls made in the block; yields a :class:`Calls`.
    ``fn``: the student's function, whose globals that name normcore functions are
    wrapped too for the block."""
    calls = Calls()
    mode = _Mode(calls)
    ref = [mode]
    patched = []
    by_fn = {}
    try:
        for owner, attr, value, qual in _normcore_targets():
            original = getattr(value, "__normcore_watched__", value)
            wrapper = _wrap(original, qual, ref)
            by_fn[id(original)] = wrapper
            patched.append((owner, attr, value))
            setattr(owner, attr, wrapper)
        if fn is not None:
            for g, name in _globals_reached(fn):
                value = g[name]
                key = id(getattr(value, "__normcore_watched__", value))
                if key in by_fn:
                    patched.append((g, name, value))
                    g[name] = by_fn[key]
        with mode:
            yield calls
    finally:
        ref[0] = None
        for owner, attr, value in reversed(patched):
            if isinstance(owner, dict):
                owner[attr] = value
            else:
                setattr(owner, attr, value)


def violations(rules, calls: Calls, case=None, big: Calls | None = None) -> list[tuple]:
    """The rules ``calls`` break: one ``(rule, what was called)`` each.  ``case``: the
    test set the calls ran on (for ``no-group-reshape``); ``big``: the calls on the same
    set with twice the samples (for ``no-sample-loop``)."""
    once = {r[5:] for r in rules if r.startswith("once:")}
    found = []

    def first(pred):
        return next((n for n in calls.names if pred(n) and n not in once), None)
    if "no-autograd" in rules:
        hit = first(lambda n: n.startswith(AUTOGRAD))
        if hit:
            found.append(("no-autograd", hit))
    if "no-torch-norms" in rules:
        hit = first(lambda n: n in TORCH_NORMS)
        if hit:
            found.append(("no-torch-norms", hit))
    if "no-normcore" in rules:
        hit = first(lambda n: n.startswith("normcore."))
        if hit:
            found.append(("no-normcore", hit))
    if "no-group-reshape" in rules and case is not None and case.groups:
        n, g = case.shape[0], case.groups
        for name, before, target in calls.reshapes:
            if len(before) >= 2 and before[0] == n and len(target) >= 2 and \
                    target[0] in (n, -1) and target[1] == g and before[1] != g:
                found.append(("no-group-reshape", (f"{name.split('.')[-1]} of a tensor of "
                               f"shape {tuple(before)} to {tuple(target)}")))
                break
    if "no-sample-loop" in rules and big is not None and len(big.names) > len(calls.names):
        found.append(("no-sample-loop", (f"{len(calls.names)} torch calls for the batch, "
                       f"{len(big.names)} for twice that batch")))
    for name in sorted(once):
        k = calls.names.count(name)
        if k != 1:
            found.append((f"once:{name}", f"{k} calls of {name}"))
    return found


def describe(rule: str) -> str:
    """What ``rule`` asks, in a report's words."""
    if rule.startswith("once:"):
        return f"exactly one call of `{rule[5:]}`"
    return RULES[rule]


def fix(rule: str) -> str:
    """What to change when ``rule`` is broken."""
    return FIXES["once" if rule.startswith("once:") else rule]


__all__ = ["RULES", "FIXES", "fix", "RuleError", "Calls", "parse_rules", "watch", "violations", "describe"]
