"""What grading need not run: the chapters' training demos, figures and widgets.

A submission is a whole chapter, and grading it used to re-run every cell.  The exercises
need only some of them: the imports, the helpers and data their solutions and checks read.
A chapter marks each cell grading may skip with the metadata ``"normcore": {"grading":
"skip"}`` (beside any other key of the cell's ``normcore`` marking); the student notebook
keeps that mark (:mod:`.student`), and the grader (:mod:`.grade`) replaces a skipped cell's
source with one comment line, ``# skipped when grading: <its first line>``.

**The rule.**  A skipped cell must not bind a name that a later cell that is not skipped
reads.  Names are found statically (the AST of each cell, IPython's ``%``/``!`` lines left
out):

* a cell *binds* a name it assigns, imports, defines (``def``, ``class``), uses as a loop or
  ``with`` target, or *changes*: ``N.a = ...``, ``N[i] = ...``, ``N += ...``, a call
  ``N(...)`` of a name bound by assignment (a module in training mode changes its running
  statistics), or a method call on ``N`` that changes it in place (``N.add_(...)``,
  ``N.train()``, ``N.append(...)``, ... see :data:`CHANGING_METHODS`);
* a cell *reads* a name it loads before binding it (loads inside its functions count:
  conservative), for which the latest cell above that binds it is the one it depends on.

:func:`violations` lists every (skipped cell, later cell, name) that breaks the rule,
:data:`IGNORED` aside (the figure-only names ``fig``, ``ax``, rebound by each figure cell);
:func:`plan` gives the largest set of cells that can be skipped under it: every code cell
that is not a coding exercise's solution or check, and not the first code cell (the imports),
unless a kept cell depends on it, or it changes the process's state (``set_default_dtype``,
``set_num_threads``, ``os.environ``, ``sys.path``, warnings filters: :data:`STATE_CALLS`).

What this cannot see: a student's solution that reads a name the chapter's own solution does
not (a demo's variable), and changes through aliases or a tensor's ``.grad``.  The first
breaks only that student's exercise, as a ``NameError`` in the grade sheet; the instructor
then grades that submission without skipping (:func:`unmark`).
"""
from __future__ import annotations

import ast
import builtins
import copy
from pathlib import Path

__all__ = ["SKIP", "IGNORED", "CHANGING_METHODS", "STATE_CALLS", "is_skipped", "mark",
           "unmark", "cell_names", "violations", "plan", "skipped_ids", "first_line",
           "skipped_source", "with_skips", "chapter_skips"]

#: The marking of a cell grading may skip (inside the cell's ``metadata.normcore``).
SKIP = {"grading": "skip"}
#: Names the rule ignores: the figure-only names every figure cell binds anew.
IGNORED = frozenset({"fig", "ax", "_", "__", "___"})
#: Method calls that change their object: in-place tensor ops (a trailing ``_``) and these.
CHANGING_METHODS = frozenset({
    "train", "eval", "append", "extend", "insert", "update", "pop", "popitem", "clear",
    "setdefault", "remove", "sort", "reverse", "add", "discard", "load_state_dict", "step",
    "zero_grad", "backward", "register_buffer", "register_parameter", "apply", "to",
    "reset_parameters", "reset_running_stats", "requires_grad_", "write", "close", "seek"})
#: Calls whose cell changes the process's state: such a cell is never skipped.
STATE_CALLS = frozenset({"set_default_dtype", "set_num_threads", "set_num_interop_threads",
                         "use_deterministic_algorithms", "filterwarnings", "simplefilter",
                         "chdir", "putenv", "setrecursionlimit"})
_BUILTINS = frozenset(dir(builtins)) | {"display", "get_ipython", "In", "Out", "exit", "quit"}


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_skipped(cell) -> bool:
    """Whether ``cell`` carries the marking :data:`SKIP`."""
    meta = cell.get("metadata", {}).get("normcore")
    return isinstance(meta, dict) and meta.get("grading") == SKIP["grading"]


def mark(cell, skip: bool) -> bool:
    """Set or remove the marking of ``cell`` (its other ``normcore`` keys kept); whether the
    cell changed."""
    meta = cell.setdefault("metadata", {})
    mine = meta.get("normcore")
    if skip == is_skipped(cell):
        return False
    if skip:
        meta["normcore"] = {**(mine if isinstance(mine, dict) else {}), **SKIP}
    else:
        rest = {k: v for k, v in mine.items() if k != "grading"}
        if rest:
            meta["normcore"] = rest
        else:
            del meta["normcore"]
    return True


