"""What the book's modules need beyond torch, and the error that says how to install it.

Installing normcore's wheel without an extra installs the library, which needs only torch:
``import normcore``
loads :mod:`~normcore.nn`, :mod:`~normcore.functional` and the layers under them, and
nothing else.  The wheel also carries the book's modules (the learners who download it run
the chapters with them).  Those that draw, show widgets, train with progress bars and
intervals, or read notebooks need more (matplotlib, ipywidgets, SciPy, nbformat, ...), which
the extra ``normcore[book]`` installs (``[project.optional-dependencies]`` in
``pyproject.toml``).  Each of them calls :func:`require` before its first such import, so
that without the extra it fails at once with an :class:`ImportError` that names the
command, not with a bare ``No module named 'matplotlib'`` from deep inside a chapter.  The
command names the wheel (or a clone), never the bare name: ``normcore`` on PyPI is another
project.

:data:`NEEDS` is the one list of what each needs, by import name (``PIL`` is Pillow's,
``sklearn`` scikit-learn's).  An entry for a package covers its modules; a module's lazy
imports count too.  ``tests/test_packaging.py`` reads every module's imports and checks them
against this list and the list against ``pyproject.toml``'s extra.

:data:`OPTIONAL` lists the library's optional imports: :mod:`normcore.dispatch` asks for numba
and NumPy, and :mod:`normcore.loops` and :mod:`normcore.positions` compile their kernels with
them when they are installed (the extra ``normcore[fast]``, which the book's extra includes);
without them every call runs the reference.

This module imports nothing from normcore (it sits above every layer).
"""
from __future__ import annotations

import importlib.util
from importlib import metadata

__all__ = ["BOOK_EXTRA", "NEEDS", "OPTIONAL", "install_command", "missing", "require"]

#: The extra that installs what the book's modules need.
BOOK_EXTRA = "normcore[book]"

#: The book's modules that need more than torch, and the top-level names they import.
NEEDS: dict[str, tuple[str, ...]] = {
    "normcore.images": ("matplotlib", "PIL"),
    "normcore.widgets": ("ipywidgets", "IPython", "matplotlib", "PIL"),
    "normcore.viz": ("matplotlib", "PIL", "numpy", "sklearn"),
    "normcore.experiments": ("numpy", "scipy", "tqdm", "IPython"),
    "normcore.datasets": ("numpy", "sklearn", "mnist1d"),
    "normcore.classroom": ("nbformat", "nbclient", "cloudpickle", "tqdm", "pybtex",
                           "latexcodec"),
}


#: The library's modules that use a package when it is installed, and run without it; the
#: extra ``normcore[fast]`` installs them.
OPTIONAL: dict[str, tuple[str, ...]] = {
    "normcore.dispatch": ("numba", "numpy"),
    "normcore.loops": ("numba",),
    "normcore.positions": ("numpy",),
}


def install_command() -> str:
    """How to install the extra: from the book's wheel (this version's) or from a clone."""
    try:
        version = metadata.version("normcore")
    except metadata.PackageNotFoundError:     # run from a source tree that is not installed
        version = "<version>"
    return (f'pip install "normcore-{version}-py3-none-any.whl[book]" (the wheel the book '
            f'offers for download), or pip install -e ".[book]" in a clone of the book; not '
            f'pip install normcore, which on PyPI is another project')


def missing(module: str) -> list[str]:
    """The names in ``NEEDS[module]`` that cannot be imported here (found, not imported)."""
    return [name for name in NEEDS[module] if importlib.util.find_spec(name) is None]


def require(module: str) -> None:
    """Raise an :class:`ImportError` naming ``normcore[book]`` if ``module`` (a key of
    :data:`NEEDS`, the caller's ``__name__``) lacks one of the packages it imports."""
    if module not in NEEDS:
        raise ValueError(f"require({module!r}): {module} is not one of the book's modules "
                         f"listed in normcore._extras.NEEDS ({', '.join(NEEDS)}); add it there "
                         f"with the names it imports")
    absent = missing(module)
    if absent:
        raise ImportError(
            f"{module} is one of the normcore book's modules, not part of the library, and "
            f"needs {', '.join(absent)}, which {'is' if len(absent) == 1 else 'are'} not "
            f"installed. Install the book's extra, {BOOK_EXTRA}: {install_command()}. (The "
            f"library, normcore.nn and normcore.functional, needs only torch.)",
            name=absent[0])
