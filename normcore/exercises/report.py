"""What :func:`normcore.exercises.check` returns, and the plain text it prints.

Everything here formats: numbers to three significant digits, paragraphs wrapped to the
book's output column, shapes and dtypes written the same way in every message.  Nothing
prints an address or a timing, so a report is deterministic and nbval can compare it.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import torch

from .catalogue import CATALOGUE

WIDTH = 76  # fits the book's output column

#: Every value of :attr:`Report.kind`.
KINDS = ("pass", "misconception", "unknown", "not_implemented", "exception", "type", "shape",
         "dtype", "nan", "forbidden")


@dataclass(frozen=True)
class Report:
    """What :func:`check` found.  Prints as plain, deterministic text.

    ``kind`` is one of ``"pass"``, ``"misconception"``, ``"unknown"`` (wrong, no known
    mistake matches), ``"not_implemented"`` (the function raised ``NotImplementedError``:
    still the stub of a student notebook), ``"exception"``, ``"type"``, ``"shape"``,
    ``"dtype"``, ``"nan"``, ``"forbidden"`` (it used what the exercise's rules forbid,
    :mod:`.rules`; ``broken_rules`` names them).
    ``misconception`` is a :data:`CATALOGUE` key (the first, if two mistakes combine;
    ``misconceptions`` has them all).  ``max_abs_error`` is the largest difference from the
    reference over every test set (``None`` when the values could not be compared).
    ``advice``: for a misconception, one ``(key, did, why, fix)`` per mistake, the
    catalogue's prose filled in for this op ("what you did", "why it is wrong", "what to
    change"), for a student's feedback file.
    """

    op: str
    passed: bool
    kind: str
    misconception: str | None
    message: str
    max_abs_error: float | None
    misconceptions: tuple[str, ...] = ()
    where: str | None = None
    advice: tuple[tuple[str, str, str, str], ...] = ()
    broken_rules: tuple[str, ...] = ()

    @property
    def headline(self) -> str:
        if self.passed:
            return f"{self.op}: correct."
        if self.kind == "not_implemented":
            return f"{self.op}: not implemented."
        if self.kind == "forbidden":
            return f"{self.op}: not accepted (forbidden: {', '.join(self.broken_rules)})."
        if self.misconceptions:
            titles = " + ".join(f"{CATALOGUE[k].title} [{k}]" for k in self.misconceptions)
            return f"{self.op}: not correct. Diagnosis: {titles}"
        return f"{self.op}: not correct."

    def __str__(self) -> str:
        return f"{self.headline}\n{self.message}"

    __repr__ = __str__


def failed(op: str, kind: str, message: str) -> Report:
    """A report for a function that failed before its values could be compared."""
    return Report(op, False, kind, None, message, None, (), None)


# ---- formatting -------------------------------------------------------------------------
def number(x: float | None, digits: int = 3) -> str:
    """``x`` rounded to ``digits`` significant digits, printed the same everywhere."""
    if x is None:
        return "n/a"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    v = float(f"{x:.{digits}g}")
    if 1e-4 <= abs(v) < 1e6:  # plain notation: 2870, 0.309, 0.000123
        return f"{v:f}".rstrip("0").rstrip(".")
    return f"{v:.{digits}g}"


def wrap(text: str, indent: str = "", hang: str = "  ") -> str:
    """Fill each line of ``text`` to the page width; code in `backticks` is not broken.
    Continuation lines start with ``indent + hang``."""
    out = []
    for para in text.split("\n"):
        pieces = para.split("`")
        # odd pieces are code: protect their spaces from the line breaker
        para = "`".join(p.replace(" ", "\x00") if i % 2 else p for i, p in enumerate(pieces))
        filled = textwrap.fill(para, WIDTH, initial_indent=indent,
                               subsequent_indent=indent + hang, break_on_hyphens=False,
                               break_long_words=False)
        out.append(filled.replace("\x00", " "))
    return "\n".join(out)


def shape_text(t) -> str:
    """``(4, 3)``, ``(3,)``: a tensor's or a tuple's shape as Python writes a tuple."""
    s = tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t)
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


def dtype_text(dtype) -> str:
    """``float32``, not ``torch.float32``."""
    return str(dtype).replace("torch.", "")


def type_name(value) -> str:
    """What a student's function returned, in words: ``None``, ``a tuple (Tensor, int)``."""
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type_name(r) if not isinstance(r, torch.Tensor) else "Tensor"
                          for r in value)
        return f"a {type(value).__name__} ({inner})"
    mod = type(value).__module__
    qual = type(value).__qualname__
    return f"a {qual if mod == 'builtins' else mod.split('.')[0] + '.' + qual}"
