"""Answers graded by hand: exported for the instructor, and the scores merged back.

Two kinds of answer are graded by hand, both rows of status ``manual`` in the grade sheet
(:mod:`.grade`): a derivation (row ``<label>``) and the written part of a coding exercise
(row ``<label>:written``, the question its statement asks in words).  The grader cannot
score them; it says whether the student wrote anything, and keeps what they wrote.

* :func:`write_answers` writes, into one folder (``grades-answers/`` beside the CSV by
  default), one Markdown file per such exercise with every student's answer under their
  name (each quoted, so that a student's own headings stay inside it), headed by the
  question and the chapter's model answer when the chapters are given (:func:`models`:
  the prose of the exercise's solution, and a derivation's solution code), and
  ``manual.csv``, one line per student and answer: ``student, chapter, exercise, points,
  score, detail``, the score left empty for the instructor to fill in;
* :func:`merge` folds the filled-in ``manual.csv`` into the rows of the grade sheet (read
  back with :func:`read_grades`): each scored line sets its row's score and its status to
  ``graded by hand``, which the gradebook (:mod:`.gradebook`) then counts in ``total``.  A
  line left empty changes nothing; a score out of range, a student or an exercise the grade
  sheet does not have, a line twice, is a :class:`ManualError` that names the line and the
  fix, and nothing is merged.

``python -m normcore.classroom merge grades.csv manual.csv`` does the second step (and
rewrites the gradebook with ``--roster`` and ``--chapters``).
"""
from __future__ import annotations

import copy
import csv
import re
from pathlib import Path

import nbformat

from .grade import COLUMNS, WRITTEN, Row
from .marking import has_solutions, read_exercises, source_text

#: The statuses of an answer graded by hand: before and after its score is merged in.
MANUAL, GRADED = "manual", "graded by hand"
#: ``manual.csv``'s columns.
MANUAL_COLUMNS = ("student", "chapter", "exercise", "points", "score", "detail")


class ManualError(ValueError):
    """The instructor's ``manual.csv`` cannot be merged: which line, and what to change."""


def _points(n) -> str:
    return f"{n} point" + ("" if n == 1 else "s")


def _number(text: str):
    """``"2"`` -> 2, ``"0.5"`` -> 0.5 (a score or points as the CSV holds them)."""
    value = float(text)
    return int(value) if value.is_integer() else value


def _after_directive(source: str) -> str:
    """The markdown after the opening directive of a cell (````{solution-start} ...````)."""
    lines = source.split("\n")
    fence = re.match(r"^(`{3,}|:{3,})", lines[0])
    if fence is None:
        return source.strip()
    end = next((j for j in range(1, len(lines)) if lines[j].strip() == fence[1]), 0)
    return "\n".join(lines[end + 1:]).strip()


def models(paths) -> dict[tuple[str, str], dict[str, str]]:
    """The question and the model answer of every answer graded by hand in the chapters
    ``paths`` (the book's, with their solutions), by ``(chapter, exercise)`` as the grade
    sheet names them: ``{"question": ..., "answer": ...}``, both MyST markdown."""
    found = {}
    for path in map(Path, paths):
        nb = nbformat.read(path, as_version=4)
        if not has_solutions(nb):
            continue   # a student version or a copy without solutions: no model answer
        for ex in read_exercises(nb, path.name):
            if ex.coding and not ex.written:
                continue
            prose = _after_directive(source_text(nb.cells[ex.solution_start]))
            if not ex.coding:   # a derivation: its solution cells assert the numbers
                code = "\n\n".join(source_text(nb.cells[i]) for i in ex.solutions)
                prose += f"\n\n```python\n{code}\n```"
            label = ex.label + (WRITTEN if ex.coding else "")
            found[path.stem, label] = {"question": source_text(nb.cells[ex.statement]),
                                       "answer": prose.strip()}
    return found


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.split("\n"))


def answers_file(label: str, chapter: str, rows: list[Row], model: dict | None = None,
                 names: dict[str, str] | None = None) -> str:
    """The Markdown file of one exercise: the question and the model answer (``model``, from
    :func:`models`), then each student's answer under their name (``names``: id -> name)."""
    names = names or {}
    lines = [f"# {label} ({chapter}, {_points(rows[0].points)})", ""]
    if model:
        lines += ["## The question", "", model["question"], "",
                  "## The model answer", "", model["answer"], ""]
    else:
        lines += [("(Pass the book's chapters with --chapters to see the question and the "
                   "model answer here.)"), ""]
    lines += ["## The answers", ""]
    for row in rows:
        name = names.get(row.student)
        lines += [f"### {f'{name} ({row.student})' if name else row.student}", ""]
        lines += [_quoted(row.answer) if row.answer else f"*({row.detail})*", ""]
    return "\n".join(lines).rstrip() + "\n"


def manual_rows(rows: list[Row]) -> list[Row]:
    """The rows graded by hand (the roster's missing work is not: it scores 0)."""
    return [r for r in rows if r.status in (MANUAL, GRADED)]


