"""The chapters' MyST markdown rewritten as plain CommonMark and MathJax math.

The book's markdown is MyST: Jupyter Book renders it, and so does JupyterLab with the
``jupyterlab-myst`` extension, but plain Jupyter shows its directives and roles as raw text.
A student notebook is opened in plain Jupyter, so :func:`to_plain` rewrites each markdown
cell with what the built book shows in its place:

==============================================  ===============================================
MyST                                            plain markdown
==============================================  ===============================================
````{exercise} Title```` with ``:label: ex-a``  ``**Exercise 2.1: Title** (`ex-a`)`` and the body
````{admonition} Title````, ````{note}````      a blockquote, ``> **Title**``, holding the body
````{math}```` (``:label: x``)                  ``$$ ... $$`` (``\\tag{3.1}``)
``$$ ... $$ (x)``                               ``$$ ... \\tag{3.1} $$``
``(label)=`` on its own line                    removed
{ref}`text <label>`, {ref}`label`               the text, or the section's heading; a link to
                                                the other chapter's notebook
{numref}`fig-a`, {eq}`x`                        ``Fig. 1.2``, ``(3.1)`` (numbered as the book)
{doc}`06_group_norm`                            ``[6. GroupNorm ...](06_group_norm.ipynb)``
{cite}`a,b`, {cite:t}`a`                        ``(Author, 2018; ...)``, ``Author (2018)``
{math}`x`                                       ``$x$``
{py:func}`F.rms_norm <normcore...rms_norm>`,    ```F.rms_norm``` (the text, as code: the API
[`F.rms_norm`](#normcore.functional.rms_norm)   reference is the book's, not the notebook's)
==============================================  ===============================================

``$`` and ``$$`` math stays as it is (Jupyter's MathJax renders it).  The numbers of exercises,
equations and figures are the book's: chapter ``NN_name`` is chapter NN, and they count in
order within it.  Whatever is not in the table (an unknown directive, role or label) is left as
it is and named in the list :func:`to_plain` returns, so that a new construct is noticed.
:func:`book_index` reads what the rewriting looks up: the ``(label)=`` targets and headings of
every chapter, the labels of directives, equations and figures, and the bibliography.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

#: Directives rendered as a blockquote with a bold title (the title when none is given).
ADMONITIONS = {"note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important",
               "warning": "Warning", "caution": "Caution", "attention": "Attention",
               "danger": "Danger", "error": "Error", "seealso": "See also",
               "admonition": ""}
_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}[ \t]*"
                   r"(?P<arg>.*)$")
_PLAIN_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?!.*\{)")
_OPTION = re.compile(r"^\s*:(?P<key>[\w-]+):\s*(?P<value>.*)$")
_TARGET = re.compile(r"^\s*\((?P<label>[^()\s]+)\)=\s*$")
_LABELLED_MATH = re.compile(r"^\$\$\s*\((?P<label>[^()\s]+)\)\s*$")
_CODE_SPAN = re.compile(r"(?P<role>\{(?P<name>[\w:-]+)\})?(?P<ticks>`+)(?P<body>.+?)(?P=ticks)",
                        re.S)
# a link to an entry of the book's API reference (tools/api_links.py): its text, as code
_API_LINK = re.compile(r"\[(?P<text>`[^`\n]+`)\]\(#normcore\.[\w.]+\)")
_EXPLICIT = re.compile(r"^(?P<text>.*?)\s*<(?P<label>[^<>]+)>$", re.S)
_HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*#*\s*$")


@dataclass
class Target:
    """Where a label points: its chapter (a notebook's stem), its text and its kind
    (``section``, ``exercise``, ``admonition``, ``equation`` or ``figure``); equations,
    figures and exercises carry the book's number (``3.1``)."""

    chapter: str
    text: str
    kind: str
    number: str = ""


@dataclass
class BookIndex:
    """What :func:`to_plain` looks up: labels, chapter titles, bibliography entries."""

    targets: dict[str, Target] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)
    #: stem -> file name (``06_group_norm.ipynb``, ``classroom.md``)
    files: dict[str, str] = field(default_factory=dict)
    #: key -> (authors as cited, year)
    citations: dict[str, tuple[str, str]] = field(default_factory=dict)


def _chapter_number(stem: str) -> str:
    m = re.match(r"(\d+)_", stem)
    return f"{int(m[1])}." if m else ""


