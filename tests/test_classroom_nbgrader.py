"""nbgrader itself on the book's notebooks: ``python -m normcore.classroom nbgrader-source``.

These tests install nbgrader (the versions pinned in ``tests/nbgrader-requirements.txt``)
into a venv of their own, ``_build/nbgrader-venv``, and run nbgrader's commands:

1. ``nbgrader generate_assignment`` on the source of every chapter gives the notebook that
   ``python -m normcore.classroom student`` writes (the same cells, sources, ids and
   notebook metadata; only nbgrader's own cell metadata is added);
2. ``nbgrader autograde`` on planted submissions of chapter 2 (reduced to its first code
   cell and its exercises, so that eight runs of it stay short) scores the coding exercises
   as ``python -m normcore.classroom grade`` does (but for partial credit, which nbgrader's
   all-or-nothing test cells do not give), runs the hidden checks it put back, and
   leaves the derivations to manual grading; and a submission that replaces
   ``exercises.check`` in a cell of its own gets full points from nbgrader (its tests run
   in the student's kernel) and none from ``normcore.classroom grade``.

The venv sees the project's packages through a ``.pth`` file (``site.addsitedir`` of the
project's site-packages: torch and Jupyter are not installed twice) and holds nothing but
the pinned packages, installed with ``--no-deps`` (pip neither upgrades nor reinstalls a
project package); it is rebuilt only when the pins or the project's venv change.  The
first build needs PyPI (or a pip cache holding the pins): without it these tests fail,
they do not skip.  Regenerate the pins after a change with :func:`freeze_difference`.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import nbformat
import pytest

from normcore.classroom.marking import BEGIN, END
from normcore.classroom.nbgrader_source import HIDDEN_BEGIN, write_source
from normcore.classroom.plainmd import book_index
from normcore.classroom.student import write_student

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tests" / "nbgrader-requirements.txt"
VENV = ROOT / "_build" / "nbgrader-venv"
BIN = VENV / "bin"
PROJECT_SITE = sysconfig.get_paths()["purelib"]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
COURSE_CONFIG = 'c = get_config()\nc.CourseDirectory.course_id = "normcore"\n'

pytestmark = pytest.mark.nbgrader


# --- the venv ------------------------------------------------------------------------------

def _pip(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """The project's pip, acting on the nbgrader venv (which has no pip of its own)."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(BIN / "python"),
                           "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=timeout)


def _pins() -> dict[str, str]:
    lines = [line for line in PINS.read_text().splitlines() if line and line[0] != "#"]
    return dict(line.lower().split("==") for line in lines)


def _own_distributions() -> dict[str, str]:
    """The distributions installed in the venv's own site-packages (not the project's)."""
    from importlib.metadata import distributions
    site = next(VENV.glob("lib/python*/site-packages"))
    return {d.metadata["Name"].lower(): d.version for d in distributions(path=[str(site)])}


def _stamp() -> str:
    return hashlib.sha256("\n".join([PINS.read_text(), PROJECT_SITE, sys.version])
                          .encode()).hexdigest()


def _build_venv() -> None:
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(VENV)], check=True)
    site = next(VENV.glob("lib/python*/site-packages"))
    # addsitedir, not a plain path: the project's own .pth files (its editable install) count
    (site / "normcore-project.pth").write_text(
        f"import site; site.addsitedir({PROJECT_SITE!r})\n")
    done = _pip("install", "--quiet", "--no-deps", "-r", str(PINS))
    if done.returncode != 0:
        pytest.fail(f"could not install nbgrader's pins ({PINS.name}) into {VENV}: this "
                    f"test needs PyPI, or a pip cache that holds them, the first time.\n"
                    f"{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="module")
def nbgrader_env() -> dict:
    """The environment to run nbgrader in: the venv first on PATH (nbgrader calls
    ``alembic``), this clone's normcore importable, Jupyter's config away from the user's."""
    stamp = VENV / ".stamp"
    if not (stamp.exists() and stamp.read_text() == _stamp()):
        _build_venv()
        stamp.write_text(_stamp())
    own = _own_distributions()
    assert own == _pins(), f"{VENV} holds {own}, not the pins {_pins()}"
    check = _pip("check", timeout=120)
    assert check.returncode == 0, f"nbgrader's requirements unmet:\n{check.stdout}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    jupyter = ROOT / "_build" / "nbgrader-jupyter"
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(":"),
               JUPYTER_CONFIG_DIR=str(jupyter / "config"), JUPYTER_DATA_DIR=str(jupyter / "data"),
               JUPYTER_PLATFORM_DIRS="1", OMP_NUM_THREADS="1")
    return env


