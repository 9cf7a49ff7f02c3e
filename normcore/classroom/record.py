"""Runs inside the student's kernel: the grader's version of each check cell.

The grader replaces every check cell of a submission (and restores a deleted one) by a
call of :func:`record`, which looks the student's function up by name, runs
:func:`normcore.exercises.check` on it and appends one JSON line per exercise to the file
named by the environment variable ``NORMCORE_GRADE_RESULTS``.  It never raises, so one
exercise's failure does not stop the others.
"""
from __future__ import annotations

import json
import os

RESULTS_ENV = "NORMCORE_GRADE_RESULTS"

#: :attr:`normcore.exercises.Report.kind` -> the status a grade sheet shows.
STATUS = {"pass": "passed", "misconception": "misconception", "not_implemented":
          "not implemented", "exception": "error", "unknown": "incorrect", "type": "incorrect",
          "shape": "incorrect", "dtype": "incorrect", "nan": "incorrect"}


def _write(entry: dict) -> None:
    with open(os.environ[RESULTS_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()


def feedback_of(report) -> dict:
    """What a student's feedback file shows of ``report`` (a grade row's ``feedback``): the
    checker's message, and for a known mistake its prose filled in for the op."""
    from normcore.exercises import CATALOGUE
    return {"message": report.message, "advice": [
        {"key": key, "title": CATALOGUE[key].title, "did": did, "why": why, "fix": fix}
        for key, did, why, fix in report.advice]}


def record(label: str, op: str, function: str, namespace: dict, **options) -> None:
    """Check ``namespace[function]`` for ``op``; append the verdict for ``label``."""
    fn = namespace.get(function)
    if fn is None or not callable(fn):
        _write({"label": label, "status": "missing function",
                "detail": f"no function named {function} (renamed or not defined)"})
        print(f"{label}: no function named {function}")
        return
    _write({"label": label, "status": "started"})
    try:
        from normcore import exercises
        report = exercises.check(op, fn, **options)
    except Exception as e:  # noqa: BLE001 - a grader error must not stop the notebook
        _write({"label": label, "status": "error", "detail": f"checker: {type(e).__name__}: {e}"})
        return
    flat = " ".join(report.message.split())
    if report.kind == "pass":
        detail = ""
    elif report.kind == "misconception":
        detail = " + ".join(exercises.CATALOGUE[k].title for k in report.misconceptions)
    elif report.kind == "exception":
        detail = flat.split(" when called as")[0]
    else:
        detail = flat.split(". ")[0].rstrip(".") + "."
    if len(detail) > 300:
        detail = detail[:297] + "..."
    _write({"label": label, "status": STATUS.get(report.kind, "incorrect"), "kind": report.kind,
            "misconception": report.misconception, "misconceptions": list(report.misconceptions),
            "detail": detail, **feedback_of(report)})
    print(report)
