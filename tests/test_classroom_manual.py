"""Answers graded by hand: the written part of a coding exercise, and the derivations.

A small chapter has one coding exercise that also asks a question in words (its written
part, 1 point) and a derivation.  Three planted submissions are graded once, against a
roster: alice solved the code and answered both questions, bob left everything as handed
out, carol solved the code and deleted both answer cells.  The export (one file per
exercise and ``manual.csv``), the merge of the instructor's scores and its errors read the
files that run wrote.  The book's own written parts are checked without a kernel.
"""
from __future__ import annotations

import contextlib
import copy
import csv
import io
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from normcore.classroom import (MarkingError, exercise_table, read_exercises,
                                student_notebook)
from normcore.classroom.__main__ import main
from normcore.classroom.grade import Row
from normcore.classroom.manual import ManualError, merge, models, read_grades
from normcore.classroom.marking import marking
from normcore.classroom.plainmd import BookIndex, book_index
from normcore.classroom.student import written_line
from test_classroom import KERNELSPEC, SETUP, call, exercise_cells, plant, solutions_of

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9]*.ipynb"))
#: The book's coding exercises that also ask a question in words, and its points.
BOOK_WRITTEN = {"ex-fold-by-hand": 1, "ex-chan-k": 1, "ex-gn-via-ln": 1, "ex-gn-backward": 2,
                "ex-ws-backward": 1, "ex-ws-fold": 1, "ex-brn-first-steps": 1}
QUESTION = "Why does BN subtract the mean?"


def small_chapter():
    """``ex-a`` (code, 2 points; a written part, 1 point) and ``ex-why`` (a derivation, 3)."""
    cells = [new_code_cell(SETUP),
             *exercise_cells("ex-a", "batch_norm", "fa", call("bn_correct", "batch_norm"),
                             points=2),
             *exercise_cells("ex-why", None, None, "### BEGIN SOLUTION\nassert 1 + 1 == 2\n"
                             "### END SOLUTION", points=3, check=False)]
    statement = cells[1]
    statement.metadata["normcore"]["written"] = {"points": 1}
    statement.source = statement.source.replace("\n````", f" {QUESTION}\n````")
    return new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC})


def grade_ids(nb) -> list[str]:
    return [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in nb.cells]


# =======================================================================================
# the marking and the student notebook
# =======================================================================================
def test_the_written_part_is_read():
    found = {e.label: e for e in read_exercises(small_chapter())}
    assert (found["ex-a"].points, found["ex-a"].written) == (2, 1)
    assert found["ex-why"].written == 0


@pytest.mark.parametrize("bad", [{"points": 0}, {"points": -1}, {"points": True}, 1, "1",
                                 {"points": 1.5}, {"points": "1"}, {"points": None},
                                 {"pts": 1}, {"points": 1, "rules": []}])
def test_a_bad_written_marking_is_refused(bad):
    nb = small_chapter()
    nb.cells[1].metadata["normcore"]["written"] = bad
    with pytest.raises(MarkingError, match=r"cell 1: 'written' must be \{\"points\": P\} "
                                           r"with P a positive int"):
        read_exercises(nb)


def test_a_derivation_cannot_have_a_written_part():
    nb = small_chapter()
    statement = next(c for c in nb.cells if marking(c) == {
        "exercise": "ex-why", "role": "statement", "points": 3})
    statement.metadata["normcore"]["written"] = {"points": 1}
    with pytest.raises(MarkingError, match="'written' marks the question of a coding"):
        read_exercises(nb)


def test_the_student_notebook_has_an_answer_cell_after_the_check():
    student = student_notebook(small_chapter(), "small", BookIndex())
    ids = grade_ids(student)
    assert ids.index("ex-a-written") == ids.index("ex-a-check") + 1
    cell = student.cells[ids.index("ex-a-written")]
    assert cell.cell_type == "markdown" and cell.source == "YOUR ANSWER HERE"
    assert cell.metadata["nbgrader"] == {"grade": True, "grade_id": "ex-a-written",
                                         "locked": False, "points": 1, "schema_version": 3,
                                         "solution": True}
    statement = student.cells[ids.index("ex-a-statement")].source
    assert statement.startswith("**Exercise** (`ex-a`, 2 points + 1 for the answer in words)")
    assert statement.endswith(written_line(1)) and "1 point, graded by hand" in statement
    entry = student.metadata["normcore"]["classroom"]["exercises"][0]
    assert (entry["points"], entry["written"]) == (2, 1)
    # a derivation keeps its own answer cell, and no written part
    assert "ex-why-answer" in ids and "ex-why-written" not in ids
    assert "written" not in student.metadata["normcore"]["classroom"]["exercises"][1]
    nbformat.validate(nbformat.from_dict(student))


