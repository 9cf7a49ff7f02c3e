"""The classroom tools: student notebooks from marked chapters, and grading submissions.

The grading tests plant submissions in a small marked chapter built here (one exercise per
known misconception of four ops, plus broken ones), grade them in fresh kernels with small
time limits, and read the rows.  The chapters of the book are turned into student notebooks
and executed: nothing fails but the stubs, which the checkers report as not implemented.
"""
from __future__ import annotations

import ast
import copy
import csv
import difflib
import functools
import hashlib
import inspect
import io
import json
import os
import re
import sys
import tokenize
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import test_exercises as student_style
from normcore import exercises
from normcore.classroom import MarkingError, read_exercises, student_notebook
from normcore.classroom.__main__ import main
from normcore.classroom.feedback import default_folder, file_name, write_feedback
from normcore.classroom.grade import grade, grade_notebook, summary, write_csv
from normcore.classroom.marking import marking, solution_lines, source_text
from normcore.classroom.plainmd import BookIndex, book_index
from normcore.classroom.student import dumps, write_student

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9]*.ipynb"))
# grading runs notebooks and the grader's own processes: minutes on a loaded 2-core machine
pytestmark = pytest.mark.timeout(900)
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


# =======================================================================================
# a marked chapter, built here
# =======================================================================================
def mark(label, role, **extra):
    return {"normcore": {"exercise": label, "role": role, **extra}}


def exercise_cells(label, op, fn, body, points=1, options="", check=True, rules=None):
    """The five cells of one coding exercise (four without ``check``)."""
    args = exercises.signature(op)[2:-1] if op else ""
    extra = {"rules": list(rules)} if rules else {}
    cells = [
        new_markdown_cell(f"````{{exercise}}\n:label: {label}\n\nWrite `{fn}`.\n````",
                          metadata=mark(label, "statement", points=points, **extra)),
        new_markdown_cell(f"````{{solution-start}} {label}\n:class: dropdown\n````\n"
                          f"Hint only the solution shows ({label}).",
                          metadata=mark(label, "solution-start")),
        new_code_cell(f"def {fn}({args}):\n    ### BEGIN SOLUTION\n{body}\n"
                      f"    ### END SOLUTION" if op else body,
                      metadata=mark(label, "solution")),
        new_markdown_cell("````{solution-end}\n````", metadata=mark(label, "solution-end")),
    ]
    if check:
        cells.append(new_code_cell(
            f'report = exercises.check("{op}", {fn}{options})\nprint(report)\n'
            f"assert report.passed", metadata=mark(label, "check")))
    return cells


def call(fn_name, op):
    return f"    return {fn_name}({exercises.signature(op)[2:-1]})"


OPS4 = ("batch_norm", "layer_norm", "running_update", "weight_standardize")
#: one planted exercise per known misconception of four ops: (label, op, options text,
#: the student-style function, the keys it must be named as)
PLANTED = []
for _op, _fn, _options, _keys, _ in student_style.DIAGNOSES:
    if _op in OPS4:
        _text = "".join(f", {k}={v!r}" for k, v in _options.items())
        PLANTED.append((f"ex-{_fn.__name__.replace('_', '-')}", _op, _text, _fn, _keys))
CORRECT = {"batch_norm": "bn_correct", "layer_norm": "ln_correct",
           "running_update": "running_correct", "weight_standardize": "ws_original"}


def correct_for(op, options_text):
    if op == "weight_standardize" and "convention" in options_text:
        return "ws_bit"  # right for 'bit' and 'timm'
    return CORRECT[op]


HELPERS = ["bn_dims", "per_channel", "bn_stats", "_ws_dims", "_bwd_parts", *CORRECT.values(),
           "ws_bit", *sorted({fn.__name__ for _, _, _, fn, _ in PLANTED})]
SETUP = "import torch\nfrom normcore import exercises\n\n\n" + "\n\n".join(
    inspect.getsource(getattr(student_style, name)) for name in dict.fromkeys(HELPERS))

BROKEN = ["syntax", "loop", "renamed", "deleted", "stub", "memory"]


def fixture_chapter() -> nbformat.NotebookNode:
    cells = [new_markdown_cell("# A small chapter"), new_code_cell(SETUP)]
    for i, (label, op, options, _, _) in enumerate(PLANTED):
        cells += exercise_cells(label, op, f"solve_{i}", call(correct_for(op, options), op),
                                points=2, options=options)
    for name in BROKEN:
        cells += exercise_cells(f"ex-broken-{name}", "batch_norm", f"broken_{name}",
                                call("bn_correct", "batch_norm"))
    cells += exercise_cells("ex-derivation", None, None,
                            "### BEGIN SOLUTION\nassert 1 + 1 == 2\n### END SOLUTION",
                            points=3, check=False)
    cells.append(new_markdown_cell("## Summary"))
    return new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC})


def plant(student, sources: dict, drop_checks=()) -> nbformat.NotebookNode:
    """A submission: ``student`` with the solution cells of ``sources``' labels replaced."""
    nb = copy.deepcopy(student)
    cells = []
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        label = grade_id.rsplit("-", 1)[0]
        if grade_id.endswith("-solution") and label in sources:
            cell.source = sources[label]
        if grade_id.endswith("-check") and label in drop_checks:
            continue
        cells.append(cell)
    nb.cells = cells
    return nb


def solutions_of(chapter) -> dict:
    return {c.metadata["normcore"]["exercise"]: c.source for c in chapter.cells
            if c.metadata.get("normcore", {}).get("role") == "solution"}


@pytest.fixture(scope="module")
def chapter():
    return fixture_chapter()