def unmark(nb) -> int:
    """Remove every skip marking of ``nb`` (to grade a submission whole); how many."""
    return sum(mark(c, False) for c in nb["cells"])


def first_line(source: str) -> str:
    """The first non-blank line of ``source``, stripped (and cut at 100 characters)."""
    line = next((s.strip() for s in source.splitlines() if s.strip()), "")
    return line[:100]


def skipped_source(source: str) -> str:
    """What the grader runs in place of a skipped cell."""
    return f"# skipped when grading: {first_line(source)}"


def _parse(source: str) -> ast.Module | None:
    if source.lstrip().startswith("%%"):   # a cell magic: its body may not be Python
        return None
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def _root(node) -> str | None:
    """The name at the root of ``a.b[c].d``, or ``None``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Names(ast.NodeVisitor):
    """The bindings and loads of one top-level statement (nested scopes included)."""

    def __init__(self, assigned: set[str]):
        self.binds: set[str] = set()
        self.loads: list[str] = []
        self.state = False
        self.assigned = assigned   # names bound by assignment so far (callable objects)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.loads.append(node.id)
        else:
            self.binds.add(node.id)

    def _target(self, target):
        if isinstance(target, (ast.Attribute, ast.Subscript)) and _root(target):
            self.binds.add(_root(target))

    def visit_Assign(self, node):
        for t in node.targets:
            for sub in ast.walk(t):
                self._target(sub)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self._target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self._target(node.target)
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute):
            name = func.attr
            if name in STATE_CALLS:
                self.state = True
            if (((name.endswith("_") and not name.startswith("_")) or name in CHANGING_METHODS)
                    and _root(func.value)):
                self.binds.add(_root(func.value))
        elif isinstance(func, ast.Name) and func.id in self.assigned:
            self.binds.add(func.id)
        if isinstance(func, ast.Name) and func.id in STATE_CALLS:
            self.state = True
        self.generic_visit(node)

    def _scope(self, node):
        self.binds.add(node.name)
        for d in node.decorator_list:
            self.visit(d)
        inner = _Names(self.assigned)
        for stmt in node.body:
            inner.visit(stmt)
        local = set(inner.binds)
        if not isinstance(node, ast.ClassDef):
            local |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            for d in node.args.defaults + node.args.kw_defaults:
                if d is not None:
                    self.visit(d)
        self.loads += [n for n in inner.loads if n not in local]
        self.state |= inner.state

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Lambda(self, node):
        args = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        inner = _Names(self.assigned)
        inner.visit(node.body)
        self.loads += [n for n in inner.loads if n not in args]

    def visit_Import(self, node):
        for alias in node.names:
            self.binds.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_Global(self, node):
        self.binds.update(node.names)


def cell_names(source: str, objects=frozenset()) -> tuple[set[str], set[str], bool] | None:
    """``(binds, reads, changes_state)`` of a code cell's source (see the module's rule),
    or ``None`` when it does not parse (a cell magic): such a cell is never skipped.
    ``objects``: the names the notebook binds by assignment (a call of one changes it)."""
    found = _analyze(source, objects)
    return None if found is None else found[:3]


def _analyze(source: str, objects=frozenset()):
    tree = _parse(source)
    if tree is None:
        return None
    binds: set[str] = set()
    reads: set[str] = set()
    assigned: set[str] = set(objects)
    mine: set[str] = set()
    state = False
    for stmt in tree.body:
        names = _Names(assigned)
        names.visit(stmt)
        # a comprehension's target is bound and loaded inside the statement: not a read
        comp = {n.id for c in ast.walk(stmt) if isinstance(c, ast.comprehension)
                for n in ast.walk(c.target) if isinstance(n, ast.Name)}
        reads |= {n for n in names.loads if n not in binds and n not in comp
                  and n not in _BUILTINS}
        binds |= names.binds
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = getattr(stmt, "targets", None) or [stmt.target]
            mine |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            assigned |= mine
        state |= names.state
    return binds, reads, state, mine


def _code(nb) -> list[tuple[int, object, tuple | None]]:
    cells = [(i, c) for i, c in enumerate(nb["cells"]) if c.get("cell_type") == "code"]
    objects = set()
    for _, c in cells:
        found = _analyze(_source(c))
        objects |= found[3] if found else set()
    return [(i, c, cell_names(_source(c), frozenset(objects))) for i, c in cells]


def _roots(nb) -> set[int]:
    """The code cells grading must run: coding exercises' solutions and checks."""
    from .marking import marking
    coding = {m["exercise"] for c in nb["cells"] if (m := marking(c)) and m.get("role") ==
              "check"}
    return {i for i, c in enumerate(nb["cells"]) if (m := marking(c))
            and m["exercise"] in coding and m.get("role") in ("solution", "check")}


