"""Student notebooks: a chapter with its solutions replaced by stubs.

:func:`student_notebook` keeps every cell of the chapter except the solutions:

* the code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes nbgrader's stub
  (``# YOUR CODE HERE`` then ``raise NotImplementedError()``, at the marker's
  indentation), so the ``def`` line above the markers keeps the signature;
* a derivation (an exercise without a check cell) gets an empty answer cell instead of
  its solution cells;
* a coding exercise with a written part (statement metadata ``"written": {"points": P}``)
  gets an empty answer cell after its check cell, graded by hand (``<label>-written``),
  and its statement a line saying so;
* the ``{solution-start}``/``{solution-end}`` cells and the solution's prose are dropped;
* every stored output is cleared; the check cells are kept and locked;
* the exercise marking is dropped from the cells' metadata, and the mark of a cell grading
  may skip (``"normcore": {"grading": "skip"}``, :mod:`.skipping`) kept;
* cells carry nbgrader's metadata (``schema_version`` 3, ``grade``, ``solution``,
  ``locked``, ``grade_id``, ``points``), and the notebook's metadata the list of exercises
  (``metadata.normcore.classroom``) that :mod:`normcore.classroom.grade` reads.

* every markdown cell is rewritten from MyST to plain CommonMark and MathJax math
  (:mod:`normcore.classroom.plainmd`) when a :class:`~.plainmd.BookIndex` is given, as
  :func:`write_student` does by default: the student notebook reads in plain Jupyter,
  without the jupyterlab-myst extension.  Each exercise's statement then opens with
  ``**Exercise 2.1** (`ex-bn-forward`, 2 points: 1 for the set, 1 for ...)``, its number in
  the book, its label, its points and how its rubric splits them.

The output is deterministic: the same chapter gives the same bytes.
"""
from __future__ import annotations

import copy
import warnings
from pathlib import Path

import nbformat

from normcore.exercises.credit import describe, ordered

from .marking import BEGIN, END, Exercise, exercises_in, solution_regions, source_text
from .plainmd import BookIndex, book_index, to_plain
from .skipping import SKIP, is_skipped

STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
ANSWER = "YOUR ANSWER HERE"
NBGRADER_SCHEMA = 3
#: Notebook metadata that only concerns the chapter's rendering (widget state).
_DROP_NOTEBOOK_METADATA = ("widgets",)


def stub_source(source: str) -> str:
    """``source`` with each solution region replaced by nbgrader's stub."""
    lines = source.split("\n")
    out, last = [], 0
    for begin, end in solution_regions(source):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        out += lines[last:begin] + [indent + s for s in STUB]
        last = end + 1
    out += lines[last:]
    return "\n".join(out)


def with_rules(check: str, rules) -> str:
    """The check cell ``check`` with the exercise's ``rules`` passed to ``exercises.check``,
    so that the student's own check fails a forbidden tool as the grader does."""
    if not rules:
        return check
    head, sep, rest = check.partition("\nprint(report)")
    if not sep or not head.rstrip().endswith(")"):
        raise ValueError(f"a check cell that does not end its call on one line: {check!r}")
    head = head.rstrip()
    listed = "(" + ", ".join(f'"{r}"' for r in rules) + ("," if len(rules) == 1 else "") + ")"
    one_line = f"{head[:-1]}, rules={listed})"
    if len(one_line) <= 79:
        return f"{one_line}{sep}{rest}"
    indent = " " * (head.index("(") + 1)
    return f"{head[:-1]},\n{indent}rules={listed}){sep}{rest}"


def nbgrader(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    """nbgrader's cell metadata (schema version 3)."""
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked,
            "schema_version": NBGRADER_SCHEMA, "solution": solution}
    if grade:
        meta["points"] = points
    return meta


def _clean(cell) -> dict:
    cell = copy.deepcopy(cell)
    meta = cell.setdefault("metadata", {})
    if is_skipped(cell):   # the grader reads it (.skipping); the exercise marking goes
        meta["normcore"] = dict(SKIP)
    else:
        meta.pop("normcore", None)
    meta.pop("execution", None)
    if cell["cell_type"] == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    return cell


def manifest(exercises: list[Exercise], source: str) -> dict:
    """What the grader needs to know of the exercises (``metadata.normcore.classroom``)."""
    return {"source": source, "exercises": [
        {"label": e.label, "points": e.points, "op": e.op, "function": e.function,
         "options": e.options, "rules": list(e.rules), "rubric": ordered(e.grading, e.op),
         **({"written": e.written} if e.written else {})}
        for e in exercises]}


class MystLeftWarning(UserWarning):
    """A student notebook keeps MyST the plain-markdown rewriting does not know."""


def _points(ex: Exercise) -> str:
    """The statement's note: ``, 2 points`` or, with a rubric, ``, 2 points: 1 for the set,
    1 for the variance and eps``, and ``+ 1 for the answer in words`` for a written part."""
    text = f", {describe(ex.grading, ex.points, ex.op)}"
    return text + (f" + {ex.written} for the answer in words" if ex.written else "")


def written_line(points: int) -> str:
    """The line a statement with a written part ends with in the student notebook."""
    return (f"*Answer the question in words in the answer cell after the check "
            f"({points} point{'' if points == 1 else 's'}, graded by hand).*")