@pytest.fixture(scope="module")
def student(chapter):
    """The small chapter's student notebook, its markdown plain (as the command writes it):
    the grader finds the exercises by the cells' nbgrader ids, not by the MyST fences."""
    return student_notebook(chapter, "small", BookIndex())


# =======================================================================================
# reading the marking, writing the student notebook
# =======================================================================================
def test_marking_is_read(chapter):
    found = read_exercises(chapter)
    assert [e.label for e in found] == [p[0] for p in PLANTED] + [
        f"ex-broken-{n}" for n in BROKEN] + ["ex-derivation"]
    first = found[0]
    assert (first.op, first.function, first.points, first.coding) == (
        PLANTED[0][1], "solve_0", 2, True)
    assert not found[-1].coding and found[-1].points == 3


def test_broken_marking_is_refused(chapter):
    nb = copy.deepcopy(chapter)
    check = next(c for c in nb.cells if c.metadata.get("normcore", {}).get("role") == "check")
    check.source = "print(exercises.check('batch_norm', solve_0))"
    with pytest.raises(MarkingError, match="check cell must read exactly"):
        read_exercises(nb)
    nb = copy.deepcopy(chapter)
    sol = next(c for c in nb.cells if c.metadata.get("normcore", {}).get("role") == "solution")
    sol.source = sol.source.replace("### END SOLUTION", "")
    with pytest.raises(MarkingError, match="without ### END SOLUTION"):
        read_exercises(nb)


def test_exercise_overview_lists_every_exercise(chapter, tmp_path):
    """The classroom page's table: one row per exercise, with op, function and the number of
    mistakes its checker names; a derivation is graded by hand."""
    from normcore.classroom import exercise_table, exercises_of

    path = tmp_path / "small.ipynb"
    nbformat.write(chapter, path)
    rows = exercises_of([path])
    found = read_exercises(chapter)
    assert [r["label"] for r in rows] == [e.label for e in found]
    first = rows[0]
    assert (first["chapter"], first["op"], first["function"], first["points"]) == (
        "small", PLANTED[0][1], "solve_0", 2)
    assert first["mistakes"] == len(exercises.catalogue(PLANTED[0][1])) > 0
    assert rows[-1]["op"] is None and rows[-1]["mistakes"] is None
    table = exercise_table([path]).splitlines()
    assert len(table) == 2 + len(rows)
    assert table[-1] == "| small | `ex-derivation` | 3 | by hand | |"


def test_exercise_overview_reads_a_copy_without_solutions(tmp_path):
    """`make book-nosolutions` builds the classroom page from chapters without solution and
    check cells: their statements keep the op, so the page's table is the same."""
    from normcore.classroom import exercises_of
    from normcore.classroom.nosolutions import without_solutions

    for path in sorted((ROOT / "chapters").glob("0[1-9]_*.ipynb"))[:3]:
        copy = tmp_path / path.name
        nbformat.write(without_solutions(nbformat.read(path, as_version=4)), copy)
        assert exercises_of([copy]) == exercises_of([path])


def test_the_classroom_pages_tools_read_a_copy_without_solutions(tmp_path):
    """The classroom page's cells run in `make book-nosolutions` too, on chapters without
    solution cells: the roster's list of exercises is the same, and a student notebook of
    such a copy has the same statements (and no solution to fill in)."""
    from normcore.classroom.gradebook import chapter_exercises
    from normcore.classroom.nosolutions import without_solutions
    from normcore.classroom.plainmd import book_index

    index = book_index(ROOT / "chapters")
    for path in sorted((ROOT / "chapters").glob("0[1-9]_*.ipynb"))[1:3]:
        book = nbformat.read(path, as_version=4)
        copy = tmp_path / path.name
        nbformat.write(without_solutions(book), copy)
        assert chapter_exercises([copy]) == chapter_exercises([path])
        stripped = nbformat.read(copy, as_version=4)

        def statements(nb):
            return [c.source for c in student_notebook(nb, path.stem, index).cells
                    if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("-statement")]
        assert statements(stripped) == statements(book) and statements(book)
        ids = [c.metadata.get("nbgrader", {}).get("grade_id", "")
               for c in student_notebook(stripped, path.stem, index).cells]
        assert not [i for i in ids if "-solution" in i or "-check" in i]


def test_every_chapter_has_a_checked_exercise():
    from normcore.classroom import exercises_of

    paths = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    rows = exercises_of(paths)
    # the chapters that teach a layer (1 to 7) and the one on DyT (9) each have a checked
    # coding exercise; every chapter has at least three exercises
    # (test_student_chapters_run_with_only_stubs_...)
    teaching = {p.stem for p in paths if int(p.stem[:2]) <= 7}
    assert len(teaching) == 7
    with_one = {r["chapter"] for r in rows if r["op"]}
    assert with_one >= teaching | {"09_without_normalization"}
    assert {r["chapter"] for r in rows} == {p.stem for p in paths}


