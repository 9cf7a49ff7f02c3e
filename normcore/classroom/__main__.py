"""``python -m normcore.classroom student ...``, ``... grade ...``, ``... merge ...`` and
``... nbgrader-source ...``."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .marking import MarkingError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m normcore.classroom",
        description="Student notebooks from the book's chapters, and grading them.")
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("student", help="write the student version of each chapter")
    st.add_argument("chapters", nargs="+", metavar="CHAPTER.ipynb")
    st.add_argument("-o", "--out", required=True, metavar="DIR",
                    help="where to write the student notebooks (not the chapters' folder)")
    st.add_argument("--myst", action="store_true",
                    help="keep the chapters' MyST markdown (for JupyterLab with jupyterlab-myst "
                         "or a Jupyter Book build); by default it becomes plain markdown that "
                         "plain Jupyter renders")
    nb = sub.add_parser("nbgrader-source",
                        help="write each chapter as an nbgrader source notebook (solutions and "
                             "hidden tests; generate_assignment gives the student version)")
    nb.add_argument("chapters", nargs="+", metavar="CHAPTER.ipynb")
    nb.add_argument("-o", "--out", required=True, metavar="DIR",
                    help="the assignment's folder in the nbgrader course: "
                         "COURSE/source/ASSIGNMENT")
    nb.add_argument("--myst", action="store_true", help="keep the chapters' MyST markdown "
                                                        "(as student --myst)")
    gr = sub.add_parser("grade", help="grade submissions; one CSV row per student and exercise")
    gr.add_argument("submissions", nargs="+", metavar="SUBMISSION.ipynb",
                    help="the notebooks handed in, or one folder: every notebook under it")
    gr.add_argument("--out", required=True, metavar="grades.csv")
    gr.add_argument("--roster", metavar="students.csv",
                    help="the class list: a CSV with a column 'id' (and optionally 'name'); "
                         "every student gets a row for every exercise of --chapters, a "
                         "chapter not handed in scores 0 as 'missing'")
    gr.add_argument("--chapters", nargs="+", metavar="CHAPTER.ipynb",
                    help="the chapters handed out (the book's, or their student versions): "
                         "their exercises are the gradebook's columns (needed by --roster), "
                         "the submissions of these chapters are graded on them (points, "
                         "rules), not on the list in the submission's metadata, and the "
                         "book's give the answers files their model answers; their marking "
                         "says which cells grading skips (the training demos and figures; "
                         "without --chapters, each submission's own marking)")
    gr.add_argument("--no-skip", action="store_true",
                    help="run every cell of each submission, also those marked to skip")
    gr.add_argument("--student-pattern", metavar="REGEX",
                    help="a regular expression with a group (?P<student>...), searched in "
                         "each submission's path in the submissions folder (default: the "
                         "first folder, or the notebook's name: alice/02_batch_norm.ipynb "
                         "and alice.ipynb are alice's)")
    gr.add_argument("--gradebook", metavar="FILE",
                    help="with --roster: the CSV for an LMS, one line per student, one column "
                         "per exercise, and the total (default: grades-gradebook.csv beside "
                         "--out)")
    gr.add_argument("--feedback", metavar="DIR",
                    help="where to write one Markdown feedback file per student (default: "
                         "grades-feedback/ beside the CSV, named after it)")
    gr.add_argument("--answers", metavar="DIR",
                    help="where to write the answers graded by hand (derivations, written "
                         "parts): one Markdown file per exercise with every student's answer "
                         "(and the model answer, with --chapters), and manual.csv to fill in "
                         "(default: grades-answers/ beside the CSV)")
    gr.add_argument("--cell-timeout", type=int, default=60, metavar="S",
                    help="seconds per cell (default 60)")
    gr.add_argument("--timeout", type=int, default=600, metavar="S",
                    help="seconds per notebook (default 600)")
    gr.add_argument("--memory", type=int, default=4096, metavar="MB",
                    help="address-space limit of each submission's kernel (default 4096)")
    gr.add_argument("--visible-only", action="store_true",
                    help="check on the notebook's own test sets only, not the hidden ones "
                         "(default: the hidden sets: other seeds, a constant set, one sample, "
                         "twice the samples)")
    gr.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                    help="grade N submissions at a time (default 1)")
    gr.add_argument("--no-progress", action="store_true", help="no progress bar")
    mg = sub.add_parser("merge", help="fold the scores of the answers graded by hand "
                                      "(manual.csv, filled in) into the grade sheet")
    mg.add_argument("grades", metavar="grades.csv", help="the grade sheet `grade` wrote")
    mg.add_argument("manual", metavar="manual.csv",
                    help="the file `grade` wrote beside the answers, its 'score' filled in")
    mg.add_argument("--out", metavar="FILE", help="where to write the merged grade sheet "
                                                  "(default: grades.csv itself)")
    mg.add_argument("--roster", metavar="students.csv",
                    help="with --chapters: rewrite the gradebook, the answers counted")
    mg.add_argument("--chapters", nargs="+", metavar="CHAPTER.ipynb")
    mg.add_argument("--gradebook", metavar="FILE",
                    help="default: grades-gradebook.csv beside --out")
    ns = sub.add_parser("nosolutions", help="copy the book without its solutions (for a site "
                                            "to hand a class; make book-nosolutions builds it)")
    ns.add_argument("book", metavar="BOOK_DIR", help="the book's root (with _config.yml)")
    ns.add_argument("-o", "--out", required=True, metavar="DIR")
    args = parser.parse_args(argv)

    if args.command == "nosolutions":
        from .nosolutions import copy_without_solutions
        try:
            print(f"book without solutions: {copy_without_solutions(args.book, args.out)}")
        except (ValueError, OSError) as e:
            print(f"{args.book}: {e}", file=sys.stderr)
            return 1
        return 0

    if args.command in ("student", "nbgrader-source"):
        from .nbgrader_source import write_source
        from .plainmd import book_index
        from .student import write_student
        write = write_student if args.command == "student" else write_source
        indexes = {}
        for chapter in args.chapters:
            try:
                folder = Path(chapter).parent
                if not args.myst and folder not in indexes:
                    indexes[folder] = book_index(folder)
                target = write(chapter, args.out, myst=args.myst, index=indexes.get(folder))
            except (MarkingError, ValueError, OSError) as e:
                print(f"{chapter}: {e}", file=sys.stderr)
                return 1
            print(f"{chapter} -> {target}")
        if write is write_source and Path(args.out).resolve().parent.name != "source":
            print(f"note: nbgrader reads an assignment from COURSE/source/ASSIGNMENT/; "
                  f"{args.out} is not in a folder named source", file=sys.stderr)
        return 0

    if args.command == "merge":
        return _merge(args, mg)
    return _grade(args, gr)


def _merge(args, parser) -> int:
    from . import gradebook as gb
    from .grade import write_csv
    from .manual import merge, read_grades
    from .roster import read_roster

    if bool(args.roster) != bool(args.chapters) or (args.gradebook and not args.roster):
        parser.error("--roster and --chapters go together (and --gradebook with them): the "
                     "class list and the chapters graded, to rewrite the gradebook")
    try:
        rows, scored, left = merge(read_grades(args.grades), args.manual)
        roster = read_roster(args.roster) if args.roster else None
        chapters = gb.chapter_exercises(args.chapters) if args.chapters else None
    except (MarkingError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or args.grades)
    write_csv(rows, out)
    print(f"merged {scored} score(s) graded by hand into {out}; {left} answer(s) still to "
          f"score")
    if roster is not None:
        book = gb.write_gradebook(rows, roster, chapters,
                                  args.gradebook or gb.default_gradebook(out))
        print(f"gradebook: {book}")
    return 0


def _grade(args, parser) -> int:
    from . import gradebook as gb
    from . import manual
    from .feedback import default_folder, write_feedback
    from .grade import grade, summary, write_csv
    from .roster import DEFAULT_PATTERN, find_submissions, read_roster
    from .skipping import chapter_skips

    if args.roster and not args.chapters:
        parser.error("--roster needs --chapters: the chapters handed out, whose exercises "
                     "every student is graded on (e.g. --chapters chapters/02_batch_norm.ipynb)")
    if args.gradebook and not args.roster:
        parser.error("--gradebook goes with --roster students.csv (the class list)")
    try:   # every input is checked before a notebook runs
        roster = read_roster(args.roster) if args.roster else None
        chapters = gb.chapter_exercises(args.chapters) if args.chapters else None
        skip = False if args.no_skip else chapter_skips(args.chapters) if args.chapters \
            else None
        folder, found = find_submissions(args.submissions, args.student_pattern)
    except (MarkingError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def interrupted(signum, frame):
        raise KeyboardInterrupt  # so that grade() stops its children and their kernels
    signal.signal(signal.SIGTERM, interrupted)
    try:
        rows = grade([s.path for s in found], args.cell_timeout, args.timeout, args.memory,
                     progress=False if args.no_progress else None, jobs=args.jobs,
                     students=[s.student for s in found], hidden=not args.visible_only,
                     exercises_of=chapters, skip=skip)
    except KeyboardInterrupt:
        print("grading interrupted (its processes are stopped); no grades written",
              file=sys.stderr)
        return 130
    if roster is not None:
        rows, warnings = gb.complete(rows, roster, chapters, found, folder,
                                     args.student_pattern or DEFAULT_PATTERN)
        for line in warnings:
            print(line, file=sys.stderr)
    write_csv(rows, args.out)
    folder = Path(args.feedback) if args.feedback else default_folder(args.out)
    try:
        written = write_feedback(rows, folder)
    except (ValueError, OSError) as e:
        print(f"grades: {Path(args.out)}; no feedback written: {e}", file=sys.stderr)
        return 1
    answers = Path(args.answers) if args.answers else manual.default_folder(args.out)
    names = {s.id: s.name for s in roster} if roster else None
    try:
        exported = manual.write_answers(rows, answers, args.chapters, names)
    except (ValueError, OSError) as e:
        print(f"grades: {Path(args.out)}; no answers written: {e}", file=sys.stderr)
        return 1
    print(summary(rows))
    print(f"grades: {Path(args.out)} ({len(rows)} rows)")
    print(f"feedback: {folder}/ ({len(written)} files, one per student)")
    if exported:
        print(f"answers graded by hand: {answers}/ ({len(exported) - 1} files, one per "
              f"exercise; fill in the scores of manual.csv, then run `python -m "
              f"normcore.classroom merge {args.out} {answers / 'manual.csv'}`)")
    if roster is not None:
        book = gb.write_gradebook(rows, roster, chapters,
                                  args.gradebook or gb.default_gradebook(args.out))
        print(gb.totals(rows, roster, chapters))
        print(f"gradebook: {book} ({len(roster)} students, one column per exercise)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
