"""Grading skips the chapters' training demos and figures (``"normcore": {"grading": "skip"}``).

The static rule (no skipped cell binds a name a later kept cell reads) is checked on the AST
of every chapter; the student notebooks keep the marking; the grader runs a skipped cell as a
comment, deciding from the instructor's chapters when it has them; and the solutions of
every chapter (2-7 and the others with a checked exercise), put back into their student
notebooks, still score full marks with skipping on.
"""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from normcore.classroom import skipping as S
from normcore.classroom.grade import grade_notebook, prepare
from normcore.classroom.marking import marking, read_exercises
from normcore.classroom.plainmd import book_index
from normcore.classroom.student import student_notebook

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9]*.ipynb"))
GRADED = [p for p in CHAPTERS if p.name[:2] in ("02", "03", "04", "05", "06", "07")]
#: every chapter with a checked exercise (all are marked by tools/mark_grading_skips.py)
CODING = [p for p in CHAPTERS if '"role": "check"' in p.read_text(encoding="utf-8")]


def read(path):
    return nbformat.read(path, as_version=4)


def code(source, skip=False, **meta):
    cell = new_code_cell(source, metadata=meta)
    if skip:
        S.mark(cell, True)
    return cell


# =======================================================================================
# the static rule
# =======================================================================================
@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_skipped_cell_binds_a_name_a_kept_cell_reads(path):
    nb = read(path)
    assert S.violations(nb) == []
    for cell in nb.cells:
        if S.is_skipped(cell):
            assert cell.cell_type == "code"
            assert (marking(cell) or {}).get("role") not in ("solution", "check"), cell.id


@pytest.mark.parametrize("path", GRADED, ids=[p.stem for p in GRADED])
def test_chapters_2_to_7_skip_their_demos(path):
    """Most of each chapter's code is skipped; the imports and the exercises are not."""
    nb = read(path)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    skipped = [c for c in cells if S.is_skipped(c)]
    assert len(skipped) >= len(cells) / 2, (len(skipped), len(cells))
    assert not S.is_skipped(cells[0])
    for ex in read_exercises(nb):
        if ex.coding:
            assert not any(S.is_skipped(nb.cells[i]) for i in [*ex.solutions, ex.check])


def test_the_marking_is_the_tools_plan():
    """``tools/mark_grading_skips.py`` marks every chapter as planned (re-run it after editing
    a chapter); running it changes nothing now."""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "mark_grading_skips.py"),
                           "--check", "-q"], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr


def test_an_exercise_reading_a_skipped_name_breaks_the_rule():
    """Chapter 2's first solution, changed to call a helper of a skipped demo cell."""
    nb = read(GRADED[0])
    helper = next(i for i, c in enumerate(nb.cells)
                  if S.is_skipped(c) and c.source.startswith("def linear_fit_r2"))
    solution = next(i for i, c in enumerate(nb.cells)
                    if (marking(c) or {}).get("role") == "solution")
    assert S.violations(nb) == []
    nb.cells[solution].source += "\n\n_r2 = linear_fit_r2"
    assert S.violations(nb) == [(helper, solution, "linear_fit_r2")]


def small(*cells):
    return new_notebook(cells=[code("import torch"), *cells])


def test_rule_on_small_notebooks():
    # read after a skipped binding
    nb = small(code("x = torch.ones(3)", skip=True), code("y = x + 1"))
    assert S.violations(nb) == [(1, 2, "x")]
    # rebound by a kept cell in between: reads the kept one
    nb = small(code("x = 1", skip=True), code("x = 2"), code("print(x)"))
    assert S.violations(nb) == []
    # a skipped cell that changes an object a kept cell made: a method call, an attribute,
    # an item, an in-place op, a call of the object itself (a module's running statistics)
    for change in ("m.train()", "m.weight = None", "m[0] = 1", "m.add_(1)", "m(x)",
                   "m += 1"):
        nb = small(code("m = torch.nn.BatchNorm1d(3)\nx = 1"), code(change, skip=True),
                   code("print(m)"))
        assert S.violations(nb) == [(2, 3, "m")], change
    # reading it without changing it is fine; so is a figure-only name
    nb = small(code("m = torch.zeros(3)"), code("print(m.mean())\nfig = 1", skip=True),
               code("print(m)\nprint(fig)"))
    assert S.violations(nb) == []
    # a name bound inside a function, a comprehension or as a parameter is not read
    nb = small(code("z = 1", skip=True),
               code("def f(z):\n    return z\n[z for z in range(3)]\nlambda z: z"))
    assert S.violations(nb) == []
    # a global read inside a function is read (when the function is called: conservative)
    nb = small(code("z = 1", skip=True), code("def f():\n    return z"))
    assert S.violations(nb) == [(1, 2, "z")]
    # IPython magics are left out; a cell magic does not parse and cannot be skipped
    assert S.cell_names("%matplotlib inline\nimport numpy as np")[0] == {"np"}
    nb = small(code("%%time\nx = 1", skip=True))
    assert S.violations(nb) == [(1, 1, "<unparsed>")]