def test_student_notebook_has_stubs_and_nbgrader_metadata(student):
    by_id = {c.metadata["nbgrader"]["grade_id"]: c for c in student.cells
             if "nbgrader" in c.metadata}
    stub = by_id["ex-broken-stub-solution"]
    assert stub.source == ("def broken_stub(x, gamma, beta, eps):\n    # YOUR CODE HERE\n"
                           "    raise NotImplementedError()")
    assert stub.metadata["nbgrader"] == {"grade": False, "grade_id": "ex-broken-stub-solution",
                                         "locked": False, "schema_version": 3,
                                         "solution": True}
    check = by_id["ex-broken-stub-check"]
    assert check.metadata["nbgrader"] == {"grade": True, "grade_id": "ex-broken-stub-check",
                                          "locked": True, "points": 1, "schema_version": 3,
                                          "solution": False}
    answer = by_id["ex-derivation-answer"]
    assert answer.cell_type == "markdown" and answer.metadata["nbgrader"]["points"] == 3
    assert by_id["ex-derivation-statement"].metadata["nbgrader"]["locked"]
    text = dumps(student)
    assert "solution-start" not in text and "solution-end" not in text
    assert "Hint only the solution shows" not in text
    nbformat.validate(nbformat.reads(text, as_version=4))
    manifest = student.metadata["normcore"]["classroom"]
    assert manifest["source"] == "small" and len(manifest["exercises"]) == len(PLANTED) + 7


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_student_chapter_has_no_solution_text(path, tmp_path):
    source = nbformat.read(path, as_version=4)
    target = write_student(path, tmp_path)
    text = target.read_text(encoding="utf-8")
    assert write_student(path, tmp_path).read_text(encoding="utf-8") == text  # same bytes
    student = nbformat.reads(text, as_version=4)
    roles = [c.metadata.get("normcore", {}).get("role") for c in source.cells]
    outside = "\n".join(source_text(c) for c, r in zip(source.cells, roles)
                        if r not in ("solution", "solution-start"))
    for cell, role in zip(source.cells, roles):
        if role == "solution":
            lines = solution_lines(source_text(cell))
        elif role == "solution-start":
            lines = source_text(cell).split("\n")[3:]  # the prose after the directive
        else:
            continue
        for line in lines:
            line = line.strip()
            if len(line) > 3 and line not in outside:
                assert line not in text, f"{path.name}: solution text {line!r} in the student file"
    assert all(not c.get("outputs") for c in student.cells if c.cell_type == "code")
    assert len(read_exercises(source)) == len(student.metadata["normcore"]["classroom"][
        "exercises"])


