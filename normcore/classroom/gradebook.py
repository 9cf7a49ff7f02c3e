"""A class's grades against its roster: every student, every exercise, and a gradebook CSV.

``grade`` alone writes a row for each exercise of each notebook it was given.  With a roster
(:mod:`.roster`) and the chapters that were handed out, :func:`complete` makes the grade
sheet whole:

* every student of the roster has a row for every exercise of every chapter (the exercises
  come from the chapters, not from what was handed in); an exercise of a chapter the
  student did not hand in scores 0 with status ``missing`` and a detail that says where
  the grader looked (``missing: no submission found at bob/03_running_stats.ipynb``: the
  path another student's submission of that chapter had, with the id replaced);
* a notebook that cannot be read, named after a chapter, gets that chapter's rows (status
  ``unreadable``, 0 points), so that the student's line of the gradebook is complete;
* a submission whose student is not on the roster stays in the grade sheet with its detail
  marked ``not on the roster``, and :func:`complete` returns a warning for it; it is not in
  the gradebook (an LMS refuses ids it does not know).

:func:`write_gradebook` writes the table an LMS imports (Canvas, Moodle: a CSV with a
student id column and one column per graded item): one line per student of the roster, the
columns ``id, name``, one per exercise (its label; ``chapter:label`` if two chapters share
a label) with the points scored, and ``total``, the sum of the line.  The written part of a
coding exercise has a column of its own after the exercise's (``<label>:written``).  An
answer graded by hand (a derivation, a written part) has an empty cell until the
instructor's scores are merged in (:mod:`.manual`), or for the instructor to fill in (0 if
the chapter is missing); ``total`` counts the filled cells.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import nbformat

from .grade import WRITTEN, Row
from .roster import Student, Submission, expected_path
from .marking import exercises_in
from .student import manifest

NOT_ON_ROSTER = "not on the roster"


@dataclass(frozen=True)
class Column:
    """One exercise of the gradebook: its chapter, label, points, op (``""``: by hand) and
    the header of its column."""

    chapter: str
    label: str
    points: int
    op: str
    header: str


def chapter_exercises(paths) -> dict[str, list[dict]]:
    """The exercises of each chapter ``paths`` (the book's chapters or their student
    versions), by chapter name (the file's stem), as the student notebooks list them."""
    found = {}
    for path in map(Path, paths):
        try:
            nb = nbformat.read(path, as_version=4)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read the chapter {path}: {e}") from None
        listed = nb.get("metadata", {}).get("normcore", {}).get("classroom")
        if not isinstance(listed, dict) or "exercises" not in listed:
            marked = exercises_in(nb, path.name)
            listed = manifest(marked, path.stem)
        if not listed["exercises"]:
            raise ValueError(f"the chapter {path} has no marked exercise")
        found[listed.get("source") or path.stem] = listed["exercises"]
    return found


def columns(chapters: dict[str, list[dict]]) -> list[Column]:
    """The gradebook's exercise columns, chapter by chapter: each exercise, and after a
    coding exercise with a written part, that part (graded by hand)."""
    labels = [e["label"] for exs in chapters.values() for e in exs]
    cols = []
    for ch, exs in chapters.items():
        for e in exs:
            header = e["label"] if labels.count(e["label"]) == 1 else f"{ch}:{e['label']}"
            cols.append(Column(ch, e["label"], e.get("points", 0), e.get("op") or "", header))
            if e.get("written"):
                cols.append(Column(ch, e["label"] + WRITTEN, e["written"], "",
                                   header + WRITTEN))
    return cols


def _missing(student, column, looked) -> Row:
    return Row(student, column.chapter, column.label, column.op, column.points, 0, "missing",
               "", "", f"missing: {looked}")


def _looked_for(student, chapter, submissions, chapter_of, folder, pattern) -> str:
    like = next((s for s in submissions if chapter_of.get(s.path) == chapter), None)
    if like is not None:
        where = expected_path(like, student)
        return f"no submission found at {Path(folder, where) if folder else where}"
    return (f"no submission of {chapter} found for {student} in {folder} (no notebook of "
            f"this chapter there; the student is the group 'student' of {pattern!r})")


def complete(rows: list[Row], roster: list[Student], chapters: dict[str, list[dict]],
             submissions: list[Submission], folder=None, pattern: str = ""
             ) -> tuple[list[Row], list[str]]:
    """The grade sheet for the whole roster (students in its order, then the students not on
    it), and the warnings to print."""
    cols = columns(chapters)
    ids = [s.id for s in roster]
    chapter_of = {Path(r.source): r.chapter for r in rows if r.chapter}
    fixed = []
    for r in rows:
        stem = Path(r.source).stem
        if r.exercise == "*" and stem in chapters:   # unreadable: charge its chapter's rows
            chapter_of[Path(r.source)] = stem
            fixed += [Row(r.student, stem, c.label, c.op, c.points, 0, r.status, "", "",
                          r.detail, source=r.source) for c in cols if c.chapter == stem]
        else:
            fixed.append(r)
    warnings = []
    for s in submissions:
        if s.student not in ids:
            warnings.append(f"warning: {s.relative}: student {s.student!r} is not on the "
                            f"roster: graded, in the grade sheet and feedback, not in the "
                            f"gradebook")
    for r in fixed:
        if r.student not in ids:
            r.detail = NOT_ON_ROSTER + (f"; {r.detail}" if r.detail else "")
    out = []
    for sid in ids:
        for chapter in chapters:
            mine = [r for r in fixed if r.student == sid and r.chapter == chapter]
            if mine:
                out += mine
                continue
            looked = _looked_for(sid, chapter, submissions, chapter_of, folder, pattern)
            out += [_missing(sid, c, looked) for c in cols if c.chapter == chapter]
        out += [r for r in fixed if r.student == sid and r.chapter not in chapters]
    out += [r for r in fixed if r.student not in ids]
    extra = sorted({r.chapter for r in fixed if r.chapter and r.chapter not in chapters})
    for chapter in extra:
        warnings.append(f"warning: submissions of {chapter}, which is not among the "
                        f"chapters graded: in the grade sheet, not in the gradebook")
    for sid, chapter in sorted({(r.student, r.chapter) for r in fixed if r.chapter}):
        n = len({r.source for r in fixed if (r.student, r.chapter) == (sid, chapter)})
        if n > 1:
            warnings.append(f"warning: {sid} handed in {chapter} {n} times: the gradebook "
                            f"counts the best score of each exercise")
    return out, warnings


def scores(rows: list[Row], roster: list[Student], chapters) -> list[dict]:
    """One dict per student of the roster: ``id``, ``name``, each column's header with the
    points scored (``""``: graded by hand) and ``total``."""
    cols = columns(chapters)
    by: dict[tuple, list[Row]] = {}
    for r in rows:
        by.setdefault((r.student, r.chapter, r.exercise), []).append(r)
    table = []
    for s in roster:
        line = {"id": s.id, "name": s.name}
        total = 0
        for c in cols:
            mine = by.get((s.id, c.chapter, c.label), [])
            if any(r.status == "manual" for r in mine):
                line[c.header] = ""
                continue
            line[c.header] = max((r.score for r in mine), default=0)
            total += line[c.header]
        line["total"] = total
        table.append(line)
    return table


def write_gradebook(rows, roster, chapters, path) -> Path:
    """Write the gradebook CSV (:func:`scores`) to ``path``."""
    table = scores(rows, roster, chapters)
    header = ["id", "name", *(c.header for c in columns(chapters)), "total"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)
    return Path(path)


def totals(rows, roster, chapters) -> str:
    """Per student of the roster: the points of the checked exercises out of their sum, and
    the chapters missing."""
    cols = columns(chapters)
    possible = sum(c.points for c in cols if c.op)
    lines = [f"totals (checked exercises, out of {possible}):"]
    for s, line in zip(roster, scores(rows, roster, chapters)):
        checked = sum(line[c.header] for c in cols if c.op)
        missing = [ch for ch in chapters if all(
            r.status == "missing" for r in rows if (r.student, r.chapter) == (s.id, ch))]
        note = (" (no submission)" if len(missing) == len(chapters) else
                f" (missing: {', '.join(missing)})" if missing else "")
        lines.append(f"  {s.id}: {checked}{note}")
    return "\n".join(lines)


def default_gradebook(csv_path) -> Path:
    """Where the gradebook goes by default: ``grades.csv`` -> ``grades-gradebook.csv``."""
    csv_path = Path(csv_path)
    return csv_path.with_name(f"{csv_path.stem}-gradebook.csv")


__all__ = ["Column", "NOT_ON_ROSTER", "chapter_exercises", "columns", "complete",
           "default_gradebook", "scores", "totals", "write_gradebook"]
