"""nbgrader source notebooks (:mod:`normcore.classroom.nbgrader_source`), without nbgrader.

nbgrader's two rewritings of a source notebook are simple enough to redo here (its
``ClearSolutions`` and ``ClearHiddenTests``, ``nbgrader/preprocessors``): with them every
chapter's source gives its student notebook.  tests/test_classroom_nbgrader.py runs
nbgrader itself.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import pytest

from normcore.classroom.__main__ import main
from normcore.classroom.marking import MarkingError
from normcore.classroom.nbgrader_source import (HIDDEN_BEGIN, HIDDEN_END, hidden_check,
                                                source_notebook)
from normcore.classroom.nosolutions import without_solutions
from normcore.classroom.plainmd import book_index
from normcore.classroom.student import student_notebook

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9]*.ipynb"))
STUB = ["# YOUR CODE HERE", "raise NotImplementedError()"]


def clear_solutions(source: str) -> str:
    """nbgrader's ClearSolutions on a code cell: each region, markers included, becomes the
    stub at the BEGIN line's indentation."""
    out, inside = [], False
    for line in source.split("\n"):
        if "BEGIN SOLUTION" in line:
            inside = True
            out += [re.match(r"\s*", line).group(0) + s for s in STUB]
        elif "END SOLUTION" in line:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def clear_hidden_tests(source: str) -> str:
    out, inside = [], False
    for line in source.split("\n"):
        if "BEGIN HIDDEN TESTS" in line:
            inside = True
        elif "END HIDDEN TESTS" in line:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


@pytest.fixture(scope="module")
def index():
    return book_index(ROOT / "chapters")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_source_gives_the_student_notebook(path, index):
    chapter = nbformat.read(path, as_version=4)
    source = source_notebook(chapter, path.stem, index)
    student = student_notebook(chapter, path.stem, index)
    assert len(source.cells) == len(student.cells)
    for s, t in zip(source.cells, student.cells):
        assert (s.cell_type, s.get("id"), s.metadata) == (t.cell_type, t.get("id"), t.metadata)
        nbg = s.metadata.get("nbgrader", {})
        if nbg.get("solution") and s.cell_type == "code":
            assert "### BEGIN SOLUTION" in s.source and s.source != t.source
        if nbg.get("grade") and s.cell_type == "code":
            assert HIDDEN_BEGIN in s.source and "hidden=True" in s.source
        assert clear_hidden_tests(clear_solutions(s.source)) == t.source
    assert source.metadata == student.metadata


def test_source_keeps_the_def_line_and_the_body_between_the_markers(index):
    chapter = nbformat.read(ROOT / "chapters" / "02_batch_norm.ipynb", as_version=4)
    source = source_notebook(chapter, "02_batch_norm", index)
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in source.cells}
    assert cells["ex-bn-forward-solution"].startswith(
        "def my_batch_norm(x, gamma, beta, eps):\n    ### BEGIN SOLUTION\n")
    rules = '                         rules=("no-torch-norms", "no-normcore"))'
    assert cells["ex-bn-forward-check"] == "\n".join([
        'report = exercises.check("batch_norm", my_batch_norm,', rules, "print(report)",
        "assert report.passed", HIDDEN_BEGIN,
        'report = exercises.check("batch_norm", my_batch_norm, hidden=True,', rules,
        "print(report)", "assert report.passed", HIDDEN_END])
    # a derivation: a manually graded answer cell, nbgrader's text stub
    answer = next(c for c in source.cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "ex-bn-bias-eval-answer")
    assert answer.cell_type == "markdown" and answer.source == "YOUR ANSWER HERE"
    assert answer.metadata.nbgrader["solution"] and answer.metadata.nbgrader["grade"]


def test_hidden_check_carries_the_options_and_the_rules():
    entry = {"op": "group_norm", "function": "my_group_norm", "options": ", ndims=(4,)"}
    assert hidden_check(entry).split("\n")[0] == \
        'report = exercises.check("group_norm", my_group_norm, ndims=(4,), hidden=True)'
    short = {"op": "dyt", "function": "f"}
    assert hidden_check({**short, "rules": ["no-autograd"]}).split("\n")[0] == \
        'report = exercises.check("dyt", f, hidden=True, rules=("no-autograd",))'
    two = hidden_check({**entry, "rules": ["no-autograd", "no-normcore"]})
    assert two.split("\n")[:2] == [
        'report = exercises.check("group_norm", my_group_norm, ndims=(4,), hidden=True,',
        '                         rules=("no-autograd", "no-normcore"))']
    assert max(map(len, two.split("\n"))) <= 79
    compile(two, "hidden", "exec")


def test_an_nbgrader_marker_outside_a_solution_is_refused():
    chapter = nbformat.read(ROOT / "chapters" / "02_batch_norm.ipynb", as_version=4)
    nb = copy.deepcopy(chapter)
    nb.cells[1].source += "\n\nThe solutions stand between `### BEGIN SOLUTION` and ..."
    with pytest.raises(MarkingError, match=r"cell 1: contains 'BEGIN SOLUTION'.*reword"):
        source_notebook(nb, "02_batch_norm")
    nb = copy.deepcopy(chapter)
    solution = next(i for i, c in enumerate(nb.cells)
                    if c.metadata.get("normcore", {}).get("role") == "solution")
    nb.cells[solution].source += "\n# ### END HIDDEN TESTS"
    with pytest.raises(MarkingError, match=f"cell {solution}: contains 'END HIDDEN TESTS'"):
        source_notebook(nb, "02_batch_norm")


def test_a_copy_without_solutions_is_refused():
    chapter = nbformat.read(ROOT / "chapters" / "02_batch_norm.ipynb", as_version=4)
    with pytest.raises(ValueError, match=r"without solutions.*give the book's chapter"):
        source_notebook(without_solutions(chapter), "02_batch_norm")


def test_nbgrader_source_command(tmp_path, capsys):
    chapter = str(ROOT / "chapters" / "02_batch_norm.ipynb")
    out = tmp_path / "course" / "source" / "ps1"
    assert main(["nbgrader-source", chapter, "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == f"{chapter} -> {out / '02_batch_norm.ipynb'}"
    assert printed.err == ""
    first = (out / "02_batch_norm.ipynb").read_bytes()
    assert HIDDEN_BEGIN.encode() in first
    # deterministic; and a folder nbgrader would not read as an assignment is named
    assert main(["nbgrader-source", chapter, "-o", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "02_batch_norm.ipynb").read_bytes() == first
    assert "COURSE/source/ASSIGNMENT" in capsys.readouterr().err
    assert main(["nbgrader-source", chapter, "-o", str(ROOT / "chapters")]) == 1
    assert "is the chapter itself" in capsys.readouterr().err
