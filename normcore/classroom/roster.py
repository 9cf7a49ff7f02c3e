"""Who handed in what: the class list, and each submission's student read from its path.

A **roster** is a CSV file with a header line and one line per student: a column ``id``
(required: the student's id, as it appears in the submissions' paths and as the gradebook of
the course's LMS knows it) and a column ``name`` (optional); other columns are ignored::

    id,name
    alice,Alice Martin
    bob,Bob Chen

A submission's **student** is read from its path relative to the submissions folder by a
regular expression with a named group ``student`` (:func:`student_pattern`), searched in the
path written with ``/``.  The default, :data:`DEFAULT_PATTERN`, takes the first folder
(``alice/02_batch_norm.ipynb`` -> ``alice``) or, for a notebook directly in the folder, its
name (``alice.ipynb`` -> ``alice``).  ``--student-pattern`` sets another, e.g.
``(?P<student>[a-z]+)_\\d+\\.ipynb$`` for ``hw1/alice_02.ipynb``.

The submissions folder is the folder given to ``grade`` (every notebook under it is a
submission, checkpoints excepted), or, for notebooks given one by one, the folder they
share (for a single notebook, its own folder: ``grade submissions/alice/02.ipynb`` reads
the student ``02``; give ``submissions/`` to read ``alice``).
"""
from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path

#: The first folder of the path, or the notebook's name if it has no folder.
DEFAULT_PATTERN = r"^(?P<student>[^/]+?)(?:/|\.ipynb$)"


@dataclass(frozen=True)
class Student:
    """One line of the roster."""

    id: str
    name: str = ""


@dataclass(frozen=True)
class Submission:
    """One notebook handed in: its path, its path relative to the submissions folder (with
    ``/``), the student the pattern read from it, and where in ``relative`` it did."""

    path: Path
    relative: str
    student: str
    span: tuple[int, int]


def read_roster(path) -> list[Student]:
    """The students of the roster CSV ``path``, in its order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")   # a spreadsheet's BOM is not the header
    except OSError as e:
        raise ValueError(f"cannot read the roster {path}: {e.strerror or e}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise ValueError(f"the roster {path} is empty: give a CSV with a header line "
                         f"'id,name' and one line per student")
    header = [h.strip().lower() for h in rows[0]]
    if "id" not in header:
        raise ValueError(f"the roster {path} has no column 'id' (its header is "
                         f"{','.join(rows[0])!r}): its first line must name the columns, "
                         f"e.g. 'id,name'")
    i, n = header.index("id"), header.index("name") if "name" in header else None
    students, seen = [], {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        sid = row[i].strip() if i < len(row) else ""
        if not sid:
            raise ValueError(f"{path}, line {line}: no student id in column 'id' ({row!r})")
        if sid in seen:
            raise ValueError(f"{path}, line {line}: the id {sid!r} is already on line "
                             f"{seen[sid]}: each student once")
        seen[sid] = line
        name = row[n].strip() if n is not None and n < len(row) else ""
        students.append(Student(sid, name))
    if not students:
        raise ValueError(f"the roster {path} lists no student: one line per student under "
                         f"its header")
    return students


def student_pattern(text: str | None) -> re.Pattern:
    """``text`` compiled (:data:`DEFAULT_PATTERN` if ``None``); it must have the group
    ``(?P<student>...)``."""
    text = DEFAULT_PATTERN if text is None else text
    try:
        pattern = re.compile(text)
    except re.error as e:
        raise ValueError(f"the student pattern {text!r} is not a regular expression: {e}") \
            from None
    if "student" not in pattern.groupindex:
        raise ValueError(f"the student pattern {text!r} has no named group "
                         f"(?P<student>...): put the part of the path that is the student's "
                         f"id in one, e.g. '^(?P<student>[^/]+)/'")
    return pattern


def _notebooks(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.ipynb")
                  if p.is_file() and ".ipynb_checkpoints" not in p.parts)


def find_submissions(paths, pattern: re.Pattern | str | None = None
                     ) -> tuple[Path | None, list[Submission]]:
    """The submissions folder and the submissions of ``paths`` (notebooks, or one folder
    whose notebooks are the submissions), each with its student."""
    if not isinstance(pattern, re.Pattern):
        pattern = student_pattern(pattern)
    paths = [Path(p) for p in paths]
    folders = [p for p in paths if p.is_dir()]
    if folders:
        if len(paths) > 1:
            raise ValueError(f"give one submissions folder or notebooks, not both "
                             f"({', '.join(map(str, paths))})")
        folder, notebooks = folders[0], _notebooks(folders[0])
        if not notebooks:
            raise ValueError(f"the submissions folder {folder} holds no notebook (*.ipynb)")
    elif paths:
        notebooks = paths
        folder = Path(os.path.commonpath([str(p.resolve().parent) for p in paths]))
    else:
        return None, []
    found = []
    for p in notebooks:
        relative = Path(os.path.relpath(p.resolve(), folder.resolve())).as_posix()
        m = pattern.search(relative)
        if m is None or not m["student"]:
            what = "does not match" if m is None else "gives an empty student id for"
            raise ValueError(f"the student pattern {pattern.pattern!r} {what} the submission "
                             f"{relative!r} (its path in {folder}): set --student-pattern to "
                             f"a regular expression whose group (?P<student>...) is the "
                             f"student's id in every path")
        found.append(Submission(p, relative, m["student"], m.span("student")))
    return folder, found


def expected_path(like: Submission, student: str) -> str:
    """Where ``student``'s version of the submission ``like`` would be: its relative path
    with the other student's id replaced."""
    start, end = like.span
    return like.relative[:start] + student + like.relative[end:]


__all__ = ["DEFAULT_PATTERN", "Student", "Submission", "expected_path", "find_submissions",
           "read_roster", "student_pattern"]
