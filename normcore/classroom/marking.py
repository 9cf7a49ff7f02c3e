"""Reading the exercise marking of a chapter notebook (the convention of the book).

Each exercise is a run of cells whose metadata carries ``"normcore": {"exercise": LABEL,
"role": ROLE}``:

==================  ======  =============================================================
role                cell    content
==================  ======  =============================================================
``statement``       md      the ````{exercise}```` directive with ``:label: LABEL``; the
                            metadata also carries ``"points": <int>``, may carry
                            ``"rubric": {"<property>": <int>, ...}``, how the points
                            split (:mod:`normcore.exercises.credit`; default: all on a
                            correct answer) and, for a coding exercise, ``"rules": [...]``,
                            what it forbids (:mod:`normcore.exercises.rules`; the statement
                            says it in words)
``solution-start``  md      ````{solution-start} LABEL```` (``:class: dropdown``), prose
``solution``        code    the solution; the code a student writes stands between the
                            lines ``### BEGIN SOLUTION`` and ``### END SOLUTION``
``solution-end``    md      ````{solution-end}````
``check``           code    coding exercises: ``report = exercises.check("<op>", <fn>)``,
                            ``print(report)``, ``assert report.passed``
==================  ======  =============================================================

:func:`read_exercises` returns one :class:`Exercise` per label, and raises
:class:`MarkingError` with the cell number when the marking breaks the convention.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from normcore.exercises.credit import RubricError, default_rubric, validate

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
ROLES = ("statement", "solution-start", "solution", "solution-end", "check")

#: The check cell, exactly as the convention writes it (whitespace aside).
CHECK_RE = re.compile(
    r'^report\s*=\s*exercises\.check\(\s*"(?P<op>[a-z_]+)"\s*,\s*(?P<fn>[A-Za-z_]\w*)'
    r'(?P<options>\s*,[^\n]*)?\)\s*\nprint\(report\)\s*\nassert report\.passed\s*$')
_DEF_RE = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(", re.M)


class MarkingError(ValueError):
    """The exercise marking of a notebook breaks the convention."""


@dataclass
class Exercise:
    """One marked exercise: its label, points and the indices of its cells."""

    label: str
    points: int = 0
    statement: int | None = None
    solution_start: int | None = None
    solutions: list[int] = field(default_factory=list)
    solution_end: int | None = None
    check: int | None = None
    #: For a coding exercise: the op given to ``exercises.check``, the function's name and
    #: the options of the call as source text (``", ndims=(4,)"``), else ``None``.
    op: str | None = None
    function: str | None = None
    options: str = ""
    #: What the exercise forbids (:mod:`normcore.exercises.rules`), from the statement's
    #: marking ``"rules": [...]``; the grader passes them to ``exercises.check``.
    rules: tuple[str, ...] = ()
    #: How the points split, as the statement's metadata gives it (``None``: not given).
    rubric: dict | None = None

    @property
    def grading(self) -> dict:
        """The rubric a grader applies: the given one, or all points on a correct answer."""
        return self.rubric if self.rubric is not None else default_rubric(self.points)

    @property
    def coding(self) -> bool:
        return self.check is not None

    @property
    def cells(self) -> list[int]:
        """Every cell of the exercise, in notebook order."""
        found = [self.statement, self.solution_start, *self.solutions, self.solution_end,
                 self.check]
        return sorted(i for i in found if i is not None)


def marking(cell) -> dict | None:
    """The ``normcore`` marking of a cell, or ``None``."""
    mark = cell.get("metadata", {}).get("normcore")
    return mark if isinstance(mark, dict) and "exercise" in mark else None


def source_text(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def solution_regions(source: str) -> list[tuple[int, int]]:
    """``(begin, end)`` line indices of each ``### BEGIN/END SOLUTION`` pair (inclusive)."""
    lines = source.split("\n")
    regions, begin = [], None
    for i, line in enumerate(lines):
        tag = line.strip()
        if tag == BEGIN:
            if begin is not None:
                raise MarkingError(f"line {i + 1}: {BEGIN} inside another solution")
            begin = i
        elif tag == END:
            if begin is None:
                raise MarkingError(f"line {i + 1}: {END} without {BEGIN}")
            regions.append((begin, i))
            begin = None
    if begin is not None:
        raise MarkingError(f"line {begin + 1}: {BEGIN} without {END}")
    return regions


def solution_lines(source: str) -> list[str]:
    """The lines between the markers (the code a student writes)."""
    lines = source.split("\n")
    return [line for b, e in solution_regions(source) for line in lines[b + 1:e]]


def has_solutions(nb) -> bool:
    """Whether ``nb`` keeps its solution cells (a copy without solutions does not, see
    :mod:`.nosolutions`)."""
    return any((marking(c) or {}).get("role") == "solution" for c in nb["cells"])


