"""The errors normcore raises: each is the type PyTorch raises for the same mistake, and a
``ValueError`` or ``TypeError`` as well.

PyTorch reports most bad arguments of its norms from C++, as ``RuntimeError`` (a weight of
the wrong shape, a ``normalized_shape`` that is not the input's last dims, parameters of
another dtype than the input), some from Python as ``ValueError``, a few by accident as
``IndexError`` or ``ZeroDivisionError``.  normcore checks every argument before computing
(:mod:`normcore._checks`) and raises one of these classes, so that both

* ``except RuntimeError`` (code written against torch), and
* ``except ValueError`` (the house rule: a bad value is a ``ValueError``)

catch it, and its message says what was given and what to do.  This module imports nothing:
every layer of the package may raise these.
"""
from __future__ import annotations

__all__ = ["ArgumentError", "ShapeError", "DimsError", "NumGroupsError", "DtypeError",
           "NotFloatError", "EmptyBatchError"]


class ArgumentError(ValueError, RuntimeError):
    """A bad value where torch raises ``RuntimeError`` (e.g. eval mode without running
    statistics, a negative size)."""


class ShapeError(ArgumentError):
    """Shapes that do not fit together: a weight, bias or running buffer with another
    number of channels than the input, a ``normalized_shape`` that is not the input's last
    dims (torch: ``RuntimeError``, or ``ValueError`` for a module's ``num_features``)."""


class DimsError(ShapeError, IndexError):
    """An input with too few dims for the op (torch: ``IndexError``, ``RuntimeError`` or
    ``ValueError``, depending on the op)."""


class NumGroupsError(ShapeError, ZeroDivisionError):
    """``num_groups`` that is not a positive divisor of the channels (torch:
    ``RuntimeError``, ``ValueError`` in ``GroupNorm``'s constructor, and
    ``ZeroDivisionError`` for 0)."""


class DtypeError(TypeError, RuntimeError):
    """Parameters or buffers of another dtype than the input (torch: ``RuntimeError``,
    "mixed dtype")."""


class NotFloatError(TypeError, NotImplementedError):
    """An integer or bool input (torch: ``NotImplementedError``, "not implemented for
    'Long'")."""


class EmptyBatchError(ValueError, IndexError):
    """An empty batch where a statistic over it would be written somewhere (torch's
    InstanceNorm: ``IndexError`` with affine parameters, NaN buffers without)."""