def write_answers(rows: list[Row], folder, chapters=None, names=None) -> list[Path]:
    """Write one ``<exercise>.md`` per answer graded by hand (``chapters``: the book's
    chapters, for the question and the model answer; ``names``: id -> name) and
    ``manual.csv`` into ``folder``; the paths, ``manual.csv`` last (none without such
    rows)."""
    mine = manual_rows(rows)
    if not mine:
        return []
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the answers folder {folder} is a file: give a folder (new or "
                         f"existing) with --answers DIR")
    folder.mkdir(parents=True, exist_ok=True)
    found = models(chapters) if chapters else {}
    keys = list(dict.fromkeys((r.chapter, r.exercise) for r in mine))
    labels = [label for _, label in keys]
    written = []
    for chapter, label in keys:
        stem = label if labels.count(label) == 1 else f"{chapter}-{label}"
        path = folder / (re.sub(r"[^\w.-]+", "-", stem) + ".md")
        these = [r for r in mine if (r.chapter, r.exercise) == (chapter, label)]
        path.write_text(answers_file(label, chapter, these, found.get((chapter, label)), names),
                        encoding="utf-8")
        written.append(path)
    path = folder / "manual.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(MANUAL_COLUMNS)
        for r in mine:
            writer.writerow([r.student, r.chapter, r.exercise, r.points,
                             r.score if r.status == GRADED else "", r.detail])
    return written + [path]


def default_folder(csv_path) -> Path:
    """Where the answers go by default: ``grades.csv`` -> ``grades-answers/`` beside it."""
    csv_path = Path(csv_path)
    return csv_path.with_name(f"{csv_path.stem}-answers")


def read_grades(path) -> list[Row]:
    """The rows of a grade sheet written by ``grade`` (:func:`.grade.write_csv`)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ManualError(f"{path}: not a grade sheet of `grade` (no column "
                              f"{', '.join(missing)}): give the CSV that `grade --out` wrote")
        rows = []
        for line in reader:
            values = {c: line[c] or "" for c in COLUMNS}
            values["points"] = _number(values["points"] or "0")
            values["score"] = _number(values["score"] or "0")
            rows.append(Row(**values))
    return rows


def _score(text: str, points, where: str):
    try:
        score = _number(text)
    except ValueError:
        raise ManualError(f"{where}: score {text!r} is not a number: give a number from 0 "
                          f"to {points}, or leave it empty") from None
    if not 0 <= score <= points:
        raise ManualError(f"{where}: score {text} is {'above' if score > points else 'below'}"
                          f" the range of this answer's {_points(points)}: give a number "
                          f"from 0 to {points}")
    return score


def _target(rows: list[Row], line: dict, where: str) -> Row:
    """The row of the grade sheet that a line of ``manual.csv`` scores."""
    student, exercise, chapter = ((line.get(c) or "").strip()
                                  for c in ("student", "exercise", "chapter"))
    theirs = [r for r in rows if r.student == student]
    if not theirs:
        known = ", ".join(dict.fromkeys(r.student for r in rows))
        raise ManualError(f"{where}: student {student!r} is not in the grade sheet (it has "
                          f"{known}): correct the id, or delete the line")
    same = [r for r in theirs if r.exercise == exercise and chapter in ("", r.chapter)]
    manual = [r for r in same if r.status in (MANUAL, GRADED)]
    if not manual:
        hand = ", ".join(dict.fromkeys(r.exercise for r in theirs
                                       if r.status in (MANUAL, GRADED))) or "none"
        why = (f"is {same[0].status}, not graded by hand" if same else
               f"is not an exercise of {student}'s in the grade sheet"
               + (f" (in chapter {chapter})" if chapter else ""))
        raise ManualError(f"{where}: exercise {exercise!r} {why}: give one of {student}'s "
                          f"answers graded by hand ({hand}), or delete the line")
    return manual[0]


def merge(rows: list[Row], path) -> tuple[list[Row], int, int]:
    """``rows`` (not modified) with the scores of the instructor's ``manual.csv`` at ``path``
    merged in, the number of answers scored, and the number of manual rows still
    unscored."""
    rows = copy.deepcopy(rows)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        need = [c for c in ("student", "exercise", "score") if c not in (reader.fieldnames or ())]
        if need:
            raise ManualError(f"{path}: no column {', '.join(need)}: give the manual.csv that "
                              f"`grade` wrote, with the column 'score' filled in")
        lines = list(reader)
    seen: dict[int, int] = {}
    scores = []
    for k, line in enumerate(lines, start=2):   # line 1 is the header
        where = f"{path}, line {k}"
        row = _target(rows, line, where)
        if id(row) in seen:
            raise ManualError(f"{where}: {row.student}'s {row.exercise} is scored on line "
                              f"{seen[id(row)]} already: keep one of the two lines")
        seen[id(row)] = k
        text = (line.get("score") or "").strip()
        if text:
            scores.append((row, _score(text, row.points, where)))
    for row, score in scores:   # every line is checked before one is merged
        row.score, row.status = score, GRADED
    left = sum(r.status == MANUAL for r in rows)
    return rows, len(scores), left


__all__ = ["GRADED", "MANUAL", "MANUAL_COLUMNS", "ManualError", "answers_file",
           "default_folder", "manual_rows", "merge", "models", "read_grades", "write_answers"]