def answer_cell(grade_id: str, points: int) -> dict:
    """An empty markdown answer cell, graded by hand (nbgrader: solution and grade)."""
    meta = {"nbgrader": nbgrader(grade_id, solution=True, grade=True, points=points)}
    return nbformat.v4.new_markdown_cell(ANSWER, id=grade_id[:64], metadata=meta)


def student_notebook(nb: dict, name: str = "notebook", index: BookIndex | None = None) -> dict:
    """The student version of the chapter ``nb`` (a notebook dict, not modified), named
    ``name`` (its file's stem). With ``index`` (:func:`~.plainmd.book_index`), the markdown
    is plain CommonMark (what it cannot rewrite stays, with a :class:`MystLeftWarning`);
    without, it stays MyST. From a copy without solutions (:mod:`.nosolutions`) it has the
    statements and no solution cells to fill in: make a class's notebooks from the book's
    chapters."""
    exercises = exercises_in(nb, name)
    notes = {e.label: _points(e) for e in exercises}
    left: list[str] = []
    role_of: dict[int, tuple[Exercise, str]] = {}
    for ex in exercises:
        role_of[ex.statement] = (ex, "statement")
        role_of[ex.solution_start] = (ex, "drop")
        role_of[ex.solution_end] = (ex, "drop")
        for k, i in enumerate(ex.solutions):
            role_of[i] = (ex, "solution" if ex.coding else ("answer" if k == 0 else "drop"))
        if ex.check is not None:
            role_of[ex.check] = (ex, "check")
    cells = []
    for i, cell in enumerate(nb["cells"]):
        ex, role = role_of.get(i, (None, "keep"))
        if role == "drop":
            continue
        if role == "answer":
            cells.append(answer_cell(f"{ex.label}-answer", ex.points))
            continue
        new = _clean(cell)
        if index is not None and new["cell_type"] == "markdown":
            new["source"], unknown = to_plain(source_text(cell), index, name, notes)
            left += unknown
        if role == "statement":
            new["metadata"]["nbgrader"] = nbgrader(f"{ex.label}-statement", locked=True)
            if ex.written:
                new["source"] = f"{source_text(new).rstrip()}\n\n{written_line(ex.written)}"
        elif role == "solution":
            new["source"] = stub_source(source_text(cell))
            k = ex.solutions.index(i)
            suffix = "" if len(ex.solutions) == 1 else f"-{k + 1}"
            new["metadata"]["nbgrader"] = nbgrader(f"{ex.label}-solution{suffix}",
                                                   solution=True)
        elif role == "check":
            new["source"] = with_rules(source_text(cell), ex.rules)
            new["metadata"]["nbgrader"] = nbgrader(f"{ex.label}-check", grade=True, locked=True,
                                                   points=ex.points)
        cells.append(new)
        if ex is not None and ex.written and i == (ex.check if ex.coding else ex.statement):
            cells.append(answer_cell(f"{ex.label}-written", ex.written))
    meta = {k: v for k, v in copy.deepcopy(nb.get("metadata", {})).items()
            if k not in _DROP_NOTEBOOK_METADATA}
    meta.setdefault("normcore", {})["classroom"] = manifest(exercises, name)
    out = nbformat.v4.new_notebook(cells=cells, metadata=meta)
    out.nbformat_minor = max(nb.get("nbformat_minor", 5), 5)  # 4.5: cells have ids
    if left:
        warnings.warn(f"{name}: left as MyST (not known to the plain-markdown rewriting): "
                      f"{', '.join(dict.fromkeys(left))}", MystLeftWarning, stacklevel=2)
    return out


def dumps(nb) -> str:
    """The notebook as nbformat writes it (sorted keys, one-space indent): deterministic."""
    return nbformat.writes(nbformat.from_dict(nb))


def write_version(chapter: str | Path, out_dir: str | Path, make, *, myst: bool = False,
                  index: BookIndex | None = None) -> Path:
    """Write ``make(nb, name, index)`` of ``chapter`` (a version of it: the student's, or
    nbgrader's source) into ``out_dir`` under the chapter's name. Its markdown is plain
    (looked up in ``index``, by default :func:`~.plainmd.book_index` of the chapter's
    folder), or MyST as in the chapter with ``myst=True``."""
    chapter, out_dir = Path(chapter), Path(out_dir)
    nb = nbformat.reads(chapter.read_text(encoding="utf-8"), as_version=4)
    if not myst and index is None:
        index = book_index(chapter.parent)
    version = make(nb, chapter.stem, None if myst else index)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / chapter.name
    if target.resolve() == chapter.resolve():
        raise ValueError(f"{target} is the chapter itself: choose another output directory")
    target.write_text(dumps(version), encoding="utf-8")
    return target


def write_student(chapter: str | Path, out_dir: str | Path, *, myst: bool = False,
                  index: BookIndex | None = None) -> Path:
    """Write the student version of ``chapter`` into ``out_dir`` under the same name
    (:func:`write_version`)."""
    return write_version(chapter, out_dir, student_notebook, myst=myst, index=index)


__all__ = ["student_notebook", "write_student", "stub_source", "dumps", "MystLeftWarning",
           "BEGIN", "END"]