def test_student_command(tmp_path, capsys):
    assert main(["student", *map(str, CHAPTERS), "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for path in CHAPTERS:
        assert (tmp_path / path.name).exists() and f"-> {tmp_path / path.name}" in out
    assert main(["student", str(CHAPTERS[0]), "-o", str(CHAPTERS[0].parent)]) == 1
    assert "the chapter itself" in capsys.readouterr().err


# =======================================================================================
# the checker reports a stub as not implemented
# =======================================================================================
def test_check_reports_a_stub_as_not_implemented():
    def stub(x, gamma, beta, eps):
        # YOUR CODE HERE
        raise NotImplementedError()
    report = exercises.check("batch_norm", stub)
    assert report.kind == "not_implemented" and not report.passed
    assert str(report).startswith("batch_norm: not implemented.")


# =======================================================================================
# grading planted submissions
# =======================================================================================
CELL_TIMEOUT = 10   # the infinite loop costs this much
MEMORY = 2048       # MB; the memory exercise asks for 3 GB


def mistakes(chapter) -> dict:
    """One wrong solution per exercise: each misconception, and the broken ones."""
    sources = {}
    for i, (label, op, _, fn, _) in enumerate(PLANTED):
        args = exercises.signature(op)[2:-1]
        sources[label] = f"def solve_{i}({args}):\n{call(fn.__name__, op)}"
    sources["ex-broken-syntax"] = "def broken_syntax(x, gamma, beta, eps)\n    return x"
    sources["ex-broken-loop"] = ("def broken_loop(x, gamma, beta, eps):\n    while True:\n"
                                 "        pass")
    sources["ex-broken-renamed"] = ("def my_own_name(x, gamma, beta, eps):\n"
                                    "    return bn_correct(x, gamma, beta, eps)")
    sources["ex-broken-deleted"] = solutions_of(chapter)["ex-broken-deleted"]
    sources["ex-broken-memory"] = (
        "def broken_memory(x, gamma, beta, eps):\n"
        "    big = torch.empty(3 * 2 ** 30 // 8, dtype=torch.float64)  # 3 GB\n"
        "    return bn_correct(x, gamma, beta, eps)")
    return sources


@pytest.fixture(scope="module")
def graded(chapter, student, tmp_path_factory):
    hang_run()   # starts the notebook-limit test's run, which waits beside these
    folder = tmp_path_factory.mktemp("submissions")
    solved = plant(student, solutions_of(chapter))
    nbformat.write(solved, folder / "alice.ipynb")
    nbformat.write(plant(student, mistakes(chapter), drop_checks=("ex-broken-deleted",)),
                   folder / "bob.ipynb")
    (folder / "carol.ipynb").write_text('{"cells": [', encoding="utf-8")   # not JSON
    nbformat.write(chapter, folder / "dave.ipynb")   # the source: not a student notebook
    paths = sorted(folder.glob("*.ipynb"))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    mtimes = {p: p.stat().st_mtime_ns for p in paths}
    rows = grade(paths, cell_timeout=CELL_TIMEOUT, timeout=300, memory=MEMORY, progress=False,
                 jobs=2)
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths} == before
    assert {p: p.stat().st_mtime_ns for p in paths} == mtimes
    assert sorted(os.listdir(folder)) == [p.name for p in paths]   # nothing written beside
    return {(r.student, r.exercise): r for r in rows}, rows, folder


def test_solutions_pass(graded):
    by, _, _ = graded
    for label, *_ in PLANTED:
        assert by["alice", label].status == "passed", by["alice", label]
        assert by["alice", label].score == 2
    for name in BROKEN:
        assert by["alice", f"ex-broken-{name}"].status == "passed"
    assert by["alice", "ex-derivation"].status == "manual"


@pytest.mark.parametrize("label, op, options, fn, keys", PLANTED,
                         ids=[p[0] for p in PLANTED])
def test_each_misconception_is_named(graded, label, op, options, fn, keys):
    row = graded[0]["bob", label]
    assert row.status == "misconception", row
    assert row.misconception == "+".join(keys)
    assert row.misconception_name == " + ".join(exercises.CATALOGUE[k].title for k in keys)
    assert row.score == 0 and row.op == op


def test_broken_submissions_get_clear_rows(graded):
    by, _, _ = graded
    row = by["bob", "ex-broken-syntax"]
    assert row.status == "error" and row.detail.startswith("your cell raised SyntaxError")
    assert ".py" not in row.detail   # no temporary file names
    row = by["bob", "ex-broken-loop"]
    assert row.status == "timed out" and f"longer than {CELL_TIMEOUT} s" in row.detail
    row = by["bob", "ex-broken-renamed"]
    assert row.status == "missing function"
    assert "broken_renamed" in row.detail and "defines my_own_name" in row.detail
    row = by["bob", "ex-broken-deleted"]
    assert row.status == "passed" and row.detail.startswith("check cell deleted")
    row = by["bob", "ex-broken-memory"]
    assert row.status == "error" and "RuntimeError" in row.detail, row
    assert by["bob", "ex-broken-stub"].status == "not implemented"
    # the exercises after the timed-out one were graded
    assert by["bob", "ex-derivation"].status == "manual"
    assert by["carol", "*"].status == "unreadable" and "JSON" in by["carol", "*"].detail
    assert by["dave", "*"].status == "unreadable"
    assert "not a student notebook" in by["dave", "*"].detail


def test_csv_and_summary(graded, tmp_path):
    _, rows, _ = graded
    write_csv(rows, tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 2 * (len(PLANTED) + len(BROKEN) + 1) + 2
    assert table[0].keys() == {"student", "chapter", "exercise", "op", "points", "score",
                               "status", "misconception", "misconception_name", "detail",
                               "credit"}
    # the planted chapter gives no rubric: all or nothing
    assert {line["credit"] for line in table if line["op"]} == {"correct:0", "correct:2",
                                                                "correct:1"}
    text = summary(rows)
    assert text.splitlines()[0] == "4 submission(s)"
    label = PLANTED[0][0]
    assert f"{label} (batch_norm, 2 points): 1 of 2 passed" in text
    key = PLANTED[0][4][0]
    assert f"  {exercises.CATALOGUE[key].title} [{key}]: 1 of 2" in text
    assert "  timed out: 1 of 2" in text and "carol: unreadable" in text


def section(text: str, label: str) -> str:
    """The part of a feedback file about exercise ``label``."""
    start = text.index(f"## {label}:")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_feedback_file_per_student(graded, tmp_path):
    _, rows, _ = graded
    written = write_feedback(rows, tmp_path / "feedback")
    assert [p.name for p in written] == ["alice.md", "bob.md", "carol.md", "dave.md"]
    alice, bob = ((tmp_path / "feedback" / f"{n}.md").read_text() for n in ("alice", "bob"))
    # right: the score, and nothing to change
    total = 2 * len(PLANTED) + len(BROKEN)
    assert f"Checked exercises: {total} of {total} points." in alice
    first = section(alice, PLANTED[0][0])
    assert first.startswith(f"## {PLANTED[0][0]}: 2 of 2 points")
    assert "**Status:** `batch_norm`, passed" in first
    assert "**What to change:** Nothing" in first
    # a catalogued mistake: its name and key, and the checker's own words for this op
    options = {fn: o for _, fn, o, _, _ in student_style.DIAGNOSES}
    for label, op, _, fn, keys in PLANTED:
        part = section(bob, label)
        assert part.startswith(f"## {label}: 0 of 2 points"), part
        assert all(len(line) <= 80 for line in part.splitlines()), part
        report = exercises.check(op, fn, hidden=True, **options[fn])
        assert len(report.advice) == len(keys)
        words = " ".join(part.split())     # the paragraphs are filled to the page's width
        for (key, did, why, fix), k in zip(report.advice, keys):
            assert key == k and f"{exercises.CATALOGUE[key].title} (`{key}`)" in words
            for head, text in (("What you did", did), ("Why it is wrong", why),
                               ("What to change", fix)):
                assert " ".join(f"**{head}:** {text}".split()) in words, part
    # the untouched stub: the checker's message says what to change
    part = section(bob, "ex-broken-stub")
    assert "**Status:** `batch_norm`, not implemented" in part
    assert "Replace `raise NotImplementedError()` with your code." in " ".join(part.split())
    # the rows no checker saw: a sentence per status
    def flat(label):
        return " ".join(section(bob, label).split())
    assert "**Status:** `batch_norm`, timed out" in flat("ex-broken-loop")
    assert "look for a loop that never ends" in flat("ex-broken-loop")
    assert "SyntaxError" in flat("ex-broken-syntax")
    assert "**What to change:** Keep the function's name" in flat("ex-broken-renamed")
    assert "## ex-derivation: graded by hand (3 points)" in bob
    carol = (tmp_path / "feedback" / "carol.md").read_text()
    assert "## The notebook" in carol and "not a readable notebook" in carol


def test_grade_command_writes_feedback_beside_the_csv(tmp_path, capsys):
    _, op, _, fn, keys = PLANTED[0]
    small = new_notebook(cells=[new_code_cell(SETUP), *exercise_cells(
        "ex-one", op, "one", call(correct_for(op, ""), op), points=2)],
        metadata={"kernelspec": KERNELSPEC})
    nb = plant(student_notebook(small, "small"), {"ex-one": f"def one("
               f"{exercises.signature(op)[2:-1]}):\n{call(fn.__name__, op)}"})
    nbformat.write(nb, tmp_path / "erin.ipynb")
    assert main(["grade", str(tmp_path / "erin.ipynb"), "--out", str(tmp_path / "grades.csv"),
                 "--no-progress", "--cell-timeout", "60"]) == 0
    text = (tmp_path / "grades-feedback" / "erin.md").read_text()
    assert "## ex-one: 0 of 2 points" in text and f"(`{keys[0]}`)" in text
    assert "feedback: " in capsys.readouterr().out
    # --feedback chooses the folder (an unreadable file needs no kernel)
    (tmp_path / "frank.ipynb").write_text("not json", encoding="utf-8")
    assert main(["grade", str(tmp_path / "frank.ipynb"), "--out", str(tmp_path / "g2.csv"),
                 "--no-progress", "--feedback", str(tmp_path / "mine")]) == 0
    assert "unreadable" in (tmp_path / "mine" / "frank.md").read_text()
    assert not (tmp_path / "g2-feedback").exists()
    # a file where the folder should be: a clear message, the grades still written
    (tmp_path / "taken").write_text("", encoding="utf-8")
    capsys.readouterr()
    assert main(["grade", str(tmp_path / "frank.ipynb"), "--out", str(tmp_path / "g3.csv"),
                 "--no-progress", "--feedback", str(tmp_path / "taken")]) == 1
    err = capsys.readouterr().err
    assert "is a file: give a folder" in err and (tmp_path / "g3.csv").exists()


def test_feedback_file_names():
    assert file_name("alice") == "alice.md" and file_name("a/b c") == "a_b_c.md"
    assert file_name("..") == "student.md"
    assert default_folder("out/grades.csv") == Path("out/grades-feedback")


@functools.cache
def hang_run():
    """Grade, in a thread, a notebook whose loop survives the interrupt (only the notebook's
    limit stops it).  It waits, mostly: the grading fixture starts it first, so that it
    runs while the others are graded."""
    label = "ex-hang"
    chapter = new_notebook(cells=exercise_cells(label, "batch_norm", "hang", "    return x"),
                           metadata={"kernelspec": KERNELSPEC})
    loop = ("import time\nwhile True:\n    try:\n        time.sleep(0.05)\n"
            "    except KeyboardInterrupt:\n        pass")
    nb = plant(student_notebook(chapter, "hang"), {label: loop})
    # 16 s: on a loaded machine the runner and its kernel take seconds to start
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(grade_notebook, nb, "erin", cell_timeout=2, timeout=16, memory=MEMORY)
    pool.shutdown(wait=False)
    return future


def test_a_notebook_over_its_time_limit_is_killed():
    rows, ran = hang_run().result()
    assert ran["timed_out"], ran
    assert ran["kernel"], f"the kernel had not started within the limit: {ran}"
    assert not alive(ran["kernel"])
    assert rows[0].status == "timed out" and "notebook ran longer than 16 s" in rows[0].detail


@functools.cache
def death_runs():
    """Grade, in a thread, two notebooks whose kernel dies: one function kills the process
    that runs it with SIGKILL when it is checked, and a later solution cell kills the kernel;
    one solution cell ends the kernel with exit code 3."""
    cells = [c for label in ("ex-first", "ex-killed", "ex-after")
             for c in exercise_cells(label, "batch_norm", label[3:], "    return x")]
    student = student_notebook(new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC}),
                               "dies")
    killed = plant(student, {"ex-killed": "import os\n\n\ndef killed(x, gamma, beta, eps):\n"
                                          "    os.kill(os.getpid(), 9)",
                             "ex-after": "import os\nos.kill(os.getpid(), 9)"})
    exits = plant(student, {"ex-first": "import os\nos._exit(3)"})
    pool = ThreadPoolExecutor(max_workers=1)
    futures = [pool.submit(grade_notebook, nb, "zed", cell_timeout=30, timeout=120,
                           memory=MEMORY) for nb in (killed, exits)]
    pool.shutdown(wait=False)
    return futures