def test_plan_keeps_imports_state_and_what_exercises_read():
    ex = {"exercise": "ex-a"}
    nb = new_notebook(cells=[
        code("import torch"),
        code("torch.set_default_dtype(torch.float64)"),
        code("helper = 2"),
        code("demo = torch.randn(1000)\nprint(demo.mean())"),
        code("def f(x):\n    ### BEGIN SOLUTION\n    return helper * x\n    ### END SOLUTION",
             normcore={**ex, "role": "solution"}),
        code('report = exercises.check("batch_norm", f)\nprint(report)\n'
             "assert report.passed", normcore={**ex, "role": "check"}),
        code("print(demo.std())"),
    ])
    assert S.plan(nb) == {3, 6}
    assert S.violations(nb, S.plan(nb)) == []


def test_mark_keeps_other_keys_and_is_idempotent():
    cell = code("x = 1", normcore={"exercise": "ex-a", "role": "solution"}, tags=["t"])
    assert S.mark(cell, True) and not S.mark(cell, True)
    assert cell.metadata == {"normcore": {"exercise": "ex-a", "role": "solution",
                                          "grading": "skip"}, "tags": ["t"]}
    assert S.mark(cell, False) and not S.mark(cell, False)
    assert cell.metadata == {"normcore": {"exercise": "ex-a", "role": "solution"},
                             "tags": ["t"]}
    alone = code("x = 1", skip=True)
    assert S.mark(alone, False) and alone.metadata == {}
    assert S.skipped_source("\n\n  for i in range(3):\n    pass") == \
        "# skipped when grading: for i in range(3):"


# =======================================================================================
# the student notebook and the grader
# =======================================================================================
@pytest.fixture(scope="module")
def index():
    return book_index(ROOT / "chapters")


def test_student_notebook_keeps_the_skip_marking(index):
    chapter = read(GRADED[0])
    ids = S.skipped_ids(chapter)
    student = student_notebook(chapter, GRADED[0].stem, index)
    assert ids and {c.id for c in student.cells if S.is_skipped(c)} == ids
    for cell in student.cells:
        if cell.id in ids:
            assert cell.metadata["normcore"] == {"grading": "skip"}
        else:
            assert "normcore" not in cell.metadata


def prepared_skips(nb, skip, source):
    manifest = nb.metadata["normcore"]["classroom"]
    prepared, _ = prepare(S.with_skips(nb, skip, source), manifest)
    return {c.id for c in prepared.cells
            if c.cell_type == "code" and c.source.startswith("# skipped when grading: ")}


def test_the_grader_skips_what_the_instructors_chapter_marks(index):
    chapter = read(GRADED[0])
    ids, name = S.skipped_ids(chapter), GRADED[0].stem
    student = student_notebook(chapter, name, index)
    # the submission's own marking, when the grader has no chapters
    assert prepared_skips(student, None, name) == ids
    first = next(c for c in student.cells if c.id in ids)
    prepared = prepare(student, student.metadata["normcore"]["classroom"])[0]
    assert next(c for c in prepared.cells if c.id == first.id).source == \
        f"# skipped when grading: {S.first_line(first.source)}"
    # a student who deletes the marking and marks a check cell instead
    edited = copy.deepcopy(student)
    S.unmark(edited)
    check = next(c for c in edited.cells
                 if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("-check"))
    S.mark(check, True)
    assert prepared_skips(edited, None, name) == set()   # never an exercise's cell
    # ... is graded as the instructor's chapter says (``grade --chapters``)
    chapters = S.chapter_skips([GRADED[0]])
    assert chapters == {name: ids}
    assert prepared_skips(edited, chapters, name) == ids
    # a submission of another chapter keeps its own marking; --no-skip runs everything
    assert prepared_skips(edited, {"other": ids}, name) == set()
    assert prepared_skips(student, False, name) == set()


def solved(chapter, student):
    """``student`` with the chapter's solution cells put back (by cell id)."""
    nb = copy.deepcopy(student)
    solutions = {c.id: c.source for c in chapter.cells
                 if (marking(c) or {}).get("role") == "solution"}
    for cell in nb.cells:
        if cell.id in solutions and cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = solutions[cell.id]
    return nb


@pytest.mark.parametrize("path", CODING, ids=[p.stem for p in CODING])
def test_solutions_score_full_marks_with_skipping(path, index):
    chapter = read(path)
    nb = solved(chapter, student_notebook(chapter, path.stem, index))
    skip = S.chapter_skips([path])
    rows, ran = grade_notebook(nb, "alice", cell_timeout=120, timeout=600, skip=skip)
    coding = [r for r in rows if r.op]
    assert coding and all(r.status == "passed" and r.score == r.points for r in coding), [
        (r.exercise, r.status, r.detail) for r in coding if r.status != "passed"]
    errors = {i: e for i, e in ran["cells"].items() if e["status"] == "error"}
    assert not errors, errors
    assert len(skip[path.stem]) >= 10


def test_a_solution_reading_a_skipped_name_is_an_error_row(index):
    """What the rule cannot see: a student's solution that calls a skipped demo's helper.
    The row says so (the classroom page: grade that notebook again with ``--no-skip``)."""
    path = GRADED[0]
    chapter = read(path)
    nb = solved(chapter, student_notebook(chapter, path.stem, index))
    first = next(c for c in nb.cells
                 if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("-solution"))
    first.source = first.source.replace("### BEGIN SOLUTION\n",
                                        "### BEGIN SOLUTION\n    linear_fit_r2\n", 1)
    rows, _ = grade_notebook(nb, "bob", cell_timeout=120, timeout=600,
                             skip=S.chapter_skips([path]))
    row = next(r for r in rows if r.op)
    assert row.status == "error" and "NameError" in row.detail, row
    assert all(r.status == "passed" for r in rows if r.op and r is not row)
