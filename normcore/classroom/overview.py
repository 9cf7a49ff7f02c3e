"""What the chapters ask: one row per exercise, for the instructor who picks an assignment."""

from __future__ import annotations

from pathlib import Path

import nbformat

from .marking import exercises_in


def exercises_of(paths) -> list[dict]:
    """Every marked exercise of the notebooks ``paths``, in order: chapter (file stem), label,
    points (and ``written``, the points of a written part, 0 if none), and for a coding
    exercise the checker's op, the function the student writes and how many mistakes that
    checker can name (``None`` for a derivation, graded by hand)."""
    from normcore import exercises

    rows = []
    for path in paths:
        path = Path(path)
        nb = nbformat.read(path, as_version=4)
        # a copy without solutions: the statements keep the op (.nosolutions)
        found = exercises_in(nb, path.name)
        for ex in found:
            rows.append({
                "chapter": path.stem, "label": ex.label, "points": ex.points,
                "written": ex.written,
                "op": ex.op, "function": ex.function,
                "mistakes": len(exercises.catalogue(ex.op)) if ex.op else None,
            })
    return rows


def exercise_table(paths) -> str:
    """:func:`exercises_of` as a Markdown table (GitHub's syntax), one row per exercise: the
    chapter's number, the label, the points (``2 + 1 in words`` with a written part), and the
    checker's op (a derivation: by hand)."""
    lines = ["| ch. | exercise | points | checked by | mistakes named |",
             "|---|---|---|---|---|"]
    for r in exercises_of(paths):
        number = r["chapter"].split("_")[0].lstrip("0")
        if r["op"]:
            points = f"{r['points']} + {r['written']} in words" if r["written"] else r["points"]
            lines.append(f"| {number} | `{r['label']}` | {points} | `{r['op']}` | "
                         f"{r['mistakes']} |")
        else:
            lines.append(f"| {number} | `{r['label']}` | {r['points']} | by hand | |")
    return "\n".join(lines)
