"""Time grading a class: 47 planted submissions of chapters 2-7, graded with ``-j 2``.

    .venv/bin/python benchmarks/grading.py [--dir DIR] [--jobs 2] [--chapters-flag]
    .venv/bin/python benchmarks/grading.py --build-only --dir DIR
    .venv/bin/python benchmarks/grading.py --startup [--reps 3]

It writes eight students' submissions of the student notebooks of chapters 2-7 (one of
them not handed in: 47 notebooks), then runs, as a child process,

    python -m normcore.classroom grade DIR --out DIR/g.csv -j 2 --no-progress

(``--chapters-flag`` adds ``--chapters chapters/02...07``: the grader then takes what to skip
from the book's chapters, not from the submissions) and prints the wall time of the whole
command, the time of each notebook (from its start to its rows, in the command's own
process: the grader's ``grade_one`` is wrapped to note it), the load average before and
after, and the budget: 47 notebooks in <= 5 minutes on 2 cores, pass or fail.  It also checks
the grade sheet: every student's status per exercise as the variant predicts (a correct
submission passes everything, a stub is not implemented, ...).

The students: ``alice``, ``bob``, ``carol`` hand in the chapter's solutions (the solution
cells of the book put back by cell id), ``dave`` and ``erin`` the untouched student notebook
(stubs), ``frank`` every other exercise solved, ``grace`` a wrong body (``return None``) in
every exercise, ``heidi`` a syntax error in the first exercise and the rest solved, and no
chapter 7.

``--startup`` measures instead what every notebook pays before its exercises: a child process
and a fresh kernel running one empty cell, then running the chapter's first code cell (its
imports), each ``--reps`` times, one at a time (the median).

This is a benchmark, not a test: it prints; its exit code is 1 when the budget or
the sheet check fails.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = [ROOT / "chapters" / n for n in (
    "02_batch_norm.ipynb", "03_running_stats.ipynb", "04_layer_norm.ipynb",
    "05_instance_norm.ipynb", "06_group_norm.ipynb", "07_weight_standardization.ipynb")]
STUDENTS = {"alice": "correct", "bob": "correct", "carol": "correct", "dave": "stub",
            "erin": "stub", "frank": "half", "grace": "mistake", "heidi": "syntax"}
MISSING = {("heidi", "07_weight_standardization")}
BUDGET_S, BUDGET_N = 300, 47


def _regions_replaced(source: str, line: str) -> str:
    from normcore.classroom.marking import solution_regions
    lines = source.split("\n")
    out, last = [], 0
    for begin, end in solution_regions(source):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        out += lines[last:begin] + [indent + line]
        last = end + 1
    return "\n".join(out + lines[last:])


def submission(student_nb, chapter_nb, variant: str):
    """The student notebook handed in by a student of ``variant``."""
    import copy
    nb = copy.deepcopy(student_nb)
    solutions = {c.id: c.source for c in chapter_nb.cells
                 if c.get("metadata", {}).get("normcore", {}).get("role") == "solution"}
    k = 0
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if "-solution" not in grade_id or cell.id not in solutions or cell.cell_type != "code":
            continue
        solved = solutions[cell.id]
        if variant == "correct" or (variant == "half" and k % 2 == 0):
            cell.source = solved
        elif variant == "mistake":
            cell.source = _regions_replaced(solved, "return None")
        elif variant == "syntax":
            cell.source = solved if k else "def broken(:\n    pass"
        k += 1
    return nb


def expected(variant: str, k: int, status: str) -> bool:
    """Whether the ``k``-th coding exercise of a ``variant`` submission may have ``status``."""
    if variant == "correct" or (variant == "half" and k % 2 == 0) or (
            variant == "syntax" and k):
        return status == "passed"
    if variant in ("stub", "half"):
        return status == "not implemented"
    return status not in ("passed", "timed out", "kernel died")


def build(folder: Path) -> list[Path]:
    """Write the planted submissions, ``folder/<student>/<chapter>.ipynb``."""
    from normcore.classroom.plainmd import book_index
    from normcore.classroom.student import dumps, student_notebook
    index = book_index(ROOT / "chapters")
    paths = []
    for path in CHAPTERS:
        chapter = nbformat.read(path, as_version=4)
        student = student_notebook(chapter, path.stem, index)
        for name, variant in STUDENTS.items():
            if (name, path.stem) in MISSING:
                continue
            target = folder / name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(dumps(submission(student, chapter, variant)), encoding="utf-8")
            paths.append(target)
    return paths


#: Run in the child: the grade command, with each notebook's time noted in a file.
_CHILD = """
import json, sys, time
import normcore.classroom.grade as g
from normcore.classroom.__main__ import main
log, argv = sys.argv[1], sys.argv[2:]
one = g.grade_one
def timed(path, student, *a, **k):
    t = time.perf_counter()
    rows = one(path, student, *a, **k)
    with open(log, "a") as f:
        f.write(json.dumps({"path": str(path), "s": time.perf_counter() - t}) + "\\n")
    return rows
