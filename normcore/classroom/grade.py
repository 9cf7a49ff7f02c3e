"""Grading a class: every submission in its own process and kernel, one row per exercise.

:func:`grade` never writes to a submission.  For each one it builds a prepared copy in a
temporary directory, in which every check cell is the grader's own (a call of
:func:`normcore.classroom.capture.capture`, which hands the exercise's function to the grader;
a deleted check cell is restored at the end; :mod:`.judging` then checks the functions in a
process of its own), and runs it with :mod:`normcore.classroom.runner` in a child process: a fresh kernel, a
time limit per cell (the cell is interrupted, the next one runs), a time limit for the
whole notebook (the process and its kernel are killed), and a memory limit
(``RLIMIT_AS``).  Student code runs as the user who grades: the limits stop accidents
(an infinite loop, a huge tensor), they are not a sandbox against a malicious student.

Grading runs what the exercises need, not the chapter's training demos and figures: a cell
marked ``"normcore": {"grading": "skip"}`` (:mod:`.skipping`) runs as one comment line,
``# skipped when grading: <its first line>``; an exercise's cells never are.  Who decides
what is skipped: the instructor's chapters when given (``grade(..., skip=...)``, from the
command's ``--chapters``: the cells of the chapter with the same cell ids, whatever the
submission's metadata says, since a student can edit it), else the submission's own marking
(a student who deletes it only makes grading slower; one who marks more only skips what
their exercises may need); ``skip=False`` (``--no-skip``) runs every cell.

Statuses: ``passed``, ``misconception``, ``incorrect`` (wrong, no known mistake),
``not implemented`` (still the stub), ``error`` (the function or its cell raised),
``timed out`` (a time limit stopped it), ``kernel died`` (the kernel was killed, by a signal
such as the system's out-of-memory killer or the student's own ``os.kill``, or exited, before
the exercise's function was handed over; or the grader's process died while it ran that
function), ``forbidden`` (it used what the exercise's rules forbid), ``missing function`` (renamed or
deleted), ``unreadable`` (not a notebook); with a roster (:mod:`.gradebook`), ``missing``
(not handed in).

Scores: an exercise's rubric (the manifest's ``"rubric"``, all points on a correct answer
when there is none) splits its points over properties of a correct answer, and
:func:`normcore.exercises.credit.credit` gives a wrong answer the points of the properties
the checker verified; the column ``credit`` shows them (``set:1 variance+eps+affine:0``).

``manual``: an answer in words, graded by hand: a derivation (row ``<label>``) or the written
part of a coding exercise (its own row, ``<label>:written``, after the coding row); the
score is 0 until the instructor's scores are merged in (:mod:`.manual`), and the detail
says whether the student wrote anything: ``answered``, ``no answer`` (the cell still reads
``YOUR ANSWER HERE``, or is empty) or ``answer cell deleted``.
"""
from __future__ import annotations

import copy
import csv
import json
import re
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

import nbformat

from normcore.exercises.credit import credit, default_rubric

from .judging import _kill_group, judge_captured
from .runner import TIMEOUT_ERROR
from .skipping import is_skipped, skipped_source, with_skips

_DEF_RE = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.M)


@dataclass
class Row:
    """One line of the grade sheet: one student and one exercise.  ``feedback`` and
    ``source`` are not columns: the checker's text for the student's feedback file
    (:mod:`.feedback`), ``{"message": ..., "advice": [{"key", "title", "did", "why",
    "fix"}, ...], "credit": [[item, points, earned], ...]}``, and the submission's path.
    ``credit``: the points earned per rubric item, ``set:1 variance+eps:0``."""

    student: str
    chapter: str
    exercise: str
    op: str
    points: int
    score: int
    status: str
    misconception: str
    misconception_name: str
    detail: str
    feedback: dict = field(default_factory=dict, repr=False)
    source: str = field(default="", repr=False)
    credit: str = ""
    #: A manual row's answer, as the student wrote it (for :mod:`.manual`'s export).
    answer: str = field(default="", repr=False)


