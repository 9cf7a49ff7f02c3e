"""The wheel installs with torch alone, and the library runs there.

The wheel is built from a clean copy of the sources (``pyproject.toml``, ``README.md``,
``normcore/``), offline (``pip wheel --no-build-isolation --no-index``: setuptools is pinned
in requirements.txt), and installed into a fresh venv, with no system site-packages, whose
site-packages holds exactly torch and the distributions torch itself requires: those of this
environment, linked (the torch 2.13.0 that every other test uses, without unpacking 900 MB
again or asking an index for it).  pip then installs the wheel with ``--no-index --isolated``:
every dependency the wheel declares must already be there, so a wheel that declared numpy or
matplotlib would fail to install.  In that venv :data:`CHECK` runs: nothing of the book's
is importable, ``normcore.nn``'s modules match their torch twins forward and backward, every
book module that needs more than torch fails with the ImportError that names
``normcore[book]`` and how to install it, and README's library examples run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from normcore import _extras
from test_readme import book_modules_needing_the_extra, library_blocks, section

ROOT = Path(__file__).resolve().parents[1]


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


#: The environment of every child process: no PYTHONPATH (which would show the source tree,
#: and a normcore.egg-info in it, to the venv) and no PIP_* settings.
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}


def _pip(*args: str, python: Path | None = None, cwd: Path) -> subprocess.CompletedProcess:
    """This environment's pip, ignoring pip's configuration and environment (no index, no
    find-links, no constraints), optionally acting on another interpreter's environment.
    ``cwd`` is a directory of the test's own (``python -m`` puts it on sys.path)."""
    target = ("--python", str(python)) if python else ()
    cmd = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *target,
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=CLEAN_ENV)


def torch_closure() -> dict[str, metadata.Distribution]:
    """torch's distribution and those it requires, recursively, as installed here."""
    seen: dict[str, metadata.Distribution] = {}
    todo = ["torch"]
    while todo:
        name = todo.pop()
        if _key(name) in seen:
            continue
        dist = seen[_key(name)] = metadata.distribution(name)
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def link_distributions(dists, site: Path) -> None:
    """Make ``dists`` installed in ``site``: link each top-level entry of their files."""
    for dist in dists:
        tops = {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in sorted(tops - {"__pycache__"}):
            (site / top).symlink_to(Path(dist.locate_file(top)).resolve())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a clean copy of the sources (no stale build/ directory)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "normcore", src / "normcore",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    out = _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
               str(dist), str(src), cwd=dist)
    assert out.returncode == 0, out.stderr
    (found,) = dist.glob("normcore-*.whl")
    return found


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode()), zf.namelist()


def test_the_wheel_declares_torch_alone_and_the_book_extra(wheel):
    meta, names = _metadata(wheel)
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    plain = [r for r in requires if r.marker is None]
    assert [r.name for r in plain] == ["torch"], plain
    assert set(meta.get_all("Provides-Extra")) == {"book", "data", "fast"}
    fast = {_key(r.name) for r in requires if r.marker and r.marker.evaluate({"extra": "fast"})}
    assert fast == {"numba", "numpy"}, fast
    book = {_key(r.name) for r in requires if r.marker and r.marker.evaluate({"extra": "book"})}
    assert {"matplotlib", "ipywidgets", "scipy", "nbformat", "normcore"} <= book, book
    summary = meta["Summary"]
    assert "needs only torch" in summary and "normcore[book]" in summary, summary
    # the book's modules travel in the wheel (the downloaded chapters use them), with their data
    for path in ("normcore/nn/__init__.py", "normcore/_extras.py", "normcore/viz/batch.py",
                 "normcore/classroom/__init__.py", "normcore/cost.json"):
        assert path in names, path
    assert any(n.startswith("normcore/experiments/results/") for n in names)
    assert not any(n.startswith(("tests/", "chapters/")) for n in names)


