"""Mark the chapter cells that grading need not run: ``"normcore": {"grading": "skip"}``.

Usage:
  python tools/mark_grading_skips.py                  # every chapter with exercises
  python tools/mark_grading_skips.py chapters/02_batch_norm.ipynb ...
  python tools/mark_grading_skips.py --check          # exit 1 if a chapter would change

For each chapter, :func:`normcore.classroom.skipping.plan` decides per code cell: a cell is
skipped unless it is the first code cell (the imports), a coding exercise's solution or
check, a cell that changes the process's state, or a cell that binds a name a kept cell
below reads (the closure of what the exercises need).  The script sets the marking on those
cells and removes it from the others, keeping every other key of a cell's ``normcore``
metadata and every cell id: running it twice changes nothing, and after a merge it re-marks
the chapters as they now are.  It then strips the notebooks it wrote
(``tools/strip_notebook.py``).  It prints, per chapter, the cells it skips and keeps.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from normcore.classroom.marking import marking  # noqa: E402 - importable once sys.path has its folder
from normcore.classroom.skipping import first_line, mark, plan, violations  # noqa: E402 - importable once sys.path has its folder


def chapters_with_exercises() -> list[Path]:
    found = []
    for path in sorted((ROOT / "chapters").glob("[0-9]*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if any(marking(c) for c in nb.cells):
            found.append(path)
    return found


def apply(path: Path, write: bool = True, verbose: bool = True) -> bool:
    """Mark ``path``'s cells by :func:`plan`; whether anything changed."""
    nb = nbformat.read(path, as_version=4)
    skip = plan(nb)
    changed = False
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            changed |= mark(cell, i in skip)
    bad = violations(nb)
    if bad:
        raise SystemExit(f"{path.name}: the marking breaks the rule: {bad}")
    if verbose:
        code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
        print(f"{path.name}: {len(skip)} of {len(code)} code cells skipped"
              f"{' (changed)' if changed else ''}")
        for i in code:
            tag = "skip" if i in skip else "keep"
            print(f"  {tag} {i:3d} {nb.cells[i].get('id', '')[:14]:<14} "
                  f"{first_line(nb.cells[i].source)[:60]}")
    if changed and write:
        nbformat.write(nb, path)
        subprocess.run([sys.executable, str(ROOT / "tools" / "strip_notebook.py"), str(path)],
                       check=True)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tools/mark_grading_skips.py")
    parser.add_argument("chapters", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a chapter's marking is not the plan")
    parser.add_argument("-q", "--quiet", action="store_true")
    a = parser.parse_args(argv)
    paths = a.chapters or chapters_with_exercises()
    changed = [p for p in paths if apply(p, write=not a.check, verbose=not a.quiet)]
    if a.check and changed:
        print(f"not marked as planned: {', '.join(p.name for p in changed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
