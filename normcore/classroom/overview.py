"""What the chapters ask: one row per exercise, for the instructor who picks an assignment."""

from __future__ import annotations

from pathlib import Path

import nbformat

from .marking import read_exercises


def exercises_of(paths) -> list[dict]:
    """Every marked exercise of the notebooks ``paths``, in order: chapter (file stem), label,
    points, and for a coding exercise the checker's op, the function the student writes and
    how many mistakes that checker can name (``None`` for a derivation, graded by hand)."""
    from normcore import exercises

    rows = []
    for path in paths:
        path = Path(path)
        nb = nbformat.read(path, as_version=4)
        for ex in read_exercises(nb, path.name):
            rows.append({
                "chapter": path.stem, "label": ex.label, "points": ex.points,
                "op": ex.op, "function": ex.function,
                "mistakes": len(exercises.catalogue(ex.op)) if ex.op else None,
            })
    return rows


def exercise_table(paths) -> str:
    """:func:`exercises_of` as a Markdown table (GitHub's syntax), one row per exercise."""
    lines = ["| chapter | exercise | points | the student writes | checked by | mistakes named |",
             "|---|---|---|---|---|---|"]
    for r in exercises_of(paths):
        if r["op"]:
            lines.append(f"| {r['chapter']} | `{r['label']}` | {r['points']} | "
                         f"`{r['function']}` | `{r['op']}` | {r['mistakes']} |")
        else:
            lines.append(f"| {r['chapter']} | `{r['label']}` | {r['points']} | "
                         "a derivation | by hand | |")
    return "\n".join(lines)