def freeze_difference() -> list[str]:
    """``pip freeze`` of the nbgrader venv minus the project's: what the pins file lists."""
    venv = _pip("freeze", timeout=120).stdout.splitlines()
    project = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True,
                             text=True, timeout=120).stdout.splitlines()
    return sorted(set(venv) - set(project), key=str.lower)


def nbgrader(env: dict, course: Path, *args: str) -> str:
    done = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    return done.stderr


def _course(tmp: Path) -> Path:
    course = tmp / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text(COURSE_CONFIG)
    return course


def _assert_same_notebook(release: Path, student: Path) -> None:
    """The release and the student notebook: the same cells (types, sources, ids) and the
    same notebook metadata; in the cells' metadata nbgrader only adds its own."""
    got, want = (nbformat.read(p, as_version=4) for p in (release, student))
    assert [(c.cell_type, c.get("id")) for c in got.cells] == \
        [(c.cell_type, c.get("id")) for c in want.cells], release.name
    for a, b in zip(got.cells, want.cells):
        assert a.source == b.source, f"{release.name}, cell {a.get('id')}"
        extra = {k: v for k, v in a.metadata.items() if k not in ("deletable", "editable")}
        if "nbgrader" in b.metadata:
            added = {k: v for k, v in extra.pop("nbgrader").items()
                     if k not in ("checksum", "cell_type")}
            assert added == b.metadata.nbgrader, f"{release.name}, cell {a.get('id')}"
            extra["nbgrader"] = b.metadata.nbgrader
        assert extra == b.metadata, f"{release.name}, cell {a.get('id')}"
    assert got.metadata == want.metadata, release.name


# --- 1. generate_assignment gives the student notebooks ------------------------------------

def test_pins_are_the_venvs_packages_beyond_the_projects(nbgrader_env):
    pins = [line for line in PINS.read_text().splitlines() if line and line[0] != "#"]
    assert freeze_difference() == pins