#: The grade sheet's columns: every field of :class:`Row` but the three above.
COLUMNS = tuple(f.name for f in fields(Row) if f.name not in ("feedback", "source", "answer"))
#: The exercise of a written part's row: ``ex-chan-k`` -> ``ex-chan-k:written``.
WRITTEN = ":written"
#: What an answer cell holds until the student writes in it (:mod:`.student`).
UNANSWERED = "YOUR ANSWER HERE"


#: What a capture in the student's kernel may report (:mod:`.capture`).
KERNEL_STATUSES = ("captured", "missing function", "error")


def _nbgrader_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def check_source(ex: dict) -> str:
    """The grader's check cell for exercise ``ex`` of the manifest: it hands the student's
    function to the grader (:mod:`.capture`); it checks nothing in the student's kernel."""
    return ("from normcore.classroom.capture import capture as _normcore_capture\n"
            f"_normcore_capture({ex['label']!r}, {ex['function']!r}, globals())")


def prepare(nb, manifest: dict) -> tuple[object, set[str]]:
    """A copy of ``nb`` whose check cells are the grader's; the labels whose check cell
    the student deleted (restored at the end of the copy)."""
    nb = copy.deepcopy(nb)
    coding = [e for e in manifest["exercises"] if e.get("op")]
    found = set()
    for cell in nb.cells:
        for ex in coding:
            if cell.cell_type == "code" and _nbgrader_id(cell) == f"{ex['label']}-check":
                cell.source = check_source(ex)
                found.add(ex["label"])
    deleted = {e["label"] for e in coding} - found
    for ex in coding:
        if ex["label"] in deleted:
            nb.cells.append(nbformat.v4.new_code_cell(check_source(ex),
                                                      id=f"grader-{ex['label']}"[:64]))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            _skip_when_grading(cell)
    return nb, deleted


def _skip_when_grading(cell) -> None:
    """A cell marked to skip becomes one comment line (never an exercise's cell)."""
    if is_skipped(cell) and not _nbgrader_id(cell):
        cell.source = skipped_source(cell.source)


