"""The API reference's "Bases:" line: the torch class a normcore module stands in for.

A Sphinx extension (``_config.yml``: ``sphinx.local_extensions`` and ``extensions``), for
the pages of chapters/api*.md that autodoc writes from the docstrings. autodoc's
``:show-inheritance:`` lists a class's direct bases by their defining module:
``normcore.nn.batchnorm._BatchNorm, torch.nn.modules.batchnorm.BatchNorm2d``. What a reader
needs is the one fact that makes the class a drop-in: ``normcore.nn.BatchNorm2d`` *is a*
``torch.nn.BatchNorm2d``. So the line names the nearest torch class in the method resolution
order, by its public name (``torch.nn.BatchNorm2d`` when ``torch.nn`` exports it), and leaves
out normcore's private base classes, which are not part of the API.

And one repair of a docstring's reST, after napoleon has read its sections: a paragraph that
follows a bulleted list with no blank line between them (a "Differs from torch:" list, then
"See the book's page ...") gets that blank line. ``help()`` shows the docstring as written
and reads well; docutils would warn "Bullet list ends without a blank line", which ``-W``
makes an error.
"""

from __future__ import annotations

import importlib


def public_name(cls: type) -> str:
    """``cls``'s dotted name as its users write it: the shortest parent package of its
    module that exports it (``torch.nn.modules.batchnorm.BatchNorm2d`` -> ``torch.nn.BatchNorm2d``)."""
    parts = cls.__module__.split(".")
    for i in range(1, len(parts) + 1):
        package = ".".join(parts[:i])
        try:
            if getattr(importlib.import_module(package), cls.__name__, None) is cls:
                return f"{package}.{cls.__name__}"
        except ImportError:
            continue
    return f"{cls.__module__}.{cls.__qualname__}"


def torch_bases(cls: type) -> list[str]:
    """The "Bases:" entries of a normcore class: the nearest torch class of its MRO (none
    for a class that does not subclass torch's), as a cross-reference."""
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] == "torch":
            return [f":py:class:`{public_name(base)}`"]
    return []


def process_bases(app, name: str, obj, options, bases: list) -> None:
    if getattr(obj, "__module__", "").split(".")[0] == "normcore":
        bases[:] = torch_bases(obj)


def separate_lists(lines: list[str]) -> list[str]:
    """``lines`` with a blank line between a bulleted list and a paragraph (or field) that
    follows it at the list's own indentation; nothing else changes."""
    out: list[str] = []
    bullet = None                     # the indentation of the list being read, if any
    for line in lines:
        text = line.lstrip()
        indent = len(line) - len(text)
        if not text:
            bullet = None
        elif text[:2] in ("- ", "* "):
            bullet = indent if bullet is None else min(bullet, indent)
        elif bullet is not None and indent <= bullet:
            out.append("")
            bullet = None
        out.append(line)
    return out


def process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    if name.startswith("normcore."):
        lines[:] = separate_lists(lines)


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.setup_extension("sphinx.ext.napoleon")
    app.connect("autodoc-process-bases", process_bases)
    # after napoleon (priority 500), which turns the Google sections into reST
    app.connect("autodoc-process-docstring", process_docstring, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
