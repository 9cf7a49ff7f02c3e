"""Give every coding exercise of chapters 1-9 a rubric (issue 21, partial credit).

Sets ``"rubric"`` (and, where the rubric needs them, ``"points"``) in the ``normcore``
metadata of each exercise's statement cell; nothing else changes (cell ids, sources and
outputs are kept).  Idempotent: run it again and nothing changes.  Then
``tools/strip_notebook.py`` on the notebooks it touched.

Usage: python tools/add_rubrics.py [chapters/]
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

FORWARD = {"set": 1, "variance+eps+affine": 1}
#: label -> (points, rubric); the items are properties of the exercise's op
#: (normcore.exercises.credit.PROPERTIES), joined with "+" when one point covers several.
RUBRICS = {
    "ex-in-formula": (2, FORWARD),
    "ex-gn-reshape": (2, FORWARD),
    "ex-bn-forward": (2, FORWARD),
    "ex-bn-backward": (2, {"dx": 1, "set+variance+dparams": 1}),
    "ex-running-update": (2, {"momentum": 1, "variance": 1}),
    "ex-fold-by-hand": (2, {"scale+eps": 1, "bias": 1}),
    "ex-chan-k": (2, {"mean": 1, "m2": 1}),
    "ex-ln-forward": (3, {"set": 1, "variance+eps": 1, "affine": 1}),
    "ex-ln-backward": (3, {"set": 1, "dx": 1, "dparams": 1}),
    "ex-rms-forward": (2, {"set": 1, "rms+eps": 1}),
    "ex-in-forward": (2, FORWARD),
    "ex-in-via-bn": (2, FORWARD),
    "ex-adain": (3, {"set": 1, "style": 1, "variance+eps": 1}),
    "ex-gn-forward": (2, FORWARD),
    "ex-gn-via-ln": (2, FORWARD),
    "ex-gn-backward": (3, {"set+variance": 1, "dx": 1, "dparams": 1}),
    "ex-ws-original": (2, {"set": 1, "variance+eps": 1}),
    "ex-ws-bit": (2, {"set": 1, "variance+eps": 1}),          # was 1 point
    "ex-ws-backward": (2, {"dx": 1, "set+variance+eps": 1}),
    "ex-ws-fold": (2, {"ws+eps": 1, "fold": 1}),              # was 1 point
    "ex-brn-first-steps": (2, FORWARD),
    "ex-dyt-forward": (2, {"alpha": 1, "affine": 1}),
}


def apply(path: Path) -> bool:
    """Set the rubrics of ``path``'s statements; whether the file changed."""
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        mark = cell.get("metadata", {}).get("normcore")
        if not isinstance(mark, dict) or mark.get("role") != "statement":
            continue
        if mark.get("exercise") not in RUBRICS:
            continue
        points, rubric = RUBRICS[mark["exercise"]]
        if mark.get("points") != points or mark.get("rubric") != rubric:
            mark["points"], mark["rubric"] = points, dict(rubric)
            changed = True
    if changed:
        nbformat.write(nb, path)
    return changed


def main(folder: str = "chapters") -> None:
    found = []
    for path in sorted(Path(folder).glob("0[1-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        found += [c.metadata["normcore"]["exercise"] for c in nb.cells
                  if c.get("metadata", {}).get("normcore", {}).get("role") == "statement"]
        if apply(path):
            print(f"rubrics set: {path}")
    missing = sorted(set(RUBRICS) - set(found))
    if missing:
        sys.exit(f"no statement cell for {', '.join(missing)} in {folder}")


if __name__ == "__main__":
    main(*sys.argv[1:])
