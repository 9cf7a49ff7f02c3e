"""Grading against a roster: every student, every exercise, and the gradebook for an LMS.

One grading run of planted submissions (three notebooks run, one unreadable) against a
roster of three students, two chapters handed out: alice handed in both, bob one, carol
none, and mallory, who is not on the roster, one.  The pattern and the roster's errors
need no kernel.
"""
from __future__ import annotations

import contextlib
import csv
import io
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from normcore.classroom import student_notebook
from normcore.classroom.__main__ import main
from normcore.classroom.grade import Row
from normcore.classroom.gradebook import (chapter_exercises, complete, default_gradebook,
                                          scores)
from normcore.classroom.roster import (DEFAULT_PATTERN, Student, find_submissions,
                                       read_roster, student_pattern)
from test_classroom import KERNELSPEC, SETUP, call, exercise_cells, plant, solutions_of


def small_chapters() -> dict:
    """Two chapters: ``ch_a`` (a checked exercise of 2 points and a derivation of 1),
    ``ch_b`` (a checked exercise of 1 point)."""
    a = new_notebook(cells=[new_code_cell(SETUP), *exercise_cells(
        "ex-a", "batch_norm", "fa", call("bn_correct", "batch_norm"), points=2),
        *exercise_cells("ex-why", None, None, "### BEGIN SOLUTION\nassert 1 + 1 == 2\n"
                        "### END SOLUTION", points=1, check=False)],
        metadata={"kernelspec": KERNELSPEC})
    b = new_notebook(cells=[new_code_cell(SETUP), *exercise_cells(
        "ex-b", "layer_norm", "fb", call("ln_correct", "layer_norm"), points=1)],
        metadata={"kernelspec": KERNELSPEC})
    return {"ch_a": a, "ch_b": b}


