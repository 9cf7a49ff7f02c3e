"""For instructors: the catalogue as a table, and each op's signature and reference."""
from __future__ import annotations

import textwrap
from collections.abc import Callable

from .catalogue import CATALOGUE, Misconception
from .ops import REGISTRY, get_op
from .report import WIDTH, wrap


def catalogue(op: str | None = None) -> list[Misconception]:
    """The catalogue entries (for one op, or all), in catalogue order."""
    if op is not None:
        get_op(op)
    return [m for m in CATALOGUE.values() if op is None or op in m.ops]


def catalogue_table(op: str | None = None, markdown: bool = False) -> str:
    """A compact plain-text table of the catalogue: key, ops, description.

    ``markdown=True``: a Markdown table (GitHub's syntax) with the plain-words names too,
    for a page to render (the classroom chapter shows it).
    """
    abbr = {name: impl.abbr for name, impl in REGISTRY.items()}
    if markdown:
        rows = ["| mistake | ops | what it is |", "|---|---|---|"]
        rows += [f"| `{m.key}`: {_md(m.title)} | {_md(' '.join(abbr[o] for o in m.ops))} | "
                 f"{_md(m.description)} |" for m in catalogue(op)]
        legend = ", ".join(f"{_md(v)} = `{k}`" for k, v in abbr.items())
        return "\n".join(rows) + f"\n\nops: {legend}"
    rows = [(m.key, " ".join(abbr[o] for o in m.ops), m.description) for m in catalogue(op)]
    kw = max(len(r[0]) for r in rows)
    ow = max(max(len(r[1]) for r in rows), 3)
    dw = max(WIDTH - kw - ow - 4, 30)
    lines = [f"{'key':<{kw}}  {'ops':<{ow}}  description", f"{'-' * kw}  {'-' * ow}  {'-' * dw}"]
    for key, ops, desc in rows:
        wrapped = textwrap.wrap(desc, dw, break_on_hyphens=False)
        lines.append(f"{key:<{kw}}  {ops:<{ow}}  {wrapped[0]}")
        lines += [f"{'':<{kw}}  {'':<{ow}}  {w}" for w in wrapped[1:]]
    legend = ", ".join(f"{v} = {k}" for k, v in abbr.items())
    return "\n".join(lines) + "\n" + wrap(f"ops: {legend}")


def _md(text: str) -> str:
    """``text`` with Markdown's special characters escaped (a table cell of plain text)."""
    for ch in "\\`*_[]<>#|$~":
        text = text.replace(ch, "\\" + ch)
    return text


def print_catalogue(op: str | None = None) -> None:
    """Print :func:`catalogue_table`."""
    print(catalogue_table(op))


def signature(op: str) -> str:
    """How :func:`check` calls the student's function for ``op``."""
    return get_op(op).call_text


def reference(op: str, convention: str = "original") -> Callable:
    """A correct function with the student's signature, built on :mod:`normcore.functional`
    (what :func:`check` compares against); ``convention`` for ``weight_standardize``."""
    impl = get_op(op)
    given = {"convention": convention} if "convention" in impl.option_names else {}
    return impl.solution(impl.parse_options(given))
