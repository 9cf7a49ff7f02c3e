"""Feedback a student can read: one Markdown file per student, written beside the grades.

The grade sheet is for the instructor: a mistake's key (``unbiased_var``) and its name.  The
student needs what the checker said in the notebook: what they did, why it is wrong, and
what to change.  :func:`write_feedback` writes, for every student of a grading run, one file
``<student>.md`` with, per exercise, the score, the status, the diagnosis (the mistake's
name and key, or what else went wrong) and what to change: the catalogue's prose for a
known mistake (:attr:`normcore.exercises.Report.advice`), the checker's own message for a
function that is wrong in another way, and a sentence per status the checker never saw
(a cell that raised or ran too long, a dead kernel, a renamed function).  An exercise whose
rubric splits its points (:mod:`normcore.exercises.credit`) lists each part: what a correct
answer does, and whether the student earned it.

``python -m normcore.classroom grade ... --out grades.csv`` writes them into
``grades-feedback/`` beside the CSV (``--feedback DIR`` to choose another folder).
"""
from __future__ import annotations

import re
from pathlib import Path

from normcore.exercises.credit import CORRECT, PROPERTIES, item_words, items
from normcore.exercises.report import wrap

#: What to change, for the statuses whose row has no text of the checker's.
ADVICE = {
    "passed": "Nothing: your function matches the reference on every test set.",
    "timed out": "Make your code finish within the limit: look for a loop that never ends or "
                 "a computation far larger than the exercise needs.",
    "kernel died": "Your code ended the Python process: a call such as `os.kill`, "
                   "`os._exit` or `sys.exit`, or more memory than the machine allows (the "
                   "system then kills the process). Run your notebook from the top and watch "
                   "the cell named above.",
    "missing function": "Keep the function's name as the exercise gives it: the check calls "
                        "it by that name.",
    "error": "Run the cell yourself and fix the error it shows; then run the check cell.",
    "manual": "Your instructor grades this answer by hand.",
    "unreadable": "Hand in the student notebook you were given, saved from Jupyter.",
    "missing": "Hand in this chapter's notebook where the line above says the grader looked "
               "for it (ask your instructor if you did hand it in).",
}


def file_name(student: str) -> str:
    """``student`` as a file name: ``alice`` -> ``alice.md``; ``a/b c`` -> ``a_b_c.md``."""
    return (re.sub(r"[^\w.-]+", "_", student).strip("._") or "student") + ".md"


def _points(n: int) -> str:
    return f"{n} point" + ("" if n == 1 else "s")


def _text_block(text: str) -> list[str]:
    fence = "````" if "```" in text else "```"
    return [f"{fence}text", text.rstrip(), fence]


def _para(text: str) -> list[str]:
    """A Markdown paragraph filled to the report's width (code spans kept whole)."""
    return [wrap(text, hang=""), ""]


def credit_lines(row) -> list[str]:
    """The rubric's parts, earned or lost, as a Markdown list (none for all or nothing)."""
    parts = (row.feedback or {}).get("credit") or []
    if not parts or [p[0] for p in parts] == [CORRECT]:
        return []
    words = PROPERTIES.get(row.op, {})
    lines = ["**Points by property:**", ""]
    for item, points, earned in parts:
        props = items({item: points})[item]
        names = item_words(item)
        what = "; ".join(words[p] for p in props if p in words)
        mark = "earned" if earned == points else "lost"
        text = f"{names}, {earned} of {_points(points)} ({mark})" + (f": {what}." if what else ".")
        lines.append(wrap(f"- {text}", hang="  "))
    return lines + [""]


def exercise_feedback(row) -> list[str]:
    """The Markdown lines of one exercise (a :class:`~normcore.classroom.grade.Row`)."""
    head = f"## {row.exercise}" if row.exercise != "*" else "## The notebook"
    if row.status == "manual":
        head += f": graded by hand ({_points(row.points)})"
    elif row.exercise != "*":
        head += f": {row.score} of {_points(row.points)}"
    lines = [head, ""] + _para(f"**Status:** {f'`{row.op}`, ' if row.op else ''}{row.status}")
    lines += credit_lines(row)
    fb = row.feedback or {}
    advice = fb.get("advice") or []
    if row.status == "misconception" and advice:
        lines += _para("**Diagnosis:** " + " + ".join(f"{a['title']} (`{a['key']}`)"
                                                    for a in advice))
        for i, a in enumerate(advice):
            if len(advice) > 1:
                lines += _para(f"**{i + 1}. {a['title']}**")
            lines += (_para(f"**What you did:** {a['did']}")
                      + _para(f"**Why it is wrong:** {a['why']}")
                      + _para(f"**What to change:** {a['fix']}"))
        return lines
    if row.detail:
        lines += _para(f"**Diagnosis:** {row.detail}")
    message = fb.get("message", "")
    if message and row.status not in ("passed", "missing function"):
        lines += ["**What the checker says:**", "", *_text_block(message), ""]
    else:
        lines += _para(f"**What to change:** {ADVICE.get(row.status, ADVICE['error'])}")
    return lines


def student_feedback(student: str, rows) -> str:
    """The feedback file of ``student``: every row of theirs, chapter by chapter."""
    mine = [r for r in rows if r.student == student]
    lines = [f"# Feedback for {student}", ""]
    checked = [r for r in mine if r.op]
    if checked:
        score, points = sum(r.score for r in checked), sum(r.points for r in checked)
        lines.append(f"Checked exercises: {score} of {_points(points)}.")
    manual = [r for r in mine if r.status == "manual"]
    if manual:
        lines.append(f"Graded by hand: {len(manual)} exercise(s), "
                     f"{_points(sum(r.points for r in manual))}.")
    lines.append("")
    chapters = list(dict.fromkeys(r.chapter for r in mine))
    for chapter in chapters:
        if len(chapters) > 1 and chapter:
            lines += [f"# {chapter}", ""]
        for row in (r for r in mine if r.chapter == chapter):
            lines += exercise_feedback(row)
    return "\n".join(lines).rstrip() + "\n"


def default_folder(csv_path) -> Path:
    """Where the feedback goes by default: ``grades.csv`` -> ``grades-feedback/`` beside it."""
    csv_path = Path(csv_path)
    return csv_path.with_name(f"{csv_path.stem}-feedback")


def write_feedback(rows, folder) -> list[Path]:
    """Write one ``<student>.md`` per student of ``rows`` into ``folder``; the paths."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the feedback folder {folder} is a file: give a folder (new or "
                         f"existing) with --feedback DIR")
    folder.mkdir(parents=True, exist_ok=True)
    written, taken = [], set()
    for student in dict.fromkeys(r.student for r in rows):
        name = file_name(student)
        stem, k = name[:-3], 2
        while name in taken:                 # two names that read the same as files
            name, k = f"{stem}-{k}.md", k + 1
        taken.add(name)
        path = folder / name
        path.write_text(student_feedback(student, rows), encoding="utf-8")
        written.append(path)
    return written