def test_generate_assignment_gives_the_student_notebooks(nbgrader_env, tmp_path):
    course = _course(tmp_path)
    for command, out in (("nbgrader-source", course / "source" / "book"),
                         ("student", tmp_path / "student")):
        done = subprocess.run([sys.executable, "-m", "normcore.classroom", command,
                               *map(str, CHAPTERS), "-o", str(out)], env=nbgrader_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "note:" not in done.stderr    # the source is in course/source/<assignment>
    nbgrader(nbgrader_env, course, "generate_assignment", "book")
    released = sorted((course / "release" / "book").glob("*.ipynb"))
    assert [p.name for p in released] == [p.name for p in CHAPTERS]
    for release in released:
        _assert_same_notebook(release, tmp_path / "student" / release.name)
    # the hidden checks are in the source, and nowhere in what the students get
    source = (course / "source" / "book" / "02_batch_norm.ipynb").read_text()
    assert source.count(HIDDEN_BEGIN) == 2 and "hidden=True" in source
    assert not any("hidden=True" in p.read_text() for p in released)


# --- 2. autograde on planted submissions ---------------------------------------------------

MISTAKE = """\
def my_batch_norm(x, gamma, beta, eps):
    dims = [0] + list(range(2, x.dim()))
    shape = [1, -1] + [1] * (x.dim() - 2)
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True)      # the unbiased variance: the mistake
    return gamma.view(shape) * (x - mean) / torch.sqrt(var + eps) + beta.view(shape)"""

CHEAT = """\
def my_batch_norm(x, gamma, beta, eps):
    # YOUR CODE HERE
    raise NotImplementedError()


class Passed:                       # what a check cell reads of a report
    passed = True

    def __str__(self):
        return "batch_norm: correct."


exercises.check = lambda *args, **kwargs: Passed()"""

ANSWER = "The two outputs differ by gamma * b * (1 - alpha)^t / sqrt(var + eps)."


def _reduced_chapter(tmp: Path) -> Path:
    """Chapter 2 reduced to its cells up to its first code cell (the imports) and its
    exercises, under the chapter's name."""
    chapter = ROOT / "chapters" / "02_batch_norm.ipynb"
    nb = nbformat.read(chapter, as_version=4)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = nb.cells[:first + 1] + [c for c in nb.cells if "normcore" in c.metadata]
    path = tmp / "chapter" / chapter.name
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def _submission(release: Path, source: Path, kind: str) -> nbformat.NotebookNode:
    """A student's notebook of ``kind``: correct, mistake (forward pass with the unbiased
    variance), stub (handed in as given) or cheat (replaces exercises.check)."""
    nb = nbformat.read(release, as_version=4)
    solutions = {_grade_id(c): c.source for c in nbformat.read(source, as_version=4).cells}
    for cell in nb.cells:
        gid = _grade_id(cell)
        if kind in ("correct", "mistake") and gid.endswith("-solution"):
            cell.source = "\n".join(line for line in solutions[gid].split("\n")
                                    if line.strip() not in (BEGIN, END))
        if gid.endswith("-answer") and kind != "stub":
            cell.source = ANSWER
        if gid == "ex-bn-forward-solution" and kind in ("mistake", "cheat"):
            cell.source = MISTAKE if kind == "mistake" else CHEAT
    return nb


#: nbgrader's gradebook, per student and grade cell: (auto score, points, needs manual grade).
DUMP = """
import json
from nbgrader.api import Gradebook
with Gradebook("sqlite:///gradebook.db", course_id="normcore") as gb:
    print(json.dumps({sub.student.id: {g.name: [g.auto_score, g.max_score,
                                                g.needs_manual_grade]
                                       for nb in sub.notebooks for g in nb.grades}
                      for sub in gb.assignment_submissions("bn")}))
"""


@pytest.mark.timeout(900)   # eight runs of a notebook; on a loaded CI machine, minutes
def test_autograde_scores_as_the_grader_does(nbgrader_env, tmp_path):
    course = _course(tmp_path)
    chapter, index = _reduced_chapter(tmp_path), book_index(ROOT / "chapters")
    source = write_source(chapter, course / "source" / "bn", index=index)
    student = write_student(chapter, tmp_path / "student", index=index)
    nbgrader(nbgrader_env, course, "generate_assignment", "bn")
    release = course / "release" / "bn" / chapter.name
    _assert_same_notebook(release, student)

    kinds = ("correct", "mistake", "stub", "cheat")
    for kind in kinds:
        path = course / "submitted" / kind / "bn" / chapter.name
        path.parent.mkdir(parents=True)
        nbformat.write(_submission(release, source, kind), path)
    start = time.monotonic()
    log = nbgrader(nbgrader_env, course, "autograde", "bn")
    print(f"nbgrader autograde: {time.monotonic() - start:.0f} s")
    dump = subprocess.run([str(BIN / "python"), "-c", DUMP], cwd=course, env=nbgrader_env,
                          capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0, dump.stderr
    nbg = json.loads(dump.stdout)

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "normcore.classroom", "grade",
                           str(course / "submitted"), "--out", str(tmp_path / "grades.csv"),
                           "--jobs", "2", "--no-progress"], env=nbgrader_env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    print(f"normcore.classroom grade: {time.monotonic() - start:.0f} s")
    with open(tmp_path / "grades.csv", newline="") as f:
        ours = {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}

    coding, manual = ("ex-bn-forward", "ex-bn-backward"), ("ex-bn-bias-eval",
                                                           "ex-bn-weight-norm")
    table = {kind: {label: (nbg[kind][f"{label}-check"][0], int(ours[kind, label]["score"]))
                    for label in coding} for kind in kinds}
    print(json.dumps(table, indent=1))
    # nbgrader's hidden tests ran: autograde put them back into the test cells
    autograded = (course / "autograded" / "correct" / "bn" / chapter.name).read_text()
    assert "hidden=True" in autograded, log[-2000:]
    # the same scores on honest work (points: nbgrader's, ours), but for partial credit:
    # nbgrader's test cell scores all or nothing, ours a rubric's share of a known mistake
    assert table["correct"] == {"ex-bn-forward": (2, 2), "ex-bn-backward": (2, 2)}
    assert table["mistake"] == {"ex-bn-forward": (0, 1), "ex-bn-backward": (2, 2)}
    assert table["stub"] == {"ex-bn-forward": (0, 0), "ex-bn-backward": (0, 0)}
    assert ours["mistake", "ex-bn-forward"]["misconception"] == "unbiased_var"
    assert ours["stub", "ex-bn-forward"]["status"] == "not implemented"
    # the cheat: nbgrader's tests run in the student's kernel, after the student's cells,
    # and call the exercises.check the student replaced: full points for two stubs.
    # normcore.classroom grade checks the functions outside the student's kernel.
    assert table["cheat"] == {"ex-bn-forward": (2, 0), "ex-bn-backward": (2, 0)}
    assert {ours["cheat", label]["status"] for label in coding} == {"not implemented"}
    # derivations: graded by hand in both; an answer cell handed in unchanged nbgrader
    # scores 0 itself (its checksum is the release's), ours leaves it to the grader
    for kind in kinds:
        for label in manual:
            auto, points, needs_manual = nbg[kind][f"{label}-answer"]
            assert points == 1 and ours[kind, label]["status"] == "manual"
            assert (auto, needs_manual) == ((0, False) if kind == "stub" else (None, True))