def read_statements(nb) -> list[Exercise]:
    """The exercises of a copy without solutions (:mod:`.nosolutions`), from their statements
    alone: label, points, the statement's index, and the check's op and function, which the
    copy keeps in the statement's marking."""
    return [Exercise(m["exercise"], m.get("points", 0), statement=i, op=m.get("op"),
                     function=m.get("function"), rules=_rules(m, f"cell {i}"),
                     rubric=m.get("rubric"))
            for i, m in enumerate(map(marking, nb["cells"])) if m and m.get("role") == "statement"]


def _rules(mark: dict, where: str) -> tuple[str, ...]:
    """The statement's ``"rules"``, checked (:func:`normcore.exercises.rules.parse_rules`)."""
    from normcore.exercises.rules import RuleError, parse_rules
    rules = mark.get("rules", [])
    if not isinstance(rules, list):
        raise MarkingError(f"{where}: 'rules' must be a list of strings, got {rules!r}")
    try:
        return parse_rules(rules)
    except RuleError as e:
        raise MarkingError(f"{where}: {e}") from None


def exercises_in(nb, name: str = "notebook") -> list[Exercise]:
    """The exercises of a chapter or of a copy of it without solutions: :func:`read_exercises`
    where the solutions are there, :func:`read_statements` where they are not."""
    return read_exercises(nb, name) if has_solutions(nb) else read_statements(nb)


def read_exercises(nb, name: str = "notebook") -> list[Exercise]:
    """The marked exercises of ``nb`` (a notebook dict), in notebook order."""
    exercises: dict[str, Exercise] = {}
    for i, cell in enumerate(nb["cells"]):
        mark = marking(cell)
        if mark is None:
            continue
        where = f"{name}, cell {i}"
        label, role = mark["exercise"], mark.get("role")
        if role not in ROLES:
            raise MarkingError(f"{where}: role {role!r}; expected one of {', '.join(ROLES)}")
        ex = exercises.setdefault(label, Exercise(label))
        kind = "code" if role in ("solution", "check") else "markdown"
        if cell["cell_type"] != kind:
            raise MarkingError(f"{where}: a {role} cell must be a {kind} cell")
        src = source_text(cell)
        if role == "statement":
            if ex.statement is not None:
                raise MarkingError(f"{where}: a second statement for {label!r}")
            if f":label: {label}" not in src:
                raise MarkingError(f"{where}: the statement has no ':label: {label}'")
            points = mark.get("points")
            if not isinstance(points, int) or points < 0:
                raise MarkingError(f"{where}: the statement needs 'points', an int >= 0")
            ex.statement, ex.points, ex.rubric = i, points, mark.get("rubric")
            ex.rules = _rules(mark, where)
        elif role == "solution-start":
            if f"{{solution-start}} {label}" not in src:
                raise MarkingError(f"{where}: expected '{{solution-start}} {label}'")
            ex.solution_start = i
        elif role == "solution":
            try:
                regions = solution_regions(src)
            except MarkingError as e:
                raise MarkingError(f"{where}: {e}") from None
            if not regions:
                raise MarkingError(f"{where}: a solution cell without {BEGIN}/{END}")
            ex.solutions.append(i)
        elif role == "solution-end":
            ex.solution_end = i
        else:
            m = CHECK_RE.match(src.strip())
            if m is None:
                raise MarkingError(
                    f"{where}: the check cell must read exactly\n"
                    f'report = exercises.check("<op>", <function>)\nprint(report)\n'
                    f"assert report.passed")
            ex.check, ex.op, ex.function = i, m["op"], m["fn"]
            ex.options = m["options"] or ""
    for ex in exercises.values():
        _validate(ex, nb, name)
    return sorted(exercises.values(), key=lambda e: e.statement)


def _validate(ex: Exercise, nb, name: str) -> None:
    where = f"{name}, exercise {ex.label!r}"
    missing = [r for r, v in (("statement", ex.statement), ("solution-start", ex.solution_start),
                              ("solution", ex.solutions), ("solution-end", ex.solution_end))
               if v is None or v == []]
    if missing:
        raise MarkingError(f"{where}: no {', '.join(missing)} cell")
    order = [ex.statement, ex.solution_start, *ex.solutions, ex.solution_end]
    if ex.check is not None:
        order.append(ex.check)
    if order != sorted(order):
        raise MarkingError(f"{where}: cells out of order (statement, solution-start, "
                           f"solution, solution-end, check)")
    if ex.rubric is not None:
        try:
            validate(ex.rubric, ex.op, ex.points)
        except RubricError as e:
            raise MarkingError(f"{where}: {e}") from None
    if ex.function is not None:
        defined = {f for i in ex.solutions for f in _DEF_RE.findall(source_text(nb["cells"][i]))}
        if ex.function not in defined:
            raise MarkingError(f"{where}: the check calls {ex.function}, which no solution "
                               f"cell defines")