def _exercise_cells(nb) -> set[int]:
    from .marking import marking
    return {i for i, c in enumerate(nb["cells"]) if marking(c)}


def _depends(code, k: int, name: str) -> int | None:
    """The index (in ``code``) of the latest cell above ``code[k]`` that binds ``name``."""
    for j in range(k - 1, -1, -1):
        names = code[j][2]
        if names is not None and name in names[0]:
            return j
    return None


def violations(nb, skipped: set[int] | None = None) -> list[tuple[int, int, str]]:
    """``(skipped cell, later cell, name)``, notebook indices: each later cell that is not
    skipped (nor a derivation's solution, which the student notebook leaves out) and reads
    a name whose latest binding above it is in a skipped cell.  Also ``(i, i,
    "<unparsed>")`` for a skipped cell that does not parse.  ``skipped``: the
    indices to take as skipped (default: the cells marked :data:`SKIP`)."""
    dropped = _exercise_cells(nb) - _roots(nb)   # derivations' solutions: not handed out
    code = [entry for entry in _code(nb) if entry[0] not in dropped]
    if skipped is None:
        skipped = {i for i, c, _ in code if is_skipped(c)}
    found = [(i, i, "<unparsed>") for i, _, names in code if i in skipped and names is None]
    for k, (i, _, names) in enumerate(code):
        if i in skipped or names is None:
            continue
        for name in sorted(names[1] - IGNORED):
            j = _depends(code, k, name)
            if j is not None and code[j][0] in skipped:
                found.append((code[j][0], i, name))
    return found


def plan(nb) -> set[int]:
    """The indices of the cells grading can skip: the largest set the rule allows (see the
    module's docstring)."""
    code = _code(nb)
    exercise = _exercise_cells(nb)
    first = code[0][0] if code else None
    candidates = {i for i, _, names in code
                  if i not in exercise and i != first and names is not None and not names[2]}
    position = {i: k for k, (i, _, _) in enumerate(code)}
    roots = _roots(nb)
    kept = [i for i, _, _ in code if i not in candidates and (i in roots or i not in exercise)]
    seen = set()
    while kept:
        i = kept.pop()
        if i in seen:
            continue
        seen.add(i)
        names = code[position[i]][2]
        if names is None:
            continue
        for name in names[1] - IGNORED:
            j = _depends(code, position[i], name)
            if j is not None:
                if code[j][0] in candidates:
                    candidates.discard(code[j][0])
                kept.append(code[j][0])
    return candidates


def skipped_ids(nb) -> set[str]:
    """The ids of the cells of ``nb`` marked :data:`SKIP` (what the grader takes from an
    instructor's chapter, ``grade --chapters``)."""
    return {c.get("id") for c in nb["cells"] if is_skipped(c) and c.get("id")}


def chapter_skips(paths) -> dict[str, set[str]]:
    """``{chapter name: ids of its skipped cells}`` of the instructor's chapters (the book's,
    or their student versions: they keep the cell ids and the marking), named by their
    file's stem as the student notebooks' manifests name their source."""
    import nbformat
    out = {}
    for path in map(Path, paths):
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        listed = nb.get("metadata", {}).get("normcore", {}).get("classroom")
        name = listed.get("source") if isinstance(listed, dict) else None
        out[name or path.stem] = skipped_ids(nb)
    return out


def with_skips(nb, skip, source: str | None):
    """``nb`` marked as the grader will skip it: unchanged when ``skip`` is ``None`` or has
    no entry for ``source`` (the submission's own marking); else a copy whose code cells are
    marked exactly when their id is in ``skip[source]`` (``skip=False``: none)."""
    if skip is None or skip is True:
        return nb
    ids = set() if skip is False else skip.get(source)
    if ids is None:
        return nb
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        if cell.get("cell_type") == "code":
            mark(cell, cell.get("id") in ids)
    return nb