def _read_results(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _kernel_pid(entries: list[dict]) -> int | None:
    return next((e.get("pid") for e in entries if e.get("event") == "kernel"), None)


#: The children running now (pid -> results file), so that an interrupted grader can stop
#: them and their kernels, which run in sessions of their own.
_RUNNING: dict[int, Path] = {}
_RUNNING_LOCK = threading.Lock()


def stop_all() -> None:
    """Kill every running child and its kernel (the grader was interrupted)."""
    with _RUNNING_LOCK:
        running = dict(_RUNNING)
    for pid, results in running.items():
        _kill_group(pid)
        _kill_group(_kernel_pid(_read_results(results)))


def run_submission(nb, workdir: Path, cell_timeout: int, timeout: int, memory: int) -> dict:
    """Execute the prepared ``nb`` in a child process; what it recorded, by kind."""
    prepared, results = workdir / "prepared.ipynb", workdir / "results.jsonl"
    prepared.write_text(nbformat.writes(nb), encoding="utf-8")
    results.write_text("")
    cmd = [sys.executable, "-m", "normcore.classroom.runner", str(prepared), str(results),
           "--cell-timeout", str(cell_timeout), "--memory", str(memory)]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    with _RUNNING_LOCK:
        _RUNNING[child.pid] = results
    timed_out = False
    try:
        _, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(child.pid)
        _, stderr = child.communicate()
    except BaseException:  # interrupted: stop the child and its kernel, then give up
        _kill_group(child.pid)
        _kill_group(_kernel_pid(_read_results(results)))
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.pop(child.pid, None)
    entries = _read_results(results)
    kernel = _kernel_pid(entries)
    finished = bool(entries) and entries[-1].get("event") == "done"
    if not finished:
        _kill_group(kernel)  # the kernel has a session of its own: make sure it is gone
    out = {"labels": {}, "cells": {}, "timed_out": timed_out, "dead": None, "died": None,
           "kernel": kernel, "stderr": stderr.decode(errors="replace")[-2000:]}
    for e in entries:
        if "label" in e:
            # written by the student's kernel, so only what a capture writes counts: a
            # verdict such as "passed" is never taken from there (the grader judges)
            if e.get("status") in KERNEL_STATUSES:
                out["labels"][e["label"]] = {k: str(e.get(k, "")) for k in ("label", "status",
                                                                           "detail")}
        elif e.get("event") == "cell":
            out["cells"][e["index"]] = e
        elif e.get("event") in ("dead kernel", "runner error"):
            out["dead"] = e.get("detail", e["event"])
            if e["event"] == "dead kernel":
                out["died"] = e
    if not finished:
        out["dead"] = out["dead"] or (None if timed_out else "the grading process failed")
    return out


def grade_one(path: Path, student: str, cell_timeout=60, timeout=600, memory=4096,
              hidden: bool = True, exercises_of: dict | None = None, skip=None
              ) -> list[Row]:
    """The rows of one submission (``skip``: see :func:`grade`)."""
    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = f"not a readable notebook: {type(e).__name__}: {str(e).splitlines()[0]}"
        return [Row(student, "", "*", "", 0, 0, "unreadable", "", "", why[:300],
                    source=str(path))]
    rows = grade_notebook(nb, student, cell_timeout, timeout, memory, hidden, exercises_of,
                          skip)[0]
    for row in rows:
        row.source = str(path)
    return rows


def grade_notebook(nb, student: str, cell_timeout=60, timeout=600, memory=4096,
                   hidden: bool = True, exercises_of: dict | None = None, skip=None):
    """The rows of one submission already read, and what its run recorded.  ``hidden``:
    check on the hidden test sets (:mod:`normcore.exercises.hidden`), not the notebook's.
    ``exercises_of``: the instructor's exercises per chapter
    (:func:`.gradebook.chapter_exercises`); a submission of one of those chapters is graded
    on them (points, op, rules), not on the list its own metadata carries, which a student
    can edit.  ``skip``: see :func:`grade`."""
    manifest = nb.get("metadata", {}).get("normcore", {}).get("classroom")
    if not isinstance(manifest, dict) or "exercises" not in manifest:
        why = "not a student notebook of normcore (no metadata.normcore.classroom)"
        return [Row(student, "", "*", "", 0, 0, "unreadable", "", "", why)], None
    if exercises_of and manifest.get("source") in exercises_of:
        manifest = {"source": manifest["source"],
                    "exercises": exercises_of[manifest["source"]]}
    prepared, deleted = prepare(with_skips(nb, skip, manifest.get("source")), manifest)
    with tempfile.TemporaryDirectory(prefix="normcore-grade-") as tmp:
        ran = run_submission(prepared, Path(tmp), cell_timeout, timeout, memory)
        captured = [ex for ex in manifest["exercises"] if ex.get("op") and
                    ran["labels"].get(ex["label"], {}).get("status") == "captured"]
        if captured:
            ran["labels"].update(judge_captured(captured, Path(tmp), cell_timeout, memory,
                                                hidden))
    chapter, rows = manifest.get("source", ""), []
    for ex in manifest["exercises"]:
        rows.append(_row(student, chapter, ex, prepared, ran, deleted, cell_timeout, timeout))
        if ex.get("written"):
            rows.append(_manual(Row(student, chapter, ex["label"] + WRITTEN, "", ex["written"],
                                    0, "", "", "", ""), nb, f"{ex['label']}-written"))
    return rows, ran


def _manual(row: Row, nb, grade_id: str) -> Row:
    """``row`` as an answer to grade by hand, read from the answer cell ``grade_id``."""
    cell = next((c for c in nb.cells if _nbgrader_id(c) == grade_id), None)
    text = "" if cell is None else "".join(cell.source).strip()
    row.status, row.answer = "manual", "" if text == UNANSWERED else text
    row.detail = ("answer cell deleted" if cell is None else
                  "answered" if row.answer else "no answer")
    return row


def _cell_errors(nb, ran, label) -> list[dict]:
    """The errors of the student's solution cells of exercise ``label``."""
    return [ran["cells"][i] for i, cell in enumerate(nb.cells)
            if _nbgrader_id(cell).startswith(f"{label}-solution")
            and ran["cells"].get(i, {}).get("status") == "error"]


def _death(nb, died: dict) -> str:
    """The detail of a ``kernel died`` row: how the kernel ended, and where."""
    if "signal" in died:
        how = f"the kernel died (killed by signal {died['signal']}, {died['signal_name']})"
    elif "exit_code" in died:
        how = f"the kernel died (it exited with code {died['exit_code']})"
    else:
        how = "the kernel died"
    cell = died.get("cell")
    grade_id = _nbgrader_id(nb.cells[cell]) if cell is not None and cell < len(nb.cells) else ""
    owner = re.match(r"(.+)-(solution|check)(-\d+)?$", grade_id)
    where = (f" in {'your solution' if owner[2] == 'solution' else 'the check'} cell of "
             f"{owner[1]}" if owner else f" in cell {cell}" if cell is not None else "")
    return f"{how}{where}, before this exercise was checked"


def _row(student, chapter, ex, nb, ran, deleted, cell_timeout, timeout) -> Row:
    label, points = ex["label"], ex.get("points", 0)
    row = Row(student, chapter, label, ex.get("op") or "", points, 0, "", "", "", "")
    if not ex.get("op"):
        return _manual(row, nb, f"{label}-answer")
    verdict = ran["labels"].get(label)
    errors = _cell_errors(nb, ran, label)
    status = verdict["status"] if verdict else None
    if status is None and ran.get("died") and not ran["timed_out"]:
        row.status, row.detail = "kernel died", _death(nb, ran["died"])
    elif status is None and ran["timed_out"]:
        row.status, row.detail = "timed out", f"the notebook ran longer than {timeout} s"
    elif status is None:
        row.status, row.detail = "error", f"the exercise was not graded: {ran['dead']}"
    elif status == "missing function" and errors:
        e = errors[0]
        if e.get("ename") == TIMEOUT_ERROR:
            row.status, row.detail = "timed out", f"your cell ran longer than {cell_timeout} s"
        else:
            # a SyntaxError names the kernel's temporary file: keep the line only
            evalue = re.sub(r"\(\d+\.py, line (\d+)\)", r"(line \1)", e["evalue"])
            row.status, row.detail = "error", f"your cell raised {e['ename']}: {evalue}"
    else:
        row.status, row.detail = status, verdict.get("detail", "")
        row.feedback = {"message": verdict.get("message", ""),
                        "advice": verdict.get("advice", [])}
        if status == "missing function":
            defined = [n for i, cell in enumerate(nb.cells)
                       if _nbgrader_id(cell).startswith(f"{label}-solution")
                       for n in _DEF_RE.findall(cell.source)]
            if defined:
                row.detail += f"; the exercise's cell defines {', '.join(defined)}"
        key = verdict.get("misconception") or ""
        row.misconception = "+".join(verdict.get("misconceptions") or ([key] if key else []))
        row.misconception_name = row.detail if status == "misconception" else ""
        if status == "misconception":
            row.detail = ""
    if label in deleted:
        row.detail = ("check cell deleted: the grader restored it" +
                      (f"; {row.detail}" if row.detail else ""))
    score_row(row, ex, verdict)
    return row


def score_row(row: Row, ex: dict, verdict: dict | None = None) -> None:
    """Set ``row.score`` and ``row.credit`` from the rubric of ``ex`` (the exercise's
    manifest entry), the row's status and mistakes, and ``verdict``'s report kind (what the
    check recorded, which tells an ``incorrect`` row's wrong values from its wrong shape)."""
    if not row.op:
        return
    rubric = ex.get("rubric") or default_rubric(row.points)
    status = row.status
    if status == "incorrect":   # several report kinds: the kind says if the shape was checked
        status = (verdict or {}).get("kind") or status
    keys = row.misconception.split("+") if row.misconception else ()
    row.score, earned = credit(rubric, status, keys, row.op)
    row.credit = " ".join(f"{item}:{n}" for item, n in earned.items())
    row.feedback = {**row.feedback, "credit": [[item, rubric[item], n]
                                               for item, n in earned.items()]}


def grade(paths, cell_timeout: int = 60, timeout: int = 600, memory: int = 4096,
          progress: bool | None = None, jobs: int = 1, students: list[str] | None = None,
          hidden: bool = True, exercises_of: dict | None = None,
          skip: dict[str, set[str]] | bool | None = None) -> list[Row]:
    """Grade every submission (``jobs`` at a time); the rows in the order of ``paths``.
    ``hidden`` and ``exercises_of``: see :func:`grade_notebook`.
    ``students``: each submission's student (default: read from its path by
    :data:`.roster.DEFAULT_PATTERN`).  A progress bar on a terminal (tqdm if installed).
    ``skip``: which cells run as a comment (see the module's docstring): ``{chapter: ids}``
    (:func:`.skipping.chapter_skips` of the instructor's chapters) for the submissions of
    those chapters, the submission's marking for the others; ``None``: the submission's
    marking; ``False``: nothing skipped."""
    if students is None:
        from .roster import find_submissions
        found = find_submissions(paths)[1]
        paths, students = [s.path for s in found], [s.student for s in found]
    paths, names = [Path(p) for p in paths], list(students)
    if progress is None:
        progress = sys.stderr.isatty()
    items = list(zip(paths, names))
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(items), unit="notebook", desc="grading", file=sys.stderr)
        except ImportError:
            bar = None
    done = 0

    def one(item):
        nonlocal done
        rows = grade_one(item[0], item[1], cell_timeout, timeout, memory, hidden,
                         exercises_of, skip)
        done += 1
        if bar is not None:
            bar.update(1)
        elif progress:
            print(f"graded {done}/{len(items)}: {item[0]}", file=sys.stderr)
        return rows

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        results = list(pool.map(one, items))
    except BaseException:  # Ctrl-C or SIGTERM: stop the children first, then the threads
        stop_all()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown()
        if bar is not None:
            bar.close()
    return [row for rows in results for row in rows]


