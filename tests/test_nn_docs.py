"""The docstrings of normcore.nn's public classes and functions are complete in torch's form:
every constructor argument in Args (its default written from the signature), Shape for a
module, Examples; and the text shared between classes left no mark unfilled."""
from __future__ import annotations

import inspect
import re

import pytest

from normcore import nn
from normcore.nn import _doc

PUBLIC = {name: getattr(nn, name) for name in nn.__all__}
MODULES = {n: o for n, o in PUBLIC.items() if inspect.isclass(o) and o is not nn.Swap}


def _args(doc: str) -> set[str]:
    """The names of the Args section's entries."""
    section = re.search(r"^\s*Args:\n(.*?)(?:\n\s*\n|\Z)", doc, re.DOTALL | re.MULTILINE)
    assert section, "no Args section"
    lines = section[1].splitlines()
    indent = len(lines[0]) - len(lines[0].lstrip())
    return {m[1] for line in lines
            if (m := re.match(r"(\w+)(?: \([^)]*\))?:", line[indent:]))
            and len(line) - len(line.lstrip()) == indent}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_the_docstring_is_whole(name):
    doc = inspect.getdoc(PUBLIC[name])
    assert "<<" not in doc and "{default}" not in doc
    assert "Examples:" in doc
    if name in MODULES:
        assert "Shape:" in doc and ".. math::" in doc


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_constructor_argument_is_in_args(name):
    cls = MODULES[name]
    params = set(inspect.signature(cls).parameters) - {"self"}
    assert params == _args(inspect.getdoc(cls))


@pytest.mark.parametrize("name", ["convert_to_ws", "convert_ln_to_dyt", "from_torch",
                                  "to_torch"])
def test_every_function_argument_is_in_args(name):
    fn = PUBLIC[name]
    assert set(inspect.signature(fn).parameters) == _args(inspect.getdoc(fn))


def test_the_torch_twins_name_their_differences():
    # each drop-in module names the book's page of differences, eps's first among them
    for name, cls in MODULES.items():
        if cls.__mro__[1].__module__.startswith("torch.nn") or "Norm" in name:
            doc = inspect.getdoc(cls)
            assert "Differs from torch:" in doc and "on purpose" in doc, name


def test_a_template_mark_without_text_is_an_error():
    assert _doc.fill("a <<X>> c <<Y>>", X="b <<Y>>", Y="d") == "a b d c d"
    with pytest.raises(KeyError, match="no text for <<Z>>"):
        _doc.fill("a <<Z>>", X="b")
