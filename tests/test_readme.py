"""README's section "Using normcore as a library": its examples run, its drop-in table is the
code's mapping, every test it names exists, and its lists of the library's and the book's
modules are the package's.  (``tests/test_wheel.py`` runs the same examples in a venv that
holds torch and the wheel alone.)"""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import torch

import normcore.nn
from normcore import _extras
from normcore.nn import convert
from test_packaging import LIBRARY

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TITLE = "## Using normcore as a library"


def section() -> str:
    start = README.index(TITLE)
    end = README.find("\n## ", start + len(TITLE))
    return README[start:end if end >= 0 else None]


def library_blocks() -> list[str]:
    """The section's python blocks (its sh blocks install from the network: not run)."""
    return re.findall(r"```python\n(.*?)```", section(), flags=re.S)


def _bullet(start: str) -> str:
    """The text of the section's list item that starts with ``start``."""
    match = re.search(rf"^- {re.escape(start)}(.*?)(?=^- |^\S|\Z)", section(), flags=re.S | re.M)
    assert match, f"README's section has no item starting {start!r}"
    return match.group(1)


def _names(text: str) -> set[str]:
    """The backticked names in ``text`` that are modules of the package, as ``normcore.X``."""
    out = set()
    for name in re.findall(r"`([A-Za-z_.]+)`", text):
        module = name if name.startswith("normcore.") else f"normcore.{name}"
        path = ROOT.joinpath(*module.split("."))
        if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
            out.add(module)
    return out


def book_modules_needing_the_extra() -> set[str]:
    text = _bullet("**the book's modules**")
    return _names(text.split("the others need")[1].split("and, without it")[0])


def test_the_examples_run():
    blocks = library_blocks()
    assert len(blocks) == 2, "the converters' and the backward's examples"
    for block in blocks:
        exec(compile(block, "<README>", "exec"), {"__name__": "__readme__"})


def test_the_examples_can_fail():
    """A wrong claim in an example fails the test above (it runs them as they are)."""
    broken = library_blocks()[0].replace("type(model[1]) is torch.nn.BatchNorm2d",
                                         "type(model[1]) is normcore.nn.BatchNorm2d")
    try:
        exec(compile(broken, "<README>", "exec"), {})
    except AssertionError:
        return
    raise AssertionError("the broken example ran")


def test_the_drop_in_table_is_the_mapping_of_the_code():
    table = section().split("<!-- drop-in table")[1].split("<!-- end of the drop-in table")[0]
    rows = set(re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|$", table, flags=re.M))
    modules = {(f"normcore.nn.{ours.__name__}", f"torch.nn.{theirs.__name__}")
               for theirs, ours in convert.TORCH_TO_NORMCORE.items()}
    functions = {(f"normcore.functional.{ours.__name__}",
                  f"torch.nn.functional.{theirs.__name__}")
                 for theirs, ours in convert.FUNCTIONS.items()}
    assert rows == modules | functions, (rows ^ (modules | functions))
    for ours, theirs in rows:     # every name in the table is the object the mapping holds
        obj = normcore
        for part in ours.split(".")[1:]:
            obj = getattr(obj, part)
        ref = torch
        for part in theirs.split(".")[1:]:
            ref = getattr(ref, part)
        assert convert.TORCH_TO_NORMCORE.get(ref, convert.FUNCTIONS.get(ref)) is obj


def test_the_modules_without_a_twin_are_named():
    twins = {ours.__name__ for ours in convert.TORCH_TO_NORMCORE.values()}
    rest = set(normcore.nn.__all__) - twins - {"from_torch", "to_torch", "Swap"}
    text = section().split("Without a\ntorch twin:")[1].split("\n\n")[0]
    assert rest == set(re.findall(r"`(\w+)`", text)), rest


def _defined_tests() -> dict[str, set[str]]:
    return {p.name: {n.name for n in ast.walk(ast.parse(p.read_text()))
                     if isinstance(n, ast.FunctionDef)}
            for p in sorted((ROOT / "tests").glob("test_*.py"))}


def test_every_test_the_section_names_exists():
    defined = _defined_tests()
    text = section()
    named = re.findall(r"tests/(test_\w+\.py)::(test_\w+)", text)
    assert len(named) >= 8, named
    for file, name in named:
        assert name in defined.get(file, ()), f"README names {file}::{name}, which does not exist"
    everywhere = set().union(*defined.values())
    for name in re.findall(r"`(test_\w+)`", text):
        assert name in everywhere, f"README names {name}, which is no test"
    for file in re.findall(r"`tests/(test_\w+\.py)`", text):
        assert file in defined, file


def test_the_links_and_files_it_names_exist():
    text = section()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / target).exists(), target
    for path in re.findall(r"`(normcore/[\w/]+\.py)`", text):
        assert (ROOT / path).exists(), path


def test_the_library_is_what_import_normcore_loads():
    """The README's list of the library is test_packaging's LIBRARY (which a fresh
    interpreter checks against ``import normcore``)."""
    assert _names(_bullet("**the library**")) == LIBRARY - {"normcore"}


def test_every_module_is_either_the_librarys_or_the_books():
    pkg = ROOT / "normcore"
    top = {f"normcore.{p.stem}" for p in pkg.glob("*.py") if p.stem != "__init__"}
    top |= {f"normcore.{p.parent.name}" for p in pkg.glob("*/__init__.py")}
    top -= {"normcore._extras"}    # the helper itself, named in the book's item
    library = {m for m in LIBRARY if m.count(".") == 1}
    book = _names(_bullet("**the book's modules**"))
    assert library.isdisjoint(book)
    assert library | book == top, (top - library - book, (library | book) - top)
    assert set(_extras.NEEDS) <= book_modules_needing_the_extra()


def test_the_declared_torch_range_is_the_one_in_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    text = " ".join(section().split())
    assert f"one dependency, `{deps[0]}`" in text, deps
    assert "Not `pip install normcore`: that name on PyPI belongs to another project" in text
    tested = re.search(r"^torch==([\d.]+)$", (ROOT / "requirements.txt").read_text(), re.M)[1]
    assert f"{tested} is the release tested" in text, tested
