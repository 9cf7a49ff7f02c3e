"""The Examples of the public API's docstrings run, as doctests, and every public name has one.

The modules are those whose names a PyTorch user imports: ``normcore.functional`` and the
modules of ``normcore.nn``.  A doctest's printed output must not depend on the machine (round
it, or print shapes and booleans): these run under other CPU kernels in CI too."""
from __future__ import annotations

import doctest
import importlib
import inspect

import pytest
import torch

PUBLIC = ["normcore.functional", "normcore.nn.batchnorm", "normcore.nn.instancenorm",
          "normcore.nn.normalization", "normcore.nn.conv", "normcore.nn.dyt",
          "normcore.nn.convert"]


def _public(module_name: str) -> dict:
    """The module's public classes and functions (its ``__all__``)."""
    module = importlib.import_module(module_name)
    objs = {name: getattr(module, name) for name in module.__all__}
    return {n: o for n, o in objs.items() if inspect.isclass(o) or inspect.isfunction(o)}


def _tests(module_name: str) -> list[doctest.DocTest]:
    """The doctests of the module's docstring and of each public name (a class's methods
    included), found by object: ``normcore.nn``'s classes answer to ``normcore.nn``."""
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    globs = {"torch": torch}
    found = finder.find(module, module_name, globs=dict(globs))
    for name, obj in _public(module_name).items():
        found += finder.find(obj, name, module=False, globs=dict(globs))
    unique = {t.name: t for t in found if t.examples}
    return list(unique.values())


@pytest.mark.parametrize("module_name", PUBLIC)
def test_examples_run(module_name):
    torch.manual_seed(0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = _tests(module_name)
    assert tests, f"{module_name}: no docstring has an example"
    report: list[str] = []
    for t in tests:
        runner.run(t, out=report.append)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{module_name}: {failed} of {attempted} examples failed:\n" + \
                        "".join(report)


@pytest.mark.parametrize("module_name", PUBLIC)
def test_every_public_name_has_an_example(module_name):
    with_examples = {t.name for t in _tests(module_name)}
    missing = [name for name in _public(module_name) if name not in with_examples]
    assert not missing, f"{module_name}: no example in the docstring of {missing}"