def test_the_book_extra_resolves_in_the_books_environment(wheel, tmp_path):
    """``normcore[book]`` (with its ``normcore[data]``) resolves, with no index, against the
    packages of requirements.txt: the book's environment has all it asks for."""
    out = _pip("install", "--dry-run", "--no-index", "--report", "-", "-q", f"{wheel}[book]",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {i["metadata"]["name"] for i in report["install"]} <= {"normcore"}, report["install"]


#: Runs in the venv that holds torch and the wheel alone; argv[1] is a JSON list of README's
#: library examples.  Fails by an assert (its message on stderr).
CHECK = textwrap.dedent(r'''
    import importlib, importlib.util, json, pkgutil, sys, warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")   # torch's own
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    import normcore, normcore.nn, normcore.functional
    from normcore import _extras
    assert normcore.__file__.startswith(sys.prefix), ("not the installed wheel", normcore.__file__)

    # nothing of the book's is installed here
    for name in ("matplotlib", "ipywidgets", "IPython", "scipy", "tqdm", "nbformat", "numpy",
                 "PIL", "sklearn"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed in the venv"

    # the drop-in modules against torch's, forward and backward, train and eval
    def twin(ours, theirs, shape, steps=2):
        theirs.load_state_dict(ours.state_dict())
        for mode in ("train",) * steps + ("eval",):
            ours.train(mode == "train"), theirs.train(mode == "train")
            x = torch.randn(*shape, dtype=torch.float64)
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = ours(xa), theirs(xb)
            g = torch.randn_like(ya)
            ya.backward(g), yb.backward(g)
            torch.testing.assert_close(ya, yb)
            torch.testing.assert_close(xa.grad, xb.grad)
            for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
                torch.testing.assert_close(a.grad, b.grad, msg=name)
        for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
            torch.testing.assert_close(a, b, msg=name)
        return type(ours).__name__

    nn, tnn = normcore.nn, torch.nn
    checked = [
        twin(nn.BatchNorm2d(4).double(), tnn.BatchNorm2d(4).double(), (8, 4, 5, 5)),
        twin(nn.LayerNorm(6).double(), tnn.LayerNorm(6).double(), (3, 7, 6)),
        twin(nn.GroupNorm(2, 6).double(), tnn.GroupNorm(2, 6).double(), (4, 6, 3, 3)),
        twin(nn.RMSNorm(6).double(), tnn.RMSNorm(6).double(), (3, 7, 6)),
        twin(nn.InstanceNorm2d(3, affine=True, track_running_stats=True).double(),
             tnn.InstanceNorm2d(3, affine=True, track_running_stats=True).double(),
             (2, 3, 4, 4)),
    ]

    # without numba (normcore[fast]) a LayerNorm and a GroupNorm run the reference
    from normcore import dispatch
    assert not dispatch.kernels_enabled()
    assert normcore.explain(normcore.axes.layout("group", (64, 128, 128), 4),
                            torch.randn(64, 128, 128)).startswith("reference")
    x = torch.randn(64, 128, 128)
    for ours, theirs in ((nn.LayerNorm(128), tnn.LayerNorm(128)),
                         (nn.GroupNorm(4, 128), tnn.GroupNorm(4, 128))):
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)

    # every module: imports, or fails with the ImportError that names the extra
    def names_the_extra(err):
        return _extras.BOOK_EXTRA in str(err) and '.whl[book]' in str(err)

    refused, imported = {}, []
    for info in pkgutil.walk_packages(normcore.__path__, "normcore.",
                                      onerror=lambda name: None):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
            imported.append(info.name)
        except ImportError as err:
            assert names_the_extra(err), (info.name, repr(err))
            refused[info.name] = str(err)
    for name in ("normcore.viz", "normcore.widgets", "normcore.images", "normcore.experiments",
                 "normcore.classroom", "normcore.datasets"):
        try:
            importlib.import_module(name)
        except ImportError as err:
            assert names_the_extra(err), (name, repr(err))
            refused[name] = str(err)
        else:
            raise AssertionError(f"{name} imported without normcore[book]")

    # README's library examples
    for block in json.loads(sys.argv[1]):
        exec(compile(block, "<README>", "exec"), {"__name__": "__readme__"})

    print(json.dumps({"checked": checked, "imported": sorted(imported),
                      "refused": sorted(refused), "viz": refused["normcore.viz"]}))
''')


def test_the_wheel_installs_and_runs_with_torch_alone(wheel, tmp_path):
    start = time.perf_counter()
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   env=CLEAN_ENV, cwd=tmp_path)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True,
                               check=True, env=CLEAN_ENV).stdout.strip())
    closure = torch_closure()
    link_distributions(closure.values(), site)

    # with no index, pip installs the wheel only if everything it declares is there already
    out = _pip("install", "--no-index", "-q", str(wheel), python=python, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    listed = _pip("list", "--format", "json", python=python, cwd=tmp_path)
    installed = {_key(d["name"]) for d in json.loads(listed.stdout)}
    assert installed == set(closure) | {"normcore"}, installed ^ (set(closure) | {"normcore"})
    assert {"matplotlib", "ipywidgets", "numpy"}.isdisjoint(installed)
    check = _pip("check", python=python, cwd=tmp_path)
    assert check.returncode == 0, check.stdout

    run = subprocess.run([str(python), "-I", "-c", CHECK, json.dumps(library_blocks())],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**CLEAN_ENV, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["checked"] == ["BatchNorm2d", "LayerNorm", "GroupNorm", "RMSNorm",
                                 "InstanceNorm2d"]
    said = section().split("runs there")[1].split("against their torch")[0]
    assert set(re.findall(r"`(\w+)`", said)) == set(result["checked"]), said   # README's claim
    assert {"normcore.nn", "normcore.functional", "normcore.fold", "normcore.exercises",
            "normcore.data", "normcore.invariance"} <= set(result["imported"])
    assert set(_extras.NEEDS) <= set(result["refused"]), result["refused"]
    # the book's modules that README says need the extra are those that refuse without it
    refused = {m for m in result["refused"] if m.count(".") == 1}
    assert refused == book_modules_needing_the_extra(), refused
    assert "needs matplotlib, PIL, numpy, sklearn, which are not installed" in result["viz"]
    print(f"wheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB; venv with torch alone, "
          f"install and checks in {time.perf_counter() - start:.1f} s")
