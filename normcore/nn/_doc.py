r"""Text shared by the docstrings of :mod:`normcore.nn`'s classes, written once.

A public class's docstring is a template (a module-level string) whose ``<<name>>`` marks are
replaced by :func:`fill` with these pieces, so ``help(normcore.nn.BatchNorm2d)`` and the API
reference show each class's text whole, while a sentence shared by eleven classes is written
here once.  ``Default: {default}`` is left for :func:`normcore.defaults.fill_defaults`, which
writes each signature's default.

The "Differs from torch" items are those of the book's page "Where normcore differs from
PyTorch, on purpose" (``chapters/differences.md``, whose cells check each against the
installed torch); a class lists the ones that concern it.
"""
from __future__ import annotations

import re

_MARK = re.compile(r"<<(\w+)>>")


def fill(template: str, **pieces: str) -> str:
    """``template`` with each ``<<name>>`` replaced by ``pieces[name]`` (a piece may hold
    marks of its own); a mark without a piece is an error (it would show in ``help()``)."""
    def piece(m: re.Match[str]) -> str:
        if m[1] not in pieces:
            raise KeyError(f"docstring template: no text for <<{m[1]}>>")
        return pieces[m[1]]
    while _MARK.search(template):
        template = _MARK.sub(piece, template)
    return template


def differs(*items: str) -> str:
    """The items of a "Differs from torch" section, one after the other."""
    return "\n".join(items)


# after the list, a paragraph of its own (reST needs the blank line)
PAGE = '\n    See the book\'s page "Where normcore differs from PyTorch, on purpose".'

EPS = """\
    - ``eps <= 0`` raises a ``ValueError`` when the module is built: with ``eps = 0`` a
      constant set divides 0 by 0 (<<EPS_TORCH>>)."""

MOMENTUM = """\
    - ``momentum`` outside [0, 1] raises a ``ValueError`` (torch takes any number, and the
      running statistics are then no weighted average)."""

SIZES = """\
    - The sizes (<<SIZE_ARGS>>) are checked when the module is built: a float raises a
      ``TypeError``, 0 or less a ``normcore.errors.ArgumentError`` (torch builds the
      module and fails, if at all, at the first forward)."""

ERRORS = """\
    - A bad input raises an instance of torch's exception type that is also a
      ``ValueError`` or ``TypeError`` (the classes of ``normcore.errors``), with a message
      that says what was given and what to do."""

SCRIPT = """\
    - ``torch.jit.script`` raises a ``TypeError`` that names what works instead:
      ``torch.compile``, ``torch.export.export`` and ``torch.jit.trace``."""

FX = """\
    - Under ``torch.fx.symbolic_trace`` the module records itself as one ``call_module``
      node (fx keeps only classes of ``torch.nn`` whole), so the graph is the one torch's
      layer gives."""

FUSE = """\
    - Importing ``normcore.nn`` adds the class to the table of
      ``torch.ao.quantization.fuse_modules``, which is keyed by exact types (torch's own
      keys are not touched); the fused module is torch's."""

DEVICE_ARGS = """\
    device (torch.device or None): where the parameters and buffers are made.
        Default: {default}
    dtype (torch.dtype or None): their dtype. Default: {default}"""