# the one-line cheats an instructor tried: none of them passes
CHEATS = {
    # the stub left, and the checker replaced in the solution cell
    "ex-patch-check": "from normcore import exercises as _ex\n"
                      "class _Passed:\n    passed = True\n    kind = 'pass'\n"
                      "_ex.check = lambda *a, **k: _Passed()\n"
                      "def patch_check(x, gamma, beta, eps):\n"
                      "    raise NotImplementedError()",
    # a verdict written straight into the grader's results file
    "ex-write-verdict": "import json, os\n"
                        "def write_verdict(x, gamma, beta, eps):\n"
                        "    raise NotImplementedError()\n"
                        "for _label in ('ex-write-verdict', 'ex-patch-check'):\n"
                        "    with open(os.environ['NORMCORE_GRADE_RESULTS'], 'a') as f:\n"
                        "        f.write(json.dumps({'label': _label, 'status': 'passed'}) "
                        "+ '\\n')",
    # the checker's own reference handed in
    "ex-reference": "def reference(x, gamma, beta, eps):\n"
                    "    return exercises.reference('batch_norm')(x, gamma, beta, eps)",
    # torch's op, where the statement forbids it
    "ex-torch-op": "import torch.nn.functional as TF\n"
                   "def torch_op(x, gamma, beta, eps):\n"
                   "    return TF.batch_norm(x, None, None, gamma, beta, training=True, "
                   "eps=eps)",
    # fitted to the notebook's shapes: the statistics of the first four samples only, which
    # is every sample of every set the notebook's check shows
    "ex-fitted": "def fitted(x, gamma, beta, eps):\n"
                 "    dims = [0, *range(2, x.dim())]\n"
                 "    head = x[:4]\n"
                 "    m = head.mean(dims, keepdim=True)\n"
                 "    v = head.var(dims, keepdim=True, unbiased=False)\n"
                 "    shape = [1, -1] + [1] * (x.dim() - 2)\n"
                 "    return (gamma.view(shape) * (x - m) / torch.sqrt(v + eps)\n"
                 "            + beta.view(shape))",
    # torch itself patched so that any answer is "close"
    "ex-patch-torch": "torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)\n"
                      "def patch_torch(x, gamma, beta, eps):\n"
                      "    return x",
}


