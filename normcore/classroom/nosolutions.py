"""A copy of the book without its solutions, for a site to hand a class.

sphinx-exercise's ``hide_solutions`` option crashes on the gated solutions the chapters use
(``{solution-start}`` ... ``{solution-end}``), so the solution-free site is built from a copy
of the book instead: :func:`copy_without_solutions` writes ``_config.yml``, ``_toc.yml``
and the chapters into another folder, with every exercise's solution-start, solution,
solution-end and check cells removed from the notebooks (the check cells call the
solutions), and links the assets and templates.  ``make book-nosolutions`` builds that copy into
``_build/nosolutions/html``.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat

from .marking import marking, read_exercises

#: The roles whose cells leave the copy.
REMOVED_ROLES = ("solution-start", "solution", "solution-end", "check")
#: What the copy takes from the book besides ``chapters/``: files copied, folders linked.
BOOK_FILES = ("_config.yml", "_toc.yml")
BOOK_FOLDERS = ("assets", "_templates")


def without_solutions(nb):
    """A copy of the notebook ``nb`` without the cells of :data:`REMOVED_ROLES`. Each coding
    exercise's statement keeps, in its ``normcore`` metadata, the ``op`` and ``function`` of
    the check cell that leaves (the classroom page lists them, :mod:`.overview`)."""
    out = nbformat.from_dict(nb)
    checked = {e.label: e for e in read_exercises(out) if e.op}
    for c in out.cells:
        mark = marking(c)
        if mark and mark.get("role") == "statement" and mark["exercise"] in checked:
            ex = checked[mark["exercise"]]
            mark["op"], mark["function"] = ex.op, ex.function
    out.cells = [c for c in out.cells
                 if (marking(c) or {}).get("role") not in REMOVED_ROLES]
    return out


def copy_without_solutions(root: str | Path, out: str | Path) -> Path:
    """Write the book at ``root`` into ``out`` without solutions; returns ``out``."""
    root, out = Path(root).resolve(), Path(out).resolve()
    if out == root or (root in out.parents and out.parts[len(root.parts)] != "_build"):
        raise ValueError(f"{out}: write the copy outside the book or under its _build/")
    if out.exists():
        shutil.rmtree(out)
    (out / "chapters").mkdir(parents=True)
    for name in BOOK_FILES:
        shutil.copy2(root / name, out / name)
    for name in BOOK_FOLDERS:
        if (root / name).is_dir():
            os.symlink(root / name, out / name, target_is_directory=True)
    for path in sorted((root / "chapters").iterdir()):
        if path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            nbformat.write(without_solutions(nb), out / "chapters" / path.name)
        elif path.is_file() and not path.name.startswith("."):
            shutil.copy2(path, out / "chapters" / path.name)
    return out
