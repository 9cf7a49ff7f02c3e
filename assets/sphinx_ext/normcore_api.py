"""The API reference's "Bases:" line: the torch class a normcore module stands in for.

A Sphinx extension (``_config.yml``: ``sphinx.local_extensions`` and ``extensions``), for
the pages of chapters/api*.md that autodoc writes from the docstrings. autodoc's
``:show-inheritance:`` lists a class's direct bases by their defining module:
``normcore.nn.batchnorm._BatchNorm, torch.nn.modules.batchnorm.BatchNorm2d``. What a reader
needs is the one fact that makes the class a drop-in: ``normcore.nn.BatchNorm2d`` *is a*
``torch.nn.BatchNorm2d``. So the line names the nearest torch class in the method resolution
order, by its public name (``torch.nn.BatchNorm2d`` when ``torch.nn`` exports it), and leaves
out normcore's private base classes, which are not part of the API.
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


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("autodoc-process-bases", process_bases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
