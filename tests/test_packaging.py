"""The lean install: the library needs torch alone, the book's modules name their extra.

``pip install normcore`` declares torch as its one dependency, so ``import normcore`` (and
``normcore.nn``, ``normcore.functional``) must load nothing else: checked here in a fresh
interpreter, through ``sys.modules``.  Every import in the package is read (lazy ones too)
and checked against :data:`normcore._extras.NEEDS`, and that list against the extra
``normcore[book]`` of ``pyproject.toml``.  ``tests/test_wheel.py`` installs the built wheel
into a venv that holds only torch and runs the library there.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from normcore import _extras

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "normcore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MODULES = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
           for p in sorted(PKG.rglob("*.py"))}

#: The library: what `import normcore` may load of normcore, the layers up to nn and fold
#: (normcore.nn with its submodules).  README's "Using normcore as a library" lists them.
LIBRARY = {"normcore", "normcore._checks", "normcore._functional_docs", "normcore.axes",
           "normcore.core", "normcore.defaults", "normcore.errors", "normcore.fold",
           "normcore.functional", "normcore.grad", "normcore.grad_dyt", "normcore.nn",
           "normcore.frozen", "normcore.dispatch", "normcore.kernels", "normcore.loops",
           "normcore.positions",
           "normcore.stats", "normcore.sync"}


def in_library(module: str) -> bool:
    return module in LIBRARY or module.startswith("normcore.nn.")

#: In the book extra but imported by no module: the kernel that nbclient starts by name.
NOT_IMPORTED = {"ipykernel"}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(root: str) -> set[str]:
    """``root``'s distribution and every distribution it needs, installed here (normalized)."""
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if _key(name) in seen:
            continue
        seen.add(_key(name))
        for text in metadata.distribution(name).requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _extra(name: str) -> list[Requirement]:
    """The requirements of ``normcore[name]``, with ``normcore[other]`` expanded."""
    out = []
    for text in PYPROJECT["project"]["optional-dependencies"][name]:
        req = Requirement(text)
        if _key(req.name) == "normcore":
            for other in sorted(req.extras):
                out.extend(_extra(other))
        else:
            out.append(req)
    return out


def _third_party_imports(path: Path) -> set[str]:
    """The top-level names of every absolute import in ``path`` (in functions too) that are
    neither the standard library nor normcore nor torch."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names
            if n not in sys.stdlib_module_names and n not in ("__future__", "normcore", "torch")}


def _needs_of(module: str) -> set[str]:
    """What NEEDS allows ``module`` to import: its entry's names, or its package's."""
    return {name for key, names in _extras.NEEDS.items()
            if module == key or module.startswith(key + ".") for name in names}


def _optional_of(module: str) -> set[str]:
    """What OPTIONAL lets a library module import when it is installed."""
    return set(_extras.OPTIONAL.get(module, ()))


# --- import normcore loads the library and torch, nothing else ---------------------------

_PROBE = """
import json, sys
import torch
before = set(sys.modules)
import normcore, normcore.nn, normcore.functional
new = sorted(set(sys.modules) - before)
print(json.dumps(new))
"""


def _loaded_by_import_normcore() -> list[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return json.loads(out.stdout)


def test_import_normcore_loads_only_the_library_and_torch():
    """``import normcore, normcore.nn, normcore.functional`` in a fresh interpreter, after
    ``import torch``: every module it adds is normcore's library, the standard library's, or
    torch's or that of a package torch itself needs."""
    new = _loaded_by_import_normcore()
    ours = {m for m in new if m.split(".")[0] == "normcore"}
    assert {"normcore.nn", "normcore.functional", "normcore.grad"} <= ours, ours
    assert all(map(in_library, ours)), (f"import normcore loads "
                                        f"{sorted(m for m in ours if not in_library(m))}, "
                                        f"which are not the library")
    allowed = _closure("torch")
    dists = metadata.packages_distributions()
    others = {m.split(".")[0] for m in new} - {"normcore"} - set(sys.stdlib_module_names)
    foreign = {m for m in others if not m.startswith("_")    # C helpers such as _cffi_backend
               and not {_key(d) for d in dists.get(m, [m])} & allowed}
    assert not foreign, f"import normcore loads {sorted(foreign)}, which torch does not need"
    book = {"matplotlib", "ipywidgets", "IPython", "nbformat", "scipy", "tqdm"}
    assert not book & {m.split(".")[0] for m in new}


def test_the_probe_sees_a_book_import(monkeypatch, tmp_path):
    """The probe can fail: a normcore whose __init__ imports the book's code is caught."""
    fake = tmp_path / "normcore"
    fake.mkdir()
    (fake / "__init__.py").write_text("import json\nimport normcore_fake_book\n")
    (fake / "nn.py").write_text("")
    (fake / "functional.py").write_text("")
    (tmp_path / "normcore_fake_book.py").write_text("")
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    assert "normcore_fake_book" in json.loads(out.stdout)


# --- every import is declared ------------------------------------------------------------

def test_every_import_beyond_torch_is_in_needs():
    """A module imports (at any depth) only the standard library, torch, normcore and the
    names NEEDS lists for it or its package: the library and the book's torch-only modules
    (exercises, choose, invariance, data, launch) import nothing else."""
    assert _third_party_imports(PKG / "widgets.py") >= {"ipywidgets"}, "imports were not read"
    undeclared = {m: sorted(_third_party_imports(p) - _needs_of(m) - _optional_of(m))
                  for m, p in MODULES.items()}
    undeclared = {m: names for m, names in undeclared.items() if names}
    assert not undeclared, (f"imports not listed in normcore._extras.NEEDS: {undeclared}; list "
                            f"them there (and their package in pyproject's book extra)")
    for module in filter(in_library, MODULES):
        assert not _needs_of(module), f"{module} is the library's: it may need torch alone"