def write_csv(rows: list[Row], path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([getattr(row, name) for name in COLUMNS])


def _points(n: int) -> str:
    return f"{n} point" + ("" if n == 1 else "s")


def summary(rows: list[Row]) -> str:
    """Per exercise: how many passed, and how many students showed which mistake."""
    students = sorted({r.student for r in rows if r.status != "missing"})
    lines = [f"{len(students)} submission(s)"]
    bad = [r for r in rows if r.status == "unreadable"]
    for r in bad:
        lines.append(f"  {r.student}: unreadable ({r.detail})")
    order = []
    for r in rows:
        if r.exercise != "*" and (r.chapter, r.exercise) not in order:
            order.append((r.chapter, r.exercise))
    for chapter, label in order:
        these = [r for r in rows if r.exercise == label and r.chapter == chapter]
        n = len(these)
        head = these[0]
        if not head.op:
            answered = sum(r.detail.endswith("answered") for r in these)
            lines.append(f"{label} ({_points(head.points)}): graded by hand, {answered} of "
                         f"{n} answered")
            continue
        passed = sum(r.status == "passed" for r in these)
        lines.append(f"{label} ({head.op}, {_points(head.points)}): {passed} of {n} passed")
        counts: dict[str, int] = {}
        for r in these:
            if r.status == "passed":
                continue
            what = (f"{r.misconception_name} [{r.misconception}]" if r.status == "misconception"
                    else r.status)
            counts[what] = counts.get(what, 0) + 1
        for what, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {what}: {c} of {n}")
    return "\n".join(lines)