@functools.cache
def cheat_run():
    cells = [new_code_cell("import torch\nfrom normcore import exercises")]
    for label in CHEATS:
        fn = label[3:].replace("-", "_")
        cells += exercise_cells(label, "batch_norm", fn, "    return x", points=2,
                                rules=("no-torch-norms", "no-normcore"))
    student = student_notebook(new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC}),
                               "cheats")
    return grade_notebook(plant(student, CHEATS), "mallory", cell_timeout=60, timeout=300,
                          memory=MEMORY)


def test_one_line_cheats_do_not_pass():
    rows, _ = cheat_run()
    by = {r.exercise: r for r in rows}
    assert by["ex-patch-check"].status == "not implemented", by["ex-patch-check"]
    assert by["ex-write-verdict"].status == "not implemented", by["ex-write-verdict"]
    for label, rule in (("ex-reference", "no-normcore"), ("ex-torch-op", "no-torch-norms")):
        assert by[label].status == "forbidden", by[label]
        assert rule in by[label].detail
    assert by["ex-patch-torch"].status in ("misconception", "incorrect"), by["ex-patch-torch"]
    # the notebook's own check passes the fitted answer; the hidden sets do not
    namespace = {"torch": __import__("torch")}
    exec(CHEATS["ex-fitted"], namespace)
    assert exercises.check("batch_norm", namespace["fitted"]).passed
    assert by["ex-fitted"].status == "incorrect", by["ex-fitted"]
    assert "H" in by["ex-fitted"].feedback["message"]   # names the hidden set
    assert sum(r.score for r in rows) == 0


def test_a_killed_kernel_is_reported_as_dead_not_timed_out():
    rows, ran = death_runs()[0].result()
    by = {r.exercise: r for r in rows}
    assert not ran["timed_out"] and ran["died"]["signal"] == 9, ran
    assert by["ex-first"].status == "not implemented"       # graded before the kill
    row = by["ex-killed"]    # its function killed the grader's process, not the kernel
    assert (row.status, row.score) == ("kernel died", 0), row
    assert row.detail == ("the process that ran your function on the grader's test sets "
                          "was killed by signal 9 (SIGKILL)")
    row = by["ex-after"]
    assert row.status == "kernel died", row
    assert row.detail == ("the kernel died (killed by signal 9, SIGKILL) in your solution "
                          "cell of ex-after, before this exercise was checked")
    assert not alive(ran["kernel"])
    assert "  kernel died: 1 of 1" in summary(rows)


def test_a_kernel_that_exits_is_reported_with_its_exit_code():
    rows, ran = death_runs()[1].result()
    assert ran["died"]["exit_code"] == 3 and not ran["timed_out"], ran
    for row in rows:
        assert row.status == "kernel died", row
        assert row.detail == ("the kernel died (it exited with code 3) in your solution cell "
                              "of ex-first, before this exercise was checked")


