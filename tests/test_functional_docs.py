"""The docstrings of normcore.functional's ops (normcore/_functional_docs.py): each op has its
own, whole (an Args entry for every argument of its signature and none for another, a
default written for every argument that has one), and the "Differs from torch" notes are the
ones the page of differences (chapters/differences.md) states, and all of them.

The examples run in tests/test_doctests.py."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import normcore.functional as F
from normcore._checks import WS_CONVENTIONS
from normcore._functional_docs import DOCS
from normcore.defaults import _shown

PAGE = Path(__file__).resolve().parents[1] / "chapters" / "differences.md"

# the ops that are twins of torch.nn.functional's, and the others (torch has no such op)
TWINS = ["batch_norm", "instance_norm", "layer_norm", "rms_norm", "group_norm"]
OWN = ["normalize", "weight_standardize", "instance_stats", "adaptive_instance_norm", "dyt"]

# a note of "Differs from torch", and the section of the page that states the difference
NOTES = {
    "``eps <= 0``": "## 1. eps must be positive",
    "``momentum`` outside": "## 2. momentum must be in [0, 1]",
    "EmptyBatchError": "## 4. An empty batch",
    "``backward``": "## 6. One more argument: `backward=`",
}
# which twins each of those sections is about (the page's own words say so)
CONCERNS = {
    "## 1. eps must be positive": TWINS,
    "## 2. momentum must be in [0, 1]": ["batch_norm", "instance_norm"],
    "## 4. An empty batch": ["instance_norm"],
    "## 6. One more argument: `backward=`": TWINS,
}


def _section(doc: str, title: str) -> str:
    """The text of a Google-style section of ``doc`` ("" if it has none)."""
    m = re.search(rf"^\s*{title}:\n(.*?)(?=^\s*[A-Z][A-Za-z ]*:\n|\Z)", doc, re.M | re.S)
    return m[1] if m else ""


def _args(doc: str) -> list[str]:
    """The names of the entries of the Args section."""
    text = _section(doc, "Args")
    indent = min(len(line) - len(line.lstrip()) for line in text.splitlines() if line.strip())
    return re.findall(rf"^ {{{indent}}}(\w+) \(", text, re.M)


def test_every_op_takes_its_docstring_from_the_table_and_no_other_is_there():
    ops = {name for name, obj in vars(F).items()
           if inspect.isfunction(obj) and obj.__module__ == F.__name__
           and not name.startswith("_") and name != "rms_eps"}
    assert set(DOCS) == ops == set(TWINS + OWN)
    for name in DOCS:
        doc = getattr(F, name).__doc__
        assert "{default}" not in doc and "<eps:" not in doc, name


@pytest.mark.parametrize("name", TWINS + OWN)
def test_args_name_every_argument_and_write_every_default(name):
    fn = getattr(F, name)
    params = inspect.signature(fn).parameters
    assert _args(fn.__doc__) == list(params), name
    text = _section(fn.__doc__, "Args")
    for p in params.values():
        entry = re.search(rf"^\s+{p.name} \(.*?(?=^\s+\w+ \(|\Z)", text, re.M | re.S)[0]
        assert ("Default: ``" in entry) == (p.default is not inspect.Parameter.empty), p.name


@pytest.mark.parametrize("name", TWINS + OWN)
def test_every_op_has_returns_and_an_example(name):
    doc = getattr(F, name).__doc__
    assert _section(doc, "Returns").strip() and ">>> " in _section(doc, "Examples"), name


def test_the_differences_noted_are_the_pages_and_all_of_them():
    page = PAGE.read_text()
    for heading in NOTES.values():
        assert heading in page, heading
    for name in TWINS + OWN:
        notes = _section(getattr(F, name).__doc__, "Differs from torch")
        items = re.split(r"^\s*- ", notes, flags=re.M)[1:]     # each with its continuation
        # every note is one of the page's differences ...
        for item in items:
            assert any(key in item for key in NOTES), (name, item)
        # ... and each difference of the page that concerns the op is noted
        for note, heading in NOTES.items():
            assert (note in notes) == (name in CONCERNS[heading]), (name, note)


def test_the_conventions_table_shows_each_conventions_eps():
    doc = F.weight_standardize.__doc__
    for name, conv in WS_CONVENTIONS.items():
        row = re.search(rf"^``{name}``.*$", doc, re.M)[0]
        assert row.split()[-1] == _shown(conv["eps"]), row
