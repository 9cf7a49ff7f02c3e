"""The package's structure: no import cycles, the sets stated once, files of a readable size
(the package's and the tools')."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "normcore"
TOOLS = PKG.parent / "tools"   # the book's tools (tools/sitecheck/ among them): sizes only
MODULES = {p: ".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
           for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path, name: str) -> set[str]:
    """The normcore modules ``path`` imports, at any depth (lazy imports count too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if node.module or not node.level:   # `from . import x` imports x, not the package
                found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)   # from pkg import module
    known = set(MODULES.values())
    return {m for m in found if m in known and m != name}


GRAPH = {name: _imports(path, name) for path, name in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            # a package's __init__ importing its own submodules is not a cycle back to it
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if state.get(node) is None:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_is_acyclic():
    assert GRAPH["normcore.grad"], "the import graph was not read"
    cycle = _cycle({k: {m for m in v if not k.startswith(m + ".")} for k, v in GRAPH.items()})
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module, allowed", [
    ("normcore.errors", set()),
    ("normcore.axes", {"normcore.errors"}),
    ("normcore.stats", set()),
    ("normcore.defaults", set()),
    ("normcore._checks", {"normcore.axes", "normcore.defaults", "normcore.errors",
                          "normcore.stats"}),
    # the functional ops' docstrings (and their defaults, filled in)
    ("normcore._functional_docs", {"normcore._checks", "normcore.defaults"}),
    # the numeric core: the reference, the choice, the kernels' loops and the views they read
    ("normcore.core", {"normcore.axes"}),
    ("normcore.dispatch", {"normcore.axes"}),
    ("normcore.loops", set()),
    ("normcore.positions", {"normcore.loops"}),
    ("normcore.kernels", {"normcore.axes", "normcore.core", "normcore.dispatch",
                          "normcore.loops", "normcore.positions"}),
    ("normcore.grad", {"normcore.axes", "normcore.core", "normcore.dispatch",
                       "normcore.kernels"}),
    ("normcore.frozen", {"normcore.axes", "normcore.core", "normcore.dispatch",
                         "normcore.kernels"}),
    ("normcore.grad_dyt", {"normcore.axes", "normcore.core", "normcore.dispatch"}),
    ("normcore.functional", {"normcore._checks", "normcore._functional_docs", "normcore.axes",
                             "normcore.core", "normcore.defaults", "normcore.dispatch",
                             "normcore.frozen", "normcore.grad", "normcore.grad_dyt",
                             "normcore.kernels", "normcore.stats"}),
    ("normcore.sync", {"normcore._checks", "normcore.axes", "normcore.core", "normcore.defaults",
                       "normcore.stats"}),
    ("normcore.launch", set()),
    # the real data sets: the cache's location is the experiments' (one setting), and the
    # check that names normcore[book] when numpy or scikit-learn is missing
    ("normcore.datasets", {"normcore.experiments.runner", "normcore._extras"}),
    # what the book's modules need beyond torch: above every layer
    ("normcore._extras", set()),
])
def test_each_layer_imports_only_from_the_layers_above(module, allowed):
    assert GRAPH[module] <= allowed, f"{module} imports {sorted(GRAPH[module] - allowed)}"


# reduce dims written out by hand: (0,) + tuple(range(2, ...)), [0] + list(range(2, ...)),
# range(2, x.dim()) (every dim after the channels), (0, 2, 3)
_HAND_WRITTEN_SETS = re.compile(
    r"\(0,\)\s*\+\s*tuple\(range\(2|\[0\]\s*\+\s*list\(range\(2|range\(2,\s*[\w.]+\.dim\(\)\)"
    r"|range\(2,\s*(len\(|ndim|nd\b)|\(0,\s*2,\s*3\)|dim=\(0,|dims=\(0,")


def _code_only(text: str) -> str:
    """The source without its strings and comments (docstrings may show a student's code)."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT):
            out.append(tok.string)
    return " ".join(out).replace("( ", "(").replace(" )", ")").replace(" ,", ",").replace(" (", "(")


def test_no_reduce_dims_are_hand_written_outside_axes():
    offenders = [str(p.relative_to(PKG.parent)) for p in MODULES
                 if p.name != "axes.py" and _HAND_WRITTEN_SETS.search(_code_only(p.read_text()))]
    assert not offenders, f"reduce dims written by hand (take them from normcore.axes): {offenders}"
    assert _HAND_WRITTEN_SETS.search(_code_only("dims = (0,) + tuple(range(2, x.dim()))"))


def test_no_module_is_longer_than_500_lines():
    files = [*MODULES, *sorted(TOOLS.rglob("*.py"))]
    assert any(p.parent.name == "sitecheck" for p in files), "tools/sitecheck/ was not read"
    long = {str(p.relative_to(PKG.parent)): n for p in files
            if (n := len(p.read_text().splitlines())) > 520}
    assert not long, f"split these modules along their seams: {long}"


README = PKG.parent / "README.md"


def _readme_rows() -> list[list[str]]:
    """The README's module table, in order: each row's modules (``nn/`` stands for the
    package and its submodules; a row may name several, `` `a.py`, `b/` ``)."""
    text = README.read_text()
    start = text.index("| module | what it holds |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cell = line.split("|")[1]
        rows.append(["normcore." + n.strip("`/ ").removesuffix(".py")
                     for n in re.findall(r"`[\w/.]+`", cell)])
    return rows


def _row_of(module: str, rows: list[list[str]]) -> int | None:
    for k, names in enumerate(rows):
        if any(module == n or module.startswith(n + ".") for n in names):
            return k
    return None


def test_the_readme_lists_every_module_in_an_order_the_imports_obey():
    """The README's table is the layering: every module of the package is in it, and each
    imports only from its own row and the rows above (the rule the README states)."""
    rows = _readme_rows()
    assert len(rows) > 20, "the README's module table was not read"
    missing = sorted(m for m in GRAPH if m != "normcore" and _row_of(m, rows) is None)
    assert not missing, f"modules the README's table does not list: {missing}"
    upward = []
    for module, imported in GRAPH.items():
        if module == "normcore":
            continue
        here = _row_of(module, rows)
        for other in imported:
            there = _row_of(other, rows)
            if other != "normcore" and there is not None and there > here:
                upward.append(f"{module} -> {other}")
    assert not upward, f"imports from a row below (reorder the table or the code): {upward}"


def test_the_readme_order_check_can_fail():
    rows = [["normcore.core"], ["normcore.axes"]]
    assert _row_of("normcore.core", rows) == 0 and _row_of("normcore.axes.x", rows) == 1
    assert _row_of("normcore.grad", rows) is None