def write_roster(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("class")
    chapters = small_chapters()
    for name, nb in chapters.items():
        nbformat.write(nb, tmp / f"{name}.ipynb")
    subs = tmp / "submissions"
    for student, name, solved in (("alice", "ch_a", True), ("alice", "ch_b", True),
                                  ("bob", "ch_a", False)):
        nb = student_notebook(chapters[name], name)
        (subs / student).mkdir(parents=True, exist_ok=True)
        nbformat.write(plant(nb, solutions_of(chapters[name])) if solved else nb,
                       subs / student / f"{name}.ipynb")
    (subs / "mallory").mkdir()
    (subs / "mallory" / "ch_b.ipynb").write_text("not json", encoding="utf-8")
    roster = write_roster(tmp / "students.csv",
                          "id,name,email\nalice,Alice Martin,a@x\nbob,Bob Chen,b@x\n"
                          "carol,Carol Diaz,c@x\n")
    out = tmp / "grades.csv"
    argv = ["grade", str(subs), "--out", str(out), "--roster", str(roster), "--chapters",
            str(tmp / "ch_a.ipynb"), str(tmp / "ch_b.ipynb"), "--no-progress", "-j", "2",
            "--cell-timeout", "60"]
    return tmp, subs, argv


@pytest.fixture(scope="module")
def ran(graded_class):
    tmp, subs, argv = graded_class
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    with open(tmp / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return code, out.getvalue(), err.getvalue(), rows


def test_every_student_has_a_row_for_every_exercise(ran, graded_class):
    code, out, err, rows = ran
    _, subs, _ = graded_class
    assert code == 0, err
    by = {(r["student"], r["exercise"]): r for r in rows}
    for student in ("alice", "bob", "carol"):
        assert [r["exercise"] for r in rows if r["student"] == student] == [
            "ex-a", "ex-why", "ex-b"], student
    assert [by["alice", e]["status"] for e in ("ex-a", "ex-why", "ex-b")] == [
        "passed", "manual", "passed"]
    assert (by["bob", "ex-a"]["status"], by["bob", "ex-a"]["score"]) == ("not implemented", "0")
    row = by["bob", "ex-b"]
    assert (row["status"], row["score"], row["chapter"]) == ("missing", "0", "ch_b")
    assert row["detail"] == f"missing: no submission found at {subs}/bob/ch_b.ipynb"
    for label, chapter in (("ex-a", "ch_a"), ("ex-why", "ch_a"), ("ex-b", "ch_b")):
        row = by["carol", label]
        assert (row["status"], row["score"]) == ("missing", "0")
        assert row["detail"] == f"missing: no submission found at {subs}/carol/{chapter}.ipynb"


def test_a_student_not_on_the_roster_is_reported_not_dropped(ran, graded_class):
    code, out, err, rows = ran
    tmp, _, _ = graded_class
    assert ("warning: mallory/ch_b.ipynb: student 'mallory' is not on the roster: graded, "
            "in the grade sheet and feedback, not in the gradebook") in err
    mine = [r for r in rows if r["student"] == "mallory"]
    # her unreadable notebook is named after ch_b: that chapter's rows, marked
    assert [(r["chapter"], r["exercise"], r["status"]) for r in mine] == [
        ("ch_b", "ex-b", "unreadable")]
    assert mine[0]["detail"].startswith("not on the roster; not a readable notebook")
    assert (tmp / "grades-feedback" / "mallory.md").exists()


def test_gradebook_one_line_per_student_one_column_per_exercise(ran, graded_class):
    code, out, err, _ = ran
    tmp, _, _ = graded_class
    path = default_gradebook(tmp / "grades.csv")
    assert path == tmp / "grades-gradebook.csv" and f"gradebook: {path}" in out
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    assert lines == [["id", "name", "ex-a", "ex-why", "ex-b", "total"],
                     ["alice", "Alice Martin", "2", "", "1", "3"],   # by hand: left empty
                     ["bob", "Bob Chen", "0", "", "0", "0"],
                     ["carol", "Carol Diaz", "0", "0", "0", "0"]]
    assert ("totals (checked exercises, out of 3):\n  alice: 3\n  bob: 0 (missing: ch_b)\n"
            "  carol: 0 (no submission)") in out
    carol = (tmp / "grades-feedback" / "carol.md").read_text()
    assert "Checked exercises: 0 of 3 points." in carol
    assert "**Diagnosis:** missing: no submission found at" in carol


def test_gradebook_file_can_be_chosen(graded_class, tmp_path, capsys):
    """--gradebook FILE; and every input is checked before a notebook runs: a roster
    without an id column stops the command at once."""
    tmp, subs, argv = graded_class
    bad = write_roster(tmp_path / "bad.csv", "name\nAlice\n")
    assert main([*argv[:5], str(bad), *argv[6:], "--gradebook", str(tmp_path / "gb.csv")]) == 2
    err = capsys.readouterr().err
    assert "has no column 'id' (its header is 'name')" in err
    assert not (tmp_path / "gb.csv").exists()


def test_roster_without_chapters_is_refused(graded_class, capsys):
    _, subs, argv = graded_class
    with pytest.raises(SystemExit):
        main(["grade", str(subs), "--out", "x.csv", "--roster", "r.csv"])
    assert "--roster needs --chapters" in capsys.readouterr().err


# =======================================================================================
# no kernel: the pattern, the roster, complete() on rows
# =======================================================================================
def touch(folder, *names):
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")


def test_default_pattern_takes_the_first_folder_or_the_name(tmp_path):
    touch(tmp_path, "alice/02_batch_norm.ipynb", "bob.ipynb", "carol/late/02_batch_norm.ipynb",
          "dave/.ipynb_checkpoints/02_batch_norm-checkpoint.ipynb")
    folder, found = find_submissions([tmp_path])
    assert folder == tmp_path
    assert [(s.relative, s.student) for s in found] == [
        ("alice/02_batch_norm.ipynb", "alice"), ("bob.ipynb", "bob"),
        ("carol/late/02_batch_norm.ipynb", "carol")]
    # notebooks given one by one: the folder they share (one notebook alone: its own folder,
    # so give the submissions folder to read the student from a folder's name)
    folder, found = find_submissions([tmp_path / "alice/02_batch_norm.ipynb",
                                      tmp_path / "carol/late/02_batch_norm.ipynb"])
    assert folder == tmp_path and [s.student for s in found] == ["alice", "carol"]
    folder, found = find_submissions([tmp_path / "alice/02_batch_norm.ipynb"])
    assert folder == tmp_path / "alice" and found[0].student == "02_batch_norm"
    assert student_pattern(None).pattern == DEFAULT_PATTERN


def test_custom_pattern(tmp_path):
    touch(tmp_path, "hw1/alice_02.ipynb", "hw1/bob_02.ipynb")
    pattern = r"(?P<student>[a-z]+)_\d+\.ipynb$"
    _, found = find_submissions([tmp_path], pattern)
    assert [s.student for s in found] == ["alice", "bob"]
    # carol's missing work: the path bob's had, with her id
    chapters = {"02": [{"label": "ex-a", "points": 2, "op": "batch_norm"}]}
    rows = [Row(s.student, "02", "ex-a", "batch_norm", 2, 2, "passed", "", "", "",
                source=str(s.path)) for s in found]
    roster = [Student("alice"), Student("bob"), Student("carol")]
    out, warnings = complete(rows, roster, chapters, found, tmp_path, pattern)
    assert not warnings
    assert out[-1].detail == f"missing: no submission found at {tmp_path}/hw1/carol_02.ipynb"
    assert [line["total"] for line in scores(out, roster, chapters)] == [2, 2, 0]


def test_a_chapter_nobody_handed_in_and_a_second_copy(tmp_path):
    touch(tmp_path, "alice/a.ipynb", "alice/a-again.ipynb", "alice/a-late.ipynb")
    folder, found = find_submissions([tmp_path])
    chapters = {"a": [{"label": "ex-a", "points": 2, "op": "batch_norm"}],
                "b": [{"label": "ex-b", "points": 1, "op": "layer_norm"}]}
    rows = [Row("alice", "a", "ex-a", "batch_norm", 2, score, "passed" if score else
                "incorrect", "", "", "", source=str(s.path))
            for s, score in zip(found, (2, 2, 0))]   # best 2: not the sum, not the last
    out, warnings = complete(rows, [Student("alice")], chapters, found, folder, DEFAULT_PATTERN)
    assert warnings == [("warning: alice handed in a 3 times: the gradebook counts the best "
                         "score of each exercise")]
    assert out[-1].detail == (f"missing: no submission of b found for alice in {tmp_path} "
                              f"(no notebook of this chapter there; the student is the group "
                              f"'student' of {DEFAULT_PATTERN!r})")
    assert scores(out, [Student("alice")], chapters)[0] == {
        "id": "alice", "name": "", "ex-a": 2, "ex-b": 0, "total": 2}


@pytest.mark.parametrize("pattern, message", [
    (r"(?P<id>[^/]+)/", "has no named group (?P<student>...)"),
    (r"(?P<student>[", "is not a regular expression"),
    (r"^(?P<student>\d+)/", "does not match the submission 'alice/x.ipynb'"),
    (r"(?P<student>\d*)x", "gives an empty student id for the submission 'alice/x.ipynb'"),
])
def test_bad_patterns_are_clear_errors(tmp_path, pattern, message):
    touch(tmp_path, "alice/x.ipynb")
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        find_submissions([tmp_path], pattern)
    assert repr(pattern) in str(e.value)


def test_bad_pattern_on_the_command_line_stops_before_grading(tmp_path, capsys):
    touch(tmp_path, "alice/x.ipynb")
    assert main(["grade", str(tmp_path), "--out", str(tmp_path / "g.csv"),
                 "--student-pattern", r"^(\w+)/"]) == 2
    assert "has no named group (?P<student>...)" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


@pytest.mark.parametrize("text, message", [
    ("", "is empty"),
    ("name\nAlice\n", "has no column 'id'"),
    ("id,name\nalice,A\nalice,B\n", "line 3: the id 'alice' is already on line 2"),
    ("id,name\n,Nobody\n", "line 2: no student id"),
    ("id,name\n", "lists no student"),
])
def test_bad_rosters_are_clear_errors(tmp_path, text, message):
    path = write_roster(tmp_path / "r.csv", text)
    with pytest.raises(ValueError, match=re.escape(message)):
        read_roster(path)


def test_roster_reads_ids_and_optional_names(tmp_path):
    path = write_roster(tmp_path / "r.csv", "\ufeffID,Name,extra\n alice ,Alice,1\n\nbob\n")
    assert read_roster(path) == [Student("alice", "Alice"), Student("bob", "")]


def test_chapter_exercises_from_a_chapter_or_its_student_version(tmp_path):
    a = small_chapters()["ch_a"]
    nbformat.write(a, tmp_path / "ch_a.ipynb")
    nbformat.write(student_notebook(a, "ch_a"), tmp_path / "student_a.ipynb")
    source = chapter_exercises([tmp_path / "ch_a.ipynb"])
    assert [e["label"] for e in source["ch_a"]] == ["ex-a", "ex-why"]
    assert chapter_exercises([tmp_path / "student_a.ipynb"]) == source