def test_the_books_written_parts():
    """The seven coding exercises that ask a question in words each have a written part,
    a model answer in their solution's prose, and an answer cell after their check."""
    index = book_index(ROOT / "chapters")
    found, answers = {}, {}
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        mine = {e.label: e.written for e in read_exercises(nb, path.name) if e.written}
        found.update(mine)
        answers.update({label: m["answer"] for (_, label), m in models([path]).items()})
        if mine:
            ids = grade_ids(student_notebook(nb, path.stem, index))
            for label in mine:
                assert ids.index(f"{label}-written") == ids.index(f"{label}-check") + 1
    assert found == BOOK_WRITTEN
    for label in BOOK_WRITTEN:
        assert len(answers[f"{label}:written"]) > 100, label   # the model answer's prose
    table = exercise_table(CHAPTERS)   # the classroom page's table
    assert "| 6 | `ex-gn-backward` | 3 + 2 in words | `group_norm_backward` |" in table
    # the counted answer of ex-fold-by-hand: BN's one scale-and-shift per output element
    assert "N \\cdot C_{\\text{out}}" in answers["ex-fold-by-hand:written"]


# =======================================================================================
# grading three planted submissions
# =======================================================================================
def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def answer(nb, grade_id, text):
    nb = copy.deepcopy(nb)
    next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
         ).source = text
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("manual")
    chapter = small_chapter()
    nbformat.write(chapter, tmp / "small.ipynb")
    student = student_notebook(chapter, "small")
    solved = plant(student, solutions_of(chapter))
    alice = answer(answer(solved, "ex-a-written", "# Mine\nTo center it."),
                   "ex-why-answer", "It is $2$.")
    carol = copy.deepcopy(solved)
    carol.cells = [c for c in carol.cells
                   if c.metadata.get("nbgrader", {}).get("grade_id") not in (
                       "ex-a-written", "ex-why-answer")]
    for name, nb in (("alice", alice), ("bob", student), ("carol", carol)):
        (tmp / "subs" / name).mkdir(parents=True)
        nbformat.write(nb, tmp / "subs" / name / "small.ipynb")
    (tmp / "students.csv").write_text("id,name\nalice,Alice Martin\nbob,Bob Chen\n"
                                      "carol,Carol Diaz\n", encoding="utf-8")
    code, out, err = run(["grade", str(tmp / "subs"), "--out", str(tmp / "grades.csv"),
                          "--roster", str(tmp / "students.csv"), "--chapters",
                          str(tmp / "small.ipynb"), "--no-progress", "-j", "2"])
    assert code == 0, err
    return tmp, out


