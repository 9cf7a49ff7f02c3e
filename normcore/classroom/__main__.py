"""``python -m normcore.classroom student ...`` and ``... grade ...``."""
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
    gr = sub.add_parser("grade", help="grade submissions; one CSV row per student and exercise")
    gr.add_argument("submissions", nargs="+", metavar="SUBMISSION.ipynb")
    gr.add_argument("--out", required=True, metavar="grades.csv")
    gr.add_argument("--feedback", metavar="DIR",
                    help="where to write one Markdown feedback file per student (default: "
                         "grades-feedback/ beside the CSV, named after it)")
    gr.add_argument("--cell-timeout", type=int, default=60, metavar="S",
                    help="seconds per cell (default 60)")
    gr.add_argument("--timeout", type=int, default=600, metavar="S",
                    help="seconds per notebook (default 600)")
    gr.add_argument("--memory", type=int, default=4096, metavar="MB",
                    help="address-space limit of each submission's kernel (default 4096)")
    gr.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                    help="grade N submissions at a time (default 1)")
    gr.add_argument("--no-progress", action="store_true", help="no progress bar")
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

    if args.command == "student":
        from .student import write_student
        for chapter in args.chapters:
            try:
                target = write_student(chapter, args.out)
            except (MarkingError, ValueError, OSError) as e:
                print(f"{chapter}: {e}", file=sys.stderr)
                return 1
            print(f"{chapter} -> {target}")
        return 0

    from .feedback import default_folder, write_feedback
    from .grade import grade, summary, write_csv

    def interrupted(signum, frame):
        raise KeyboardInterrupt  # so that grade() stops its children and their kernels
    signal.signal(signal.SIGTERM, interrupted)
    try:
        rows = grade(args.submissions, args.cell_timeout, args.timeout, args.memory,
                     progress=False if args.no_progress else None, jobs=args.jobs)
    except KeyboardInterrupt:
        print("grading interrupted (its processes are stopped); no grades written",
              file=sys.stderr)
        return 130
    write_csv(rows, args.out)
    folder = Path(args.feedback) if args.feedback else default_folder(args.out)
    try:
        written = write_feedback(rows, folder)
    except (ValueError, OSError) as e:
        print(f"grades: {Path(args.out)}; no feedback written: {e}", file=sys.stderr)
        return 1
    print(summary(rows))
    print(f"grades: {Path(args.out)} ({len(rows)} rows)")
    print(f"feedback: {folder}/ ({len(written)} files, one per student)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
