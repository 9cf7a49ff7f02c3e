"""Runs inside the student's kernel: the grader's version of each check cell.

The grader replaces every check cell of a submission (and restores a deleted one) by a
call of :func:`capture`, which looks the student's function up by name *where the check
cell stands* and copies it out of the kernel with cloudpickle (the function by value,
with the helpers and constants of the notebook it refers to; modules such as ``torch`` by
name, so that they are imported afresh where it is checked).  Nothing is checked here: the
grader checks the copy in processes of its own (:mod:`.callee` runs it, the grader judges
what it returned), so that whatever a notebook did to ``normcore.exercises.check``, to
the check cells, to ``normcore`` or to ``torch`` does not change its grade.

Each capture appends one JSON line to the results file named by the environment variable
``NORMCORE_GRADE_RESULTS`` and writes ``capture-<label>.pkl`` beside it.  It never raises,
so one exercise's failure does not stop the others.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

RESULTS_ENV = "NORMCORE_GRADE_RESULTS"


def _write(entry: dict) -> None:
    with open(os.environ[RESULTS_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()


def capture_path(results: str | Path, label: str) -> Path:
    """Where the copy of exercise ``label``'s function goes, beside the results file."""
    return Path(results).parent / f"capture-{label}.pkl"


def capture(label: str, function: str, namespace: dict) -> None:
    """Copy ``namespace[function]`` out of the kernel for exercise ``label``."""
    fn = namespace.get(function)
    if fn is None or not callable(fn):
        _write({"label": label, "status": "missing function",
                "detail": f"no function named {function} (renamed or not defined)"})
        print(f"{label}: no function named {function}")
        return
    try:
        import cloudpickle
        data = cloudpickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - reported in the grade sheet, not raised
        _write({"label": label, "status": "error",
                "detail": f"the grader could not copy {function} out of the notebook "
                          f"({type(e).__name__}: {str(e)[:200]}); does it refer to a "
                          "global that cannot be copied, such as an open file?"})
        return
    capture_path(os.environ[RESULTS_ENV], label).write_bytes(data)
    _write({"label": label, "status": "captured"})
    print(f"{label}: {function} handed to the grader")