def read_csv(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_each_written_part_is_a_manual_row(graded):
    tmp, out = graded
    rows = {(r["student"], r["exercise"]): r for r in read_csv(tmp / "grades.csv")}
    assert [r["exercise"] for r in read_csv(tmp / "grades.csv")][:3] == [
        "ex-a", "ex-a:written", "ex-why"]
    assert rows["alice", "ex-a"]["status"] == rows["carol", "ex-a"]["status"] == "passed"
    for student, detail in (("alice", "answered"), ("bob", "no answer"),
                            ("carol", "answer cell deleted")):
        for label, points in (("ex-a:written", "1"), ("ex-why", "3")):
            row = rows[student, label]
            assert (row["status"], row["score"], row["points"], row["op"], row["detail"]) == (
                "manual", "0", points, "", detail), row
    assert "ex-a:written (1 point): graded by hand, 1 of 3 answered" in out
    assert "ex-why (3 points): graded by hand, 1 of 3 answered" in out
    assert "merge " in out and "manual.csv" in out


def test_the_answers_are_exported(graded):
    tmp, _ = graded
    folder = tmp / "grades-answers"
    assert sorted(p.name for p in folder.iterdir()) == [
        "ex-a-written.md", "ex-why.md", "manual.csv"]
    text = (folder / "ex-a-written.md").read_text(encoding="utf-8")
    assert text.startswith("# ex-a:written (small, 1 point)\n")
    question, model, answers = (text.index("## The question"),
                                text.index("## The model answer"), text.index("## The answers"))
    assert question < text.index(QUESTION) < model
    assert model < text.index("Hint only the solution shows (ex-a).") < answers
    assert "### Alice Martin (alice)\n\n> # Mine\n> To center it.\n" in text
    assert "### Bob Chen (bob)\n\n*(no answer)*" in text
    assert "### Carol Diaz (carol)\n\n*(answer cell deleted)*" in text
    why = (tmp / "grades-answers" / "ex-why.md").read_text(encoding="utf-8")
    assert "```python\n### BEGIN SOLUTION\nassert 1 + 1 == 2" in why   # the derivation's code
    assert "> It is $2$." in why
    lines = read_csv(folder / "manual.csv")
    assert [(r["student"], r["exercise"], r["points"], r["score"]) for r in lines] == [
        (s, e, p, "") for s in ("alice", "bob", "carol")
        for e, p in (("ex-a:written", "1"), ("ex-why", "3"))]


def test_the_gradebook_has_a_column_per_written_part(graded):
    tmp, _ = graded
    book = read_csv(tmp / "grades-gradebook.csv")
    assert list(book[0]) == ["id", "name", "ex-a", "ex-a:written", "ex-why", "total"]
    assert [(b["ex-a"], b["ex-a:written"], b["ex-why"], b["total"]) for b in book] == [
        ("2", "", "", "2"), ("0", "", "", "0"), ("2", "", "", "2")]


def fill(tmp, scores: dict, name="filled.csv") -> Path:
    """``manual.csv`` with ``scores[(student, exercise)]`` filled in."""
    lines = read_csv(tmp / "grades-answers" / "manual.csv")
    for line in lines:
        line["score"] = scores.get((line["student"], line["exercise"]), "")
    path = tmp / name
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, list(lines[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(lines)
    return path


def test_the_scores_are_merged_into_the_grades_and_the_gradebook(graded):
    tmp, _ = graded
    filled = fill(tmp, {("alice", "ex-a:written"): "1", ("alice", "ex-why"): "2.5",
                        ("bob", "ex-a:written"): "0"})
    out = tmp / "merged.csv"
    code, text, err = run(["merge", str(tmp / "grades.csv"), str(filled), "--out", str(out),
                           "--roster", str(tmp / "students.csv"),
                           "--chapters", str(tmp / "small.ipynb")])
    assert code == 0, err
    assert "merged 3 score(s)" in text and "3 answer(s) still to score" in text
    rows = {(r["student"], r["exercise"]): r for r in read_csv(out)}
    assert (rows["alice", "ex-why"]["status"], rows["alice", "ex-why"]["score"]) == (
        "graded by hand", "2.5")
    assert rows["bob", "ex-why"]["status"] == "manual"
    book = read_csv(tmp / "merged-gradebook.csv")
    assert [(b["ex-a:written"], b["ex-why"], b["total"]) for b in book] == [
        ("1", "2.5", "5.5"), ("0", "", "0"), ("", "", "2")]
    # merging again, a score changed: the merged sheet takes the new one
    again = fill(tmp, {("alice", "ex-why"): "3"}, "again.csv")
    assert run(["merge", str(out), str(again)])[0] == 0
    rows = {(r["student"], r["exercise"]): r for r in read_csv(out)}
    assert rows["alice", "ex-why"]["score"] == "3"
    assert rows["alice", "ex-a:written"]["score"] == "1"   # left empty: kept


@pytest.mark.parametrize("edit, message", [
    (("alice", "ex-a:written", "score", "2"),
     "line 2: score 2 is above the range of this answer's 1 point: give a number from 0 to 1"),
    (("bob", "ex-why", "score", "-1"), "line 5: score -1 is below the range"),
    (("bob", "ex-why", "score", "good"),
     "line 5: score 'good' is not a number: give a number from 0 to 3, or leave it empty"),
    (("carol", "ex-why", "student", "zoe"),
     "line 7: student 'zoe' is not in the grade sheet (it has alice, bob, carol): correct"),
    (("carol", "ex-why", "exercise", "ex-b"),
     ("line 7: exercise 'ex-b' is not an exercise of carol's in the grade sheet (in chapter "
      "small): give one of carol's answers graded by hand (ex-a:written, ex-why), or delete "
      "the line")),
    (("carol", "ex-why", "exercise", "ex-a"),
     "line 7: exercise 'ex-a' is passed, not graded by hand"),
    (("carol", "ex-why", "exercise", "ex-a:written"),
     "line 7: carol's ex-a:written is scored on line 6 already: keep one of the two lines"),
])
def test_bad_scores_are_clear_errors(graded, edit, message):
    tmp, _ = graded
    student, exercise, column, value = edit
    lines = read_csv(tmp / "grades-answers" / "manual.csv")
    for line in lines:
        line["score"] = "1" if line["exercise"] == "ex-why" else "0"
        if (line["student"], line["exercise"]) == (student, exercise):
            line[column] = value
    path = tmp / "bad.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, list(lines[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(lines)
    rows = read_grades(tmp / "grades.csv")
    with pytest.raises(ManualError) as e:
        merge(rows, path)
    assert message in str(e.value)
    assert all(r.status != "graded by hand" for r in rows)   # nothing merged
    before = (tmp / "grades.csv").read_bytes()
    code, _, err = run(["merge", str(tmp / "grades.csv"), str(path)])
    assert code == 2 and message in err
    assert (tmp / "grades.csv").read_bytes() == before


def test_a_file_that_is_not_manual_csv_is_refused(tmp_path):
    path = tmp_path / "manual.csv"
    path.write_text("id,points\nalice,1\n", encoding="utf-8")
    rows = [Row("alice", "small", "ex-why", "", 3, 0, "manual", "", "", "answered")]
    with pytest.raises(ManualError, match=r"no column student, exercise, score: give the "
                                          r"manual\.csv that `grade` wrote"):
        merge(rows, path)
    with pytest.raises(ManualError, match="not a grade sheet of `grade`"):
        read_grades(path)