def _index_notebook(nb, stem: str, index: BookIndex) -> None:
    counts = {"exercise": 0, "equation": 0, "figure": 0}
    prefix = _chapter_number(stem)

    def number(kind):
        counts[kind] += 1
        return f"{prefix}{counts[kind]}"

    for cell in nb.cells:
        if cell.cell_type == "code":
            fig = cell.get("metadata", {}).get("mystnb", {}).get("figure")
            if isinstance(fig, dict) and fig.get("name"):
                index.targets[fig["name"]] = Target(stem, fig.get("caption", ""), "figure",
                                                    number("figure"))
            continue
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.split("\n")
        for i, line in enumerate(lines):
            head = _HEADING.match(line)
            if head and stem not in index.titles and line.startswith("# "):
                index.titles[stem] = head["text"]
            target = _TARGET.match(line)
            if target:
                nxt = next((m for m in map(_HEADING.match, lines[i + 1:i + 3]) if m), None)
                index.targets[target["label"]] = Target(stem, nxt["text"] if nxt else "",
                                                        "section")
            math = _LABELLED_MATH.match(line)
            if math:
                index.targets[math["label"]] = Target(stem, "", "equation", number("equation"))
            opened = _OPEN.match(line)
            if opened:
                name, arg = opened["name"], opened["arg"].strip()
                options = _options(lines[i + 1:])[0]
                label = options.get("label") or options.get("name")
                kind = ("exercise" if name == "exercise" else "equation" if name == "math"
                        else "admonition")
                # the book numbers every exercise, and the equations that have a label
                num = number(kind) if kind == "exercise" or (kind == "equation" and label) else ""
                if label:
                    index.targets[label] = Target(stem, arg, kind, num)


def _people(persons) -> str:
    from latexcodec import codec  # noqa: F401  (registers the "ulatex" codec)
    names = ["".join(p.last_names).replace("{", "").replace("}", "") for p in persons]
    names = [codecs.decode(n, "ulatex") if "\\" in n else n for n in names]
    if len(names) > 2:
        return f"{names[0]} et al."
    return " and ".join(names)


def read_bibliography(path: str | Path) -> dict[str, tuple[str, str]]:
    """``key -> (authors as cited, year)`` from a BibTeX file (``Ioffe and Szegedy``,
    ``Wu and He``, ``Ba et al.``: the book's author-year style)."""
    from pybtex.database import parse_file
    data = parse_file(str(path), bib_format="bibtex")
    out = {}
    for key, entry in data.entries.items():
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        who = _people(persons) if persons else entry.fields.get("title", key)
        out[key] = (who, entry.fields.get("year", "n.d."))
    return out


def book_index(chapters: str | Path, bibliography: str | Path | None = None) -> BookIndex:
    """The index of the book whose chapters (``*.ipynb``) are in the folder ``chapters``;
    ``bibliography`` defaults to ``assets/references.bib`` beside that folder."""
    chapters = Path(chapters).resolve()
    if not chapters.is_dir():
        raise ValueError(f"{chapters} is not a folder of chapters: give the book's chapters/")
    index = BookIndex()
    for path in sorted(chapters.glob("*.ipynb")):
        _index_notebook(nbformat.read(path, as_version=4), path.stem, index)
        index.files[path.stem] = path.name
    for path in sorted(chapters.glob("*.md")):   # pages such as classroom.md: targets only
        text = path.read_text(encoding="utf-8")
        cell = nbformat.v4.new_markdown_cell(text)
        _index_notebook(nbformat.v4.new_notebook(cells=[cell]), path.stem, index)
        index.files.setdefault(path.stem, path.name)
        index.targets.update({k: Target(path.stem + ".md", t.text, t.kind, t.number)
                              for k, t in index.targets.items() if t.chapter == path.stem})
    bib = Path(bibliography) if bibliography else chapters.parent / "assets" / "references.bib"
    if bib.is_file():
        index.citations = read_bibliography(bib)
    elif bibliography:
        raise ValueError(f"{bib}: no such bibliography; give the book's references.bib")
    return index


def _options(lines: list[str]) -> tuple[dict[str, str], int]:
    """The ``:key: value`` options at the top of a directive's body, and how many lines."""
    options, n = {}, 0
    for line in lines:
        m = _OPTION.match(line)
        if not m:
            break
        options[m["key"]] = m["value"].strip()
        n += 1
    return options, n


