"""The defaults of normcore's public API, each written once.

The signatures of :mod:`normcore.functional` and :mod:`normcore.nn` use these names, and
their docstrings do not repeat the numbers: an Args entry ends with ``Default: {default}``,
which :func:`fill_defaults` replaces with the signature's own default when the module is
imported (so the API reference, ``help()`` and the code cannot disagree).
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["EPS", "MOMENTUM", "DYT_ALPHA", "fill_defaults"]

#: added to the variance under the square root (``torch.nn``'s default)
EPS: float = 1e-5
#: weight of the new batch in the running averages (``torch.nn``'s default)
MOMENTUM: float = 0.1
#: DyT's initial alpha (Zhu et al. 2025, the paper's code)
DYT_ALPHA: float = 0.5

T = TypeVar("T", bound=Callable[..., Any])

# a section header ("Args:", "Shape:", ...) and an entry of the Args section
_HEADER = re.compile(r"^(?P<indent>\s*)(?P<title>[A-Z][A-Za-z ]*):\s*$")
_ARGS = {"Args", "Arguments", "Keyword Args", "Keyword Arguments", "Parameters"}
_ENTRY = re.compile(r"^(?P<indent>\s*)(?P<name>\w+)(?: \([^)]*\))?:(?:\s|$)")
_MARK = "{default}"


def _shown(value: Any) -> str:
    text = repr(value)
    if isinstance(value, float):            # 1e-05 -> 1e-5, as torch's docs write it
        text = re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].replace("+", "") + m[2], text)
    return f"``{text}``"


def fill_defaults(obj: T) -> T:
    """Replace each ``{default}`` in ``obj``'s docstring with the default of the argument
    whose Args entry it is in, read from the signature (a class's ``__init__``).

    Raises ``ValueError`` at import if an entry's argument is not in the signature or has
    no default: a docstring that names a default the code does not have is a bug."""
    doc = obj.__doc__
    if not doc or _MARK not in doc:
        return obj
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = inspect.signature(target).parameters
    in_args = False
    name = None
    entry_indent = None
    lines = []
    for line in doc.splitlines():
        h = _HEADER.match(line)
        if h and (not in_args or entry_indent is None or len(h["indent"]) < entry_indent):
            in_args, name, entry_indent = h["title"] in _ARGS, None, None
        elif in_args and line.strip():
            m = _ENTRY.match(line)
            indent = len(line) - len(line.lstrip())
            if m and (entry_indent is None or indent == entry_indent):
                name, entry_indent = m["name"], indent
        if _MARK in line:
            p = params.get(name) if name else None
            if p is None or p.default is inspect.Parameter.empty:
                raise ValueError(f"{obj.__qualname__}: {_MARK} in the docstring of "
                                 f"argument {name!r}, which has no default in the signature")
            line = line.replace(_MARK, _shown(p.default))
        lines.append(line)
    obj.__doc__ = "\n".join(lines)
    return obj