g.grade_one = timed
sys.exit(main(argv))
"""


def check_sheet(sheet: Path) -> list[str]:
    """What in the grade sheet disagrees with the variants."""
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    problems, seen = [], {}
    for row in rows:
        if not row["op"]:
            continue
        key = (row["student"], row["chapter"])
        k = seen[key] = seen.get(key, -1) + 1
        if not expected(STUDENTS[row["student"]], k, row["status"]):
            problems.append(f"{row['student']} {row['chapter']} {row['exercise']}: "
                            f"{row['status']} ({row['detail'][:120]})")
    handed = {(s, p.stem) for s in STUDENTS for p in CHAPTERS} - MISSING
    missing = handed - set(seen)
    problems += [f"{s} {c}: no rows" for s, c in sorted(missing)]
    return problems


def startup(reps: int) -> None:
    """Print the median seconds of a child process and kernel with an empty cell, and with
    each chapter's first code cell (its imports)."""
    import statistics
    from normcore.classroom.grade import run_submission

    def timed(source: str) -> float:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        times = []
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                ran = run_submission(nb, Path(tmp), 120, 600, 4096)
                times.append(time.perf_counter() - t)
            assert all(c["status"] == "ok" for c in ran["cells"].values()), ran
        return statistics.median(times)

    print(f"process + kernel, one empty cell: {timed('pass'):.1f} s")
    for path in CHAPTERS:
        first = next(c for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "code")
        print(f"process + kernel + first cell of {path.stem}: {timed(first.source):.1f} s")
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/grading.py")
    parser.add_argument("--dir", help="where to write the submissions (default: a temporary "
                                      "folder)")
    parser.add_argument("--jobs", "-j", type=int, default=2)
    parser.add_argument("--chapters-flag", action="store_true",
                        help="grade with --chapters (skip what the book's chapters mark)")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--startup", action="store_true",
                        help="time a kernel's start and each chapter's imports instead")
    parser.add_argument("--reps", type=int, default=3)
    a = parser.parse_args(argv)
    if a.startup:
        startup(a.reps)
        return 0
    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="normcore-bench-")
        a.dir = tmp.name
    folder = Path(a.dir)
    subs = folder / "submissions"
    paths = build(subs)
    print(f"{len(paths)} submissions in {subs}")
    if a.build_only:
        return 0
    out, log = folder / "g.csv", folder / "times.jsonl"
    log.write_text("")
    argv = ["grade", str(subs), "--out", str(out), "-j", str(a.jobs), "--no-progress",
            "--feedback", str(folder / "feedback")]
    if a.chapters_flag:
        argv += ["--chapters", *map(str, CHAPTERS)]
    load0 = os.getloadavg()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(log), *argv], cwd=folder,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    load1 = os.getloadavg()
    if done.returncode:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        print(f"the grade command failed (exit {done.returncode})")
        return 1
    times = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    by_chapter: dict[str, list[float]] = {}
    for t in times:
        by_chapter.setdefault(Path(t["path"]).stem, []).append(t["s"])
    print(f"{'chapter':<28} {'n':>3} {'mean s':>7} {'min s':>6} {'max s':>6}")
    for name, ts in sorted(by_chapter.items()):
        print(f"{name:<28} {len(ts):>3} {sum(ts) / len(ts):>7.1f} {min(ts):>6.1f} "
              f"{max(ts):>6.1f}")
    per = [t["s"] for t in times]
    print(f"per notebook: mean {sum(per) / len(per):.1f} s (each on its own, {a.jobs} at a "
          f"time); wall per notebook {wall / len(per):.1f} s")
    print(f"total: {len(per)} notebooks in {wall:.0f} s ({wall / 60:.1f} min) with -j {a.jobs}")
    print(f"load average (1, 5, 15 min): before {', '.join(f'{x:.2f}' for x in load0)}; "
          f"after {', '.join(f'{x:.2f}' for x in load1)}; cores {os.cpu_count()}")
    scaled = wall * BUDGET_N / max(1, len(per))
    ok = scaled <= BUDGET_S
    print(f"budget: {BUDGET_N} notebooks in <= {BUDGET_S // 60} min on 2 cores: "
          f"{'PASS' if ok else 'FAIL'} ({scaled:.0f} s)")
    problems = check_sheet(out)
    print(f"grade sheet: {'as the variants predict' if not problems else 'DISAGREES'}")
    for p in problems[:20]:
        print("  " + p)
    return 0 if ok and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