def alive(pid: int) -> bool:
    """Is ``pid`` a running process (not gone, not a zombie waiting to be reaped)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


# =======================================================================================
# the student version of every chapter runs to the end
# =======================================================================================
def exercise_part(nb):
    """The chapter's first code cell (its imports) and everything from its Exercises heading
    on: the cells a student notebook changes.  The cells before the heading are the
    chapter's own, which nbval executes; no cell outside the exercises uses a solution's
    function (``test_no_cell_outside_the_exercises_uses_a_solution``)."""
    start = next(i for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" and re.search(r"^#+ Exercises", c.source, re.M))
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    part = copy.deepcopy(nb)
    part.cells = [first_code] + nb.cells[start:]
    return part


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_cell_outside_the_exercises_uses_a_solution(path):
    source = nbformat.read(path, as_version=4)
    names = {e.function for e in read_exercises(source) if e.function}
    for cell in source.cells:
        if cell.cell_type == "code" and marking(cell) is None:
            code = "\n".join(line for line in cell.source.splitlines()
                             if not line.lstrip().startswith(("%", "!")))   # IPython magics
            used = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
            assert not used & names, (path.name, used & names)


# A demo of the checker (a cell outside the exercises that shows `exercises.check` naming a
# mistake) must not be an exercise's solution with a token or two changed: a student would
# copy it, flip the token and be told "correct".  "A few tokens from" is measured on
# normalized token sequences (`demo_tokens`): comments, docstrings and layout dropped, the
# parameters and local names renamed in order of first appearance (so that renaming a
# variable does not hide a copy), attribute names, globals and literals kept.  A notebook
# function the demo calls counts as part of it (its tokens come first).  difflib's
# `ratio` (2 * matching tokens / all tokens of both) is 1 for a copy; the near-copies issue 21
# found scored 0.65 (the running update, three of its five statements the solution's) to
# 0.95 (BatchNorm with `x.var`'s unbiased default); the demos that replaced them, each the
# mistake built from a library call with a knob turned, score 0.16 to 0.46.  (Two of the
# book's solutions of one op, written in different ways, score 0.39 to 0.62.)  A demo is
# compared with every solution of its op in the book (any of them passes the demo's
# checker), and a function with exactly a solution's parameters with that solution.
NEAR_COPY = 0.6


def demo_tokens(fn: ast.FunctionDef) -> list[str]:
    """The normalized tokens of ``fn``'s body (see above)."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]                                                   # a docstring
    stored = [a.arg for a in fn.args.args] + [
        n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    local: dict[str, str] = {}
    for name in stored:
        local.setdefault(name, f"_{len(local)}")
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    code = "\n".join(ast.unparse(statement) for statement in body)
    out, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type not in skip:
            renamed = tok.type == tokenize.NAME and previous != "." and tok.string in local
            out.append(local[tok.string] if renamed else tok.string)
            previous = tok.string
    return out


def code_of(cell) -> ast.Module:
    return ast.parse("\n".join(line for line in source_text(cell).splitlines()
                               if not line.lstrip().startswith(("%", "!"))))   # IPython magics


@functools.lru_cache(maxsize=1)
def book_solutions() -> tuple:
    """(chapter, op, function name, parameter names, tokens) of every coding exercise's
    solution in the book."""
    found = []
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        for ex in read_exercises(nb):
            for i in ex.solutions if ex.op and ex.function else ():
                for fn in ast.walk(code_of(nb.cells[i])):
                    if isinstance(fn, ast.FunctionDef) and fn.name == ex.function:
                        found.append((path.stem, ex.op, fn.name,
                                      [a.arg for a in fn.args.args], demo_tokens(fn)))
    return tuple(found)


def chapter_demos(path) -> list[tuple]:
    """(op or None, function name, parameter names, tokens) of the functions the cells
    outside the exercises define: the op when a cell passes the function to
    ``exercises.check(op, ...)``, tokens with those of the notebook functions it calls."""
    nb = nbformat.read(path, as_version=4)
    defined: dict[str, tuple] = {}
    checked: list[tuple[str, str]] = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "normcore" in cell.metadata:
            continue
        tree = code_of(cell)
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            calls = [n.func.id for n in ast.walk(fn)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
            helpers = [t for name in dict.fromkeys(calls) if name in defined
                       for t in defined[name][1]]
            defined[fn.name] = ([a.arg for a in fn.args.args], helpers + demo_tokens(fn))
        checked += [(n.args[0].value, n.args[1].id) for n in ast.walk(tree)
                    if isinstance(n, ast.Call) and ast.unparse(n.func) == "exercises.check"
                    and len(n.args) > 1 and isinstance(n.args[0], ast.Constant)
                    and isinstance(n.args[1], ast.Name)]
    ops = {name: op for op, name in checked}
    return [(ops.get(name), name, params, tokens)
            for name, (params, tokens) in defined.items()]


def near_copies(path, solutions) -> list[tuple]:
    """(demo, solution's chapter and name, ratio) of each demo of ``path`` within
    ``NEAR_COPY`` of a solution of its op, or of a solution with its parameters."""
    near = []
    for op, name, params, tokens in chapter_demos(path):
        for chapter, sol_op, sol_name, sol_params, sol_tokens in solutions:
            if op == sol_op or params == sol_params:
                ratio = difflib.SequenceMatcher(None, tokens, sol_tokens,
                                                autojunk=False).ratio()
                if ratio >= NEAR_COPY:
                    near.append((name, f"{chapter}:{sol_name}", round(ratio, 2)))
    return near


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_demo_outside_the_exercises_is_a_solution_with_a_token_changed(path):
    near = near_copies(path, book_solutions())
    assert not near, near


def test_a_renamed_copy_with_a_token_changed_is_a_near_copy(tmp_path):
    """The measure sees through renaming and comments: a chapter whose demo is chapter 2's
    solution with other names and ``x.var``'s default (unbiased) is caught."""
    demo = '''def bn_demo(inp, weight, bias, epsilon):
    # the unbiased variance: the mistake
    axes_ = [0] + list(range(2, inp.dim()))
    view = [1, -1] + [1] * (inp.dim() - 2)
    mu = inp.mean(dim=axes_, keepdim=True)
    var = inp.var(dim=axes_, keepdim=True)
    xhat = (inp - mu) / torch.sqrt(var + epsilon)
    return weight.view(view) * xhat + bias.view(view)


report = exercises.check("batch_norm", bn_demo)'''
    nb = new_notebook(cells=[new_code_cell(demo)])
    nbformat.write(nb, tmp_path / "99_demo.ipynb")
    found = {(demo, sol): ratio for demo, sol, ratio in near_copies(tmp_path / "99_demo.ipynb",
                                                                  book_solutions())}
    assert found[("bn_demo", "02_batch_norm:my_batch_norm")] > 0.9


def test_student_chapters_run_with_only_stubs_unimplemented():
    """The student notebooks of every chapter (their exercise parts, one after the other in
    one kernel), executed as an untouched submission: every coding exercise is reported as
    not implemented, and no cell fails.  NORMCORE_FULL_STUDENT_RUN=1 executes each whole
    chapter in its own kernel instead (slower)."""
    index = book_index(ROOT / "chapters")
    students = [student_notebook(nbformat.read(p, as_version=4), p.stem, index)
                for p in CHAPTERS]
    if os.environ.get("NORMCORE_FULL_STUDENT_RUN") == "1":
        runs = students
    else:
        parts = [exercise_part(nb) for nb in students]
        combined = copy.deepcopy(parts[0])
        combined.cells = [c for part in parts for c in part.cells]
        combined.metadata["normcore"]["classroom"]["exercises"] = [
            e for nb in parts for e in nb.metadata["normcore"]["classroom"]["exercises"]]
        runs = [combined]
    labels = []
    for nb in runs:
        rows, ran = grade_notebook(nb, "student", cell_timeout=300, timeout=900)
        errors = {i: (e["ename"], e["evalue"]) for i, e in ran["cells"].items()
                  if e["status"] == "error"}
        assert not errors, errors
        assert len(ran["cells"]) == sum(c.cell_type == "code" for c in nb.cells)
        for row in rows:
            expected = "not implemented" if row.op else "manual"
            assert row.status == expected, row
        labels += [row.exercise for row in rows]
    for nb in students:   # every chapter has at least three exercises, all of them run
        mine = [e["label"] for e in nb.metadata["normcore"]["classroom"]["exercises"]]
        assert len(mine) >= 3 and set(mine) <= set(labels)


# =======================================================================================
# the site without solutions
# =======================================================================================
def solution_texts(path) -> list[str]:
    """Lines of a chapter's solutions that appear nowhere else in it: its solution code and
    the plain-word lines of its solution prose."""
    source = nbformat.read(path, as_version=4)
    roles = [c.metadata.get("normcore", {}).get("role") for c in source.cells]
    outside = "\n".join(source_text(c) for c, r in zip(source.cells, roles)
                        if r not in ("solution", "solution-start"))
    found = []
    for cell, role in zip(source.cells, roles):
        if role == "solution":
            lines = solution_lines(source_text(cell))
        elif role == "solution-start":
            lines = [line for line in source_text(cell).split("\n")[3:]
                     if not any(ch in line for ch in "$`{\\")]
        else:
            continue
        found += [line.strip() for line in lines
                  if len(line.strip()) > 12 and line.strip() not in outside]
    return found


def test_copy_without_solutions(tmp_path):
    from normcore.classroom.nosolutions import copy_without_solutions
    out = copy_without_solutions(ROOT, tmp_path / "book")
    assert (out / "_toc.yml").exists() and (out / "assets").is_symlink()
    for path in CHAPTERS:
        text = (out / "chapters" / path.name).read_text(encoding="utf-8")
        copied = nbformat.reads(text, as_version=4)
        roles = {c.metadata.get("normcore", {}).get("role") for c in copied.cells}
        assert roles <= {None, "statement"}, roles
        for line in solution_texts(path):
            assert json.dumps(line)[1:-1] not in text, (path.name, line)
    with pytest.raises(ValueError, match="outside the book"):
        copy_without_solutions(ROOT, ROOT / "chapters" / "copy")


NOSOLUTIONS_HTML = ROOT / "_build" / "nosolutions" / "_build" / "html"


@pytest.mark.site
def test_site_without_solutions_shows_no_solution(browser):
    """Every page of `make book-nosolutions`'s site, read in Chromium: no solution text,
    and every exercise statement still there."""
    if not (NOSOLUTIONS_HTML / "index.html").exists():
        pytest.fail(f"{NOSOLUTIONS_HTML} has no built book: run `make book-nosolutions` "
                    f"(`make test` builds it)")
    sys.path.insert(0, str(ROOT / "tools"))
    import sitecheck

    from normcore.classroom.nosolutions import without_solutions

    # the lines of one chapter's solutions that no page says outside a solution
    shown = "\n".join(nbformat.writes(without_solutions(nbformat.read(p, as_version=4)))
                      for p in CHAPTERS)
    shown += "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "chapters").glob("*.md"))
    secrets = {p.stem: [line for line in solution_texts(p) if line not in shown]
               for p in CHAPTERS}
    assert all(secrets.values())
    pages = sorted(str(p.relative_to(NOSOLUTIONS_HTML)) for p in NOSOLUTIONS_HTML.rglob("*.html")
                   if "_static" not in p.parts)
    for f in NOSOLUTIONS_HTML.rglob("*"):   # downloads (.ipynb, .md) and search index too
        if f.is_file() and f.suffix in (".ipynb", ".md", ".js", ".txt", ".html") \
                and "_static" not in f.parts:
            text = f.read_text(encoding="utf-8", errors="replace")
            for _chapter, lines in secrets.items():
                for line in lines:
                    assert line not in text, (str(f), line)
    with sitecheck.LocalServer(NOSOLUTIONS_HTML) as server:
        context = browser.new_context()
        page = context.new_page()
        for rel in pages:
            page.goto(server.url(rel))
            text = page.inner_text("body")
            for _chapter, lines in secrets.items():
                for line in lines:
                    assert line not in text, (rel, line)
            if rel.startswith("chapters/0"):
                labels = [e.label for e in read_exercises(nbformat.read(
                    ROOT / "chapters" / (Path(rel).stem + ".ipynb"), as_version=4))]
                assert page.locator("div.exercise").count() == len(labels), rel
                assert page.locator("div.solution").count() == 0, rel
        context.close()


def test_catalogue_table_for_the_classroom_page():
    table = exercises.catalogue_table(markdown=True).splitlines()
    assert table[0] == "| mistake | ops | what it is |"
    assert table[2 + len(exercises.CATALOGUE)] == "" and table[-1].startswith("ops: BN = ")
    for line, m in zip(table[2:], exercises.CATALOGUE.values()):
        assert line.startswith(f"| `{m.key}`: ") and line.count(" | ") == 2