def test_each_module_that_needs_more_calls_require():
    """Every key of NEEDS is a module of the package whose code calls require(__name__), so
    that it fails at import, before its first import from the list."""
    for key in _extras.NEEDS:
        path = MODULES.get(key)
        assert path is not None, f"NEEDS names {key}, which is no module of the package"
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "require"
                 and [ast.unparse(a) for a in n.args] == ["__name__"]]
        assert calls, f"{key} does not call require(__name__)"


def test_needs_and_the_book_extra_agree():
    """Each name in NEEDS is a distribution of the book extra (PIL is pillow, sklearn is
    scikit-learn: read from the installed packages), and each requirement of the extra is
    imported somewhere (but the kernel, started by name)."""
    dists = metadata.packages_distributions()
    book = {_key(r.name) for r in _extra("book")}
    imported = set()
    for name in sorted({n for names in _extras.NEEDS.values() for n in names}):
        assert name in dists, f"{name} (in NEEDS) is not installed in the book's environment"
        found = {_key(d) for d in dists[name]} & book
        assert found, f"{name} comes from {dists[name]}, which is not in normcore[book]"
        imported |= found
    imported |= {_key(r.name) for r in _extra("fast")}
    assert book - imported == NOT_IMPORTED, f"normcore[book] lists {sorted(book - imported)}"


def test_the_optional_imports_are_the_fast_extra_and_import_lazily():
    """Each name in OPTIONAL is a requirement of normcore[fast] (which the book's extra
    includes), imported by its library module only inside a function, under ``try`` (the
    library runs without it: test_kernels.py::test_layer_norms_take_the_kernels_as_the_table_says)."""
    fast = {_key(r.name) for r in _extra("fast")}
    assert fast <= {_key(r.name) for r in _extra("book")}
    for module, names in _extras.OPTIONAL.items():
        assert in_library(module) and set(names) == _third_party_imports(MODULES[module])
        assert {_key(n) for n in names} <= fast, (module, names, fast)
        tree = ast.parse(MODULES[module].read_text())
        top = {a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import)
               for a in node.names}
        top |= {node.module.split(".")[0] for node in tree.body
                if isinstance(node, ast.ImportFrom) and node.module}
        assert not set(names) & top, f"{module} imports {names} at the top"
        guarded = [node for node in ast.walk(tree) if isinstance(node, ast.Try)
                   and any(isinstance(n, ast.Import) and {a.name for a in n.names} & set(names)
                           for n in node.body)]
        assert guarded, f"{module} imports {names} outside a try"


def test_the_library_declares_torch_alone_with_the_tested_release():
    deps = [Requirement(t) for t in PYPROJECT["project"]["dependencies"]]
    assert [d.name for d in deps] == ["torch"], deps
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    tested = Version(pins["torch"])
    assert deps[0].specifier.contains(tested), (deps[0], tested)
    assert not deps[0].specifier.contains(Version("3.0")), "declare an upper bound, <3"
    assert not deps[0].specifier.contains(Version("2.4")), "2.4 lacks what the library calls"


def test_the_book_environment_pins_the_book_extra():
    """requirements.txt (the book's environment) pins every package of normcore[book]."""
    pinned = {_key(line.split("==")[0]) for line in
              (ROOT / "requirements.txt").read_text().splitlines() if "==" in line}
    missing = sorted(r.name for r in _extra("book") if _key(r.name) not in pinned)
    assert not missing, f"requirements.txt does not pin {missing}"


def test_extras_imports_nothing_from_normcore():
    tree = ast.parse((PKG / "_extras.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith(("normcore", "."))}, imported
    assert all(n.level == 0 for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))


# --- the error that names the extra --------------------------------------------------------

def _without(monkeypatch, *absent):
    real = _extras.importlib.util.find_spec
    monkeypatch.setattr(_extras.importlib.util, "find_spec",
                        lambda name: None if name in absent else real(name))


def test_require_names_the_extra_and_what_is_missing(monkeypatch):
    _without(monkeypatch, "matplotlib", "PIL")
    with pytest.raises(ImportError, match=r'normcore.viz is one of the normcore book.*needs '
                                          r'matplotlib, PIL, which are not installed.*'
                                          r'extra, normcore\[book\]: pip install '
                                          r'"normcore-[\d.]+-py3-none-any.whl\[book\]"') as err:
        _extras.require("normcore.viz")
    assert err.value.name == "matplotlib"
    # never the bare name: normcore on PyPI is another project
    assert not re.search(r'pip install "?normcore(\[book\])?"?( |$)', str(err.value))
    _extras.require("normcore.experiments")   # scipy, tqdm, ... are found: nothing raised
    _without(monkeypatch, "nbformat")
    with pytest.raises(ImportError, match=r"needs nbformat, which is not installed"):
        _extras.require("normcore.classroom")


def test_require_of_a_module_not_in_needs_is_an_error():
    with pytest.raises(ValueError, match=r"normcore.nn is not one of the book's modules.*"
                                         r"add it there"):
        _extras.require("normcore.nn")
