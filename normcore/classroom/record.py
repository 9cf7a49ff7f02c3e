"""A checker's :class:`~normcore.exercises.Report` as a grade sheet's verdict.

The grader (:mod:`.grade`) judges each captured function (:mod:`.capture`, :mod:`.callee`)
and turns the report into the entry a row is made of: the status, a one-line detail, the
misconception keys, and the text of the student's feedback file.
"""
from __future__ import annotations

#: :attr:`normcore.exercises.Report.kind` -> the status a grade sheet shows.
STATUS = {"pass": "passed", "misconception": "misconception", "not_implemented":
          "not implemented", "exception": "error", "unknown": "incorrect", "type": "incorrect",
          "shape": "incorrect", "dtype": "incorrect", "nan": "incorrect",
          "forbidden": "forbidden"}


def feedback_of(report) -> dict:
    """What a student's feedback file shows of ``report`` (a grade row's ``feedback``): the
    checker's message, and for a known mistake its prose filled in for the op."""
    from normcore.exercises import CATALOGUE
    return {"message": report.message, "advice": [
        {"key": key, "title": CATALOGUE[key].title, "did": did, "why": why, "fix": fix}
        for key, did, why, fix in report.advice]}


def verdict(label: str, report) -> dict:
    """The grade sheet's entry for exercise ``label`` from the checker's ``report``."""
    from normcore import exercises
    flat = " ".join(report.message.split())
    if report.kind == "pass":
        detail = ""
    elif report.kind == "misconception":
        detail = " + ".join(exercises.CATALOGUE[k].title for k in report.misconceptions)
    elif report.kind == "exception":
        detail = flat.split(" when called as")[0]
    elif report.kind == "forbidden":
        detail = "uses what the exercise forbids: " + ", ".join(report.broken_rules)
    else:
        detail = flat.split(". ")[0].rstrip(".") + "."
    if len(detail) > 300:
        detail = detail[:297] + "..."
    return {"label": label, "status": STATUS.get(report.kind, "incorrect"), "kind": report.kind,
            "misconception": report.misconception, "misconceptions": list(report.misconceptions),
            "rules": list(report.broken_rules), "detail": detail, **feedback_of(report)}
