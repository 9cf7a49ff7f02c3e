"""The classroom: student notebooks from the chapters, and a grader that names mistakes.

The commands::

    python -m normcore.classroom student chapters/02_batch_norm.ipynb -o student/
    python -m normcore.classroom grade submissions/*.ipynb --out grades.csv
    python -m normcore.classroom nbgrader-source chapters/02_batch_norm.ipynb -o course/source/bn
    python -m normcore.classroom grade submissions/ --out grades.csv \
        --roster students.csv --chapters chapters/02_batch_norm.ipynb

* :mod:`.marking` reads the exercise marking of a chapter (which cells are the statement,
  the solution, the check; labels and points);
* :mod:`.student` writes the student version: solutions replaced by nbgrader's stubs,
  outputs cleared, nbgrader metadata on the cells, the exercises in the notebook metadata;
  :mod:`.plainmd` rewrites its MyST markdown as plain CommonMark and math, so that it reads
  in plain Jupyter (``--myst`` keeps MyST);
* :mod:`.nbgrader_source` writes a chapter as an nbgrader source notebook (solutions,
  hidden checks), from which nbgrader's ``generate_assignment`` gives the student version;
* :mod:`.grade` grades submissions, each in a child process (:mod:`.runner`) with a fresh
  kernel and limits on time and memory, and trusts nothing the notebook did: its check
  cells become :mod:`.capture`, which copies each exercise's function out of the kernel;
  :mod:`.callee` runs the copies in a fresh process on the hidden test sets, watching what
  they call; :mod:`.judging` judges what they returned against its own references, with
  the exercise's rules; :mod:`.record` turns a report into the grade sheet's verdict;
* :mod:`.skipping` says which cells grading need not run (the chapters' training demos and
  figures, marked ``"normcore": {"grading": "skip"}``) and checks the rule that keeps the
  exercises' names defined (``tools/mark_grading_skips.py`` marks the chapters);
* :mod:`.feedback` writes one Markdown file per student: per exercise the score, the
  diagnosis and what to change;
* :mod:`.roster` reads the class list and each submission's student from its path;
  :mod:`.gradebook` gives every student of the roster a row for every exercise (missing
  work scores 0) and writes the gradebook CSV an LMS imports;
* :mod:`.manual` exports the answers graded by hand (derivations, the written parts of
  coding exercises) for the instructor, and merges the scores given back
  (``python -m normcore.classroom merge grades.csv manual.csv``);
* :mod:`.overview` lists the exercises of the chapters (the classroom page's table);
* :mod:`.__main__` is the command line.

Student code runs as the user who grades, with the limits a single machine can enforce
(a process per submission, time and memory limits); it is not a sandbox.
"""
import importlib

from .._extras import require
from .marking import Exercise, MarkingError, read_exercises

require(__name__)   # without normcore[book]: an ImportError that names it

#: Imported when first used: the grader's check cell imports ``.record`` in every
#: submission's kernel, and ``.student`` and ``.overview`` import nbformat (1.3 s).
_LAZY = {"exercise_table": ".overview", "exercises_of": ".overview",
         "student_notebook": ".student", "write_student": ".student"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Exercise", "MarkingError", "exercise_table", "exercises_of", "read_exercises",
           "student_notebook", "write_student"]
