"""nbgrader source notebooks: a chapter as nbgrader's ``generate_assignment`` reads it.

nbgrader (https://nbgrader.readthedocs.io) keeps a course in one folder::

    course/
      nbgrader_config.py                 c.CourseDirectory.course_id = "..."
      source/<assignment>/<notebook>.ipynb     the instructor's version: solutions, hidden tests
      release/<assignment>/<notebook>.ipynb    nbgrader generate_assignment <assignment>
      submitted/<student>/<assignment>/...      what students hand in (nbgrader collect)
      autograded/<student>/<assignment>/...     nbgrader autograde <assignment>
      gradebook.db                       scores, per cell

:func:`source_notebook` writes the ``source`` version of a chapter: one assignment is one
folder of ``source/``, holding one or more chapters under their own names
(``python -m normcore.classroom nbgrader-source CHAPTER.ipynb ... -o course/source/ps1``).
From it, ``nbgrader generate_assignment`` writes the *same* notebook as
``python -m normcore.classroom student`` (:mod:`.student`): the same cells in the same order
with the same sources and ids, the same stubs under the kept ``def`` line, the manifest in
the notebook's metadata; nbgrader only adds its own cell metadata (``checksum``,
``cell_type``, ``deletable``, ``editable``).  The source is the student notebook with three
differences:

* each coding exercise's solution cell holds the chapter's solution, the body between
  ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (nbgrader's ``ClearSolutions`` replaces
  the region by the stub ``# YOUR CODE HERE`` / ``raise NotImplementedError()`` at the
  marker's indentation, exactly as :func:`~.student.stub_source` does);
* each check cell (an autograded test cell with the exercise's points) holds, after the
  visible check the student sees, the hidden check between ``### BEGIN HIDDEN TESTS`` and
  ``### END HIDDEN TESTS`` (:func:`hidden_check`), which ``generate_assignment`` removes
  and ``autograde`` puts back (it overwrites every test cell with the source's);
* a derivation's answer cell, a manually graded markdown cell, reads ``YOUR ANSWER HERE``
  in both (nbgrader's text stub).

What nbgrader does not give: its autograder runs the hidden check in the student's kernel,
after the student's own cells, so a student who replaces ``exercises.check`` in a cell of
theirs passes it.  ``python -m normcore.classroom grade`` checks the functions outside the
student's kernel.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path


from .marking import Exercise, MarkingError, exercises_in, has_solutions, source_text
from .plainmd import BookIndex
from .student import student_notebook, stub_source, write_version

HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"
#: Text that nbgrader's generate_assignment acts on in any cell: a solution region (it
#: refuses one outside a solution cell), a hidden-test region (refused outside a test
#: cell), a mark scheme, an autotest directive.
NBGRADER_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS",
                    "END HIDDEN TESTS", "BEGIN MARK SCHEME", "END MARK SCHEME", "AUTOTEST")


def hidden_check(entry: dict) -> str:
    """The hidden check of a coding exercise, from its manifest entry
    (:func:`~.student.manifest`): the checker on its hidden inputs, with the exercise's
    rules (what the function must not use) when it has some."""
    rules = [json.dumps(str(r)) for r in entry.get("rules") or ()]
    call = (f'report = exercises.check("{entry["op"]}", {entry["function"]}'
            f'{entry.get("options") or ""}, hidden=True')
    if rules:
        listed = f"rules=({', '.join(rules)}{',' if len(rules) == 1 else ''})"
        # one line, or the rules under the call's first argument, as the student's check
        wrap = "\n" + " " * call.index("(") if len(call) + len(listed) + 3 > 79 else ""
        call = f"{call},{wrap} {listed}"
    return f"{call})\nprint(report)\nassert report.passed"


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _refuse_stray_markers(nb, exercises: list[Exercise], name: str) -> None:
    """nbgrader reads its markers in every cell: a chapter cell outside the solutions that
    contains one would be cut or refused by ``generate_assignment``."""
    solutions = {i for ex in exercises for i in ex.solutions}
    for i, cell in enumerate(nb["cells"]):
        text = source_text(cell)
        found = [m for m in NBGRADER_MARKERS if m in text]
        if i in solutions:
            found = [m for m in found if m not in ("BEGIN SOLUTION", "END SOLUTION")]
        if found:
            raise MarkingError(
                f"{name}, cell {i}: contains {found[0]!r}, which nbgrader's "
                f"generate_assignment reads as its own marker in any cell; reword that "
                f"cell (only a solution cell may hold ### BEGIN/END SOLUTION)")


def source_notebook(nb: dict, name: str = "notebook", index: BookIndex | None = None) -> dict:
    """The nbgrader source version of the chapter ``nb`` (a notebook dict, not modified),
    named ``name``; ``index`` as for :func:`~.student.student_notebook` (plain markdown
    with it, MyST without).  ``nbgrader generate_assignment`` turns it into
    ``student_notebook(nb, name, index)``."""
    if not has_solutions(nb):
        raise ValueError(f"{name}: a copy without solutions; an nbgrader source needs the "
                         f"solutions: give the book's chapter")
    exercises = exercises_in(nb, name)
    _refuse_stray_markers(nb, exercises, name)
    out = copy.deepcopy(student_notebook(nb, name, index))
    entries = {e["label"]: e for e in out["metadata"]["normcore"]["classroom"]["exercises"]}
    coding = [ex for ex in exercises if ex.coding]
    solutions = sorted(i for ex in coding for i in ex.solutions)
    checks = sorted(coding, key=lambda ex: ex.check)
    stubs = [c for c in out["cells"] if c["cell_type"] == "code" and _nbgrader(c).get("solution")]
    tests = [c for c in out["cells"] if c["cell_type"] == "code" and _nbgrader(c).get("grade")
             and not _nbgrader(c).get("solution")]
    if len(stubs) != len(solutions) or len(tests) != len(checks):
        raise AssertionError(f"{name}: the student notebook has {len(stubs)} solution and "
                             f"{len(tests)} test cells for {len(solutions)} and {len(checks)}")
    for cell, i in zip(stubs, solutions):
        solution = source_text(nb["cells"][i])
        # what nbgrader's ClearSolutions gives back must be the student's stub
        if stub_source(solution) != cell["source"]:
            raise AssertionError(f"{name}, cell {i}: the stub is not the solution's")
        cell["source"] = solution
    for cell, ex in zip(tests, checks):
        if _nbgrader(cell)["grade_id"] != f"{ex.label}-check":
            raise AssertionError(f"{name}: test cell {_nbgrader(cell)['grade_id']} is not "
                                 f"{ex.label}'s")
        cell["source"] = "\n".join([cell["source"], HIDDEN_BEGIN,
                                    hidden_check(entries[ex.label]), HIDDEN_END])
    return out


def write_source(chapter: str | Path, out_dir: str | Path, *, myst: bool = False,
                 index: BookIndex | None = None) -> Path:
    """Write the nbgrader source version of ``chapter`` into ``out_dir`` (an assignment's
    folder, ``course/source/<assignment>``) under the chapter's name; markdown as
    :func:`~.student.write_student` writes it."""
    return write_version(chapter, out_dir, source_notebook, myst=myst, index=index)


__all__ = ["HIDDEN_BEGIN", "HIDDEN_END", "hidden_check", "source_notebook", "write_source"]