class _Rewriter:
    def __init__(self, index: BookIndex, chapter: str, labels: dict[str, str]):
        self.index, self.chapter, self.unknown = index, chapter, []
        self.labels = labels   # exercise label -> note after it (points)

    # --- blocks -----------------------------------------------------------------------
    def block(self, text: str) -> str:
        lines, out, prose, i = text.split("\n"), [], [], 0

        def flush():   # roles are rewritten in prose only, never in a code block
            if prose:
                out.append(self.inline("\n".join(prose)))
                prose.clear()
        while i < len(lines):
            line = lines[i]
            opened, plain = _OPEN.match(line), _PLAIN_FENCE.match(line)
            if plain:   # a code block: copied untouched to its closing fence
                flush()
                j = self._close(lines, i, plain["fence"])
                out.append("\n".join(lines[i:j + 1]))
                i = j + 1
            elif opened:
                flush()
                j = self._close(lines, i, opened["fence"])
                options, n = _options(lines[i + 1:j])
                body = "\n".join(lines[i + 1 + n:j]).strip("\n")
                out.append(self.directive(opened["name"], opened["arg"].strip(), options,
                                          body, "\n".join(lines[i:j + 1])))
                i = j + 1
            elif _TARGET.match(line):
                i += 1
                if i < len(lines) and not lines[i].strip() and (not prose or not prose[-1]):
                    i += 1   # no blank line left where the target stood
            elif _LABELLED_MATH.match(line):
                prose.append(self.tag(_LABELLED_MATH.match(line)["label"]) + "$$")
                i += 1
            else:
                prose.append(line)
                i += 1
        flush()
        return "\n".join(out)

    @staticmethod
    def _close(lines, start, fence) -> int:
        char, n = fence[0], len(fence)
        for j in range(start + 1, len(lines)):
            s = lines[j].strip()
            if s and set(s) == {char} and len(s) >= n:
                return j
        return len(lines) - 1

    def tag(self, label: str) -> str:
        t = self.index.targets.get(label)
        return f"\\tag{{{t.number}}}\n" if t and t.number else ""

    def directive(self, name, arg, options, body, raw) -> str:
        if name == "exercise":
            label = options.get("label", "")
            t = self.index.targets.get(label)
            number = f" {t.number}" if t and t.chapter == self.chapter and t.number else ""
            title = f"**Exercise{number}{': ' + self.inline(arg) if arg else ''}**"
            tail = f" (`{label}`{self.labels.get(label, '')})" if label else ""
            return f"{title}{tail}\n\n{self.block(body)}"
        if name in ADMONITIONS:
            title = self.inline(arg) if arg else ADMONITIONS[name] or "Note"
            quoted = "\n".join(f"> {x}" if x else ">" for x in self.block(body).split("\n"))
            return f"> **{title}**\n>\n{quoted}"
        if name == "math":
            label = options.get("label", "")
            return f"$$\n{body}\n{self.tag(label) if label else ''}$$"
        self.unknown.append(f"directive {{{name}}}")
        return raw

    # --- roles ------------------------------------------------------------------------
    def inline(self, text: str) -> str:
        text = _API_LINK.sub(lambda m: m["text"], text)

        def sub(m):
            if not m["role"]:
                return m[0]
            new = self.role(m["name"], m["body"])
            if new is None:
                self.unknown.append(f"{{{m['name']}}}`{m['body']}`")
                return m[0]
            return new
        return _CODE_SPAN.sub(sub, text)

    def role(self, name: str, body: str) -> str | None:
        explicit = _EXPLICIT.match(body)
        text, label = (explicit["text"], explicit["label"]) if explicit else (None, body.strip())
        if name == "math":
            return f"${body}$"
        if name.startswith("py:"):
            return f"`{text or label.lstrip('~')}`"
        if name in ("cite", "cite:p", "cite:t"):
            return self.cite(label, textual=name == "cite:t")
        if name == "doc":
            stem = label.removesuffix(".ipynb").removesuffix(".md").split("/")[-1]
            if stem not in self.index.titles and text is None:
                return None
            shown = text or self.index.titles[stem]
            return f"[{shown}]({self.index.files.get(stem, stem + '.ipynb')})"
        t = self.index.targets.get(label)
        if t is None:
            return None
        if name == "eq":
            return text or f"({t.number})"
        if name == "numref":
            shown = (text.replace("%s", t.number).replace("{number}", t.number) if text
                     else f"Fig. {t.number}" if t.kind == "figure" and t.number
                     else t.text)
        elif name == "ref":
            shown = text or t.text or (f"Exercise {t.number}" if t.kind == "exercise" else "")
        else:
            return None
        if not shown:
            return None
        if t.chapter == self.chapter:
            return shown
        target = t.chapter if t.chapter.endswith(".md") else f"{t.chapter}.ipynb"
        return f"[{shown}]({target})"

    def cite(self, keys: str, textual: bool) -> str | None:
        found = [self.index.citations.get(k.strip()) for k in keys.split(",")]
        if not found or None in found:
            return None
        if textual:
            return "; ".join(f"{who} ({year})" for who, year in found)
        return "(" + "; ".join(f"{who}, {year}" for who, year in found) + ")"


def to_plain(source: str, index: BookIndex, chapter: str = "",
             notes: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """``source`` (MyST markdown of the chapter ``chapter``, a notebook's stem) as plain
    markdown, and the constructs left as they were (unknown). ``notes`` maps an exercise's
    label to text added after it in its heading (``", 2 points"``)."""
    rewriter = _Rewriter(index, chapter, notes or {})
    return rewriter.block(source), rewriter.unknown


#: MyST left in plain markdown: a directive's fence, a role, a ``(label)=`` target, a
#: labelled ``$$``.
LEFTOVER = re.compile(r"^ {0,3}(`{3,}|:{3,})\{|\{[\w:-]+\}`|^\s*\([^()\s]+\)=\s*$|^\$\$[ \t]*\(",
                      re.M)


def myst_left(text: str) -> list[str]:
    """The MyST constructs in ``text`` (for tests and checks): empty for plain markdown."""
    return [m[0] for m in LEFTOVER.finditer(text)]


__all__ = ["BookIndex", "Target", "book_index", "read_bibliography", "to_plain", "myst_left",
           "ADMONITIONS"]
