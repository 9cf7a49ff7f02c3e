"""The book's notation: generate chapters/notation.md from chapters/notation.yml, and find the
symbols a chapter's math uses.

    python tools/notation.py            # write chapters/notation.md
    python tools/notation.py --check    # exit 1 if chapters/notation.md is out of date
    python tools/notation.py --symbols  # list every symbol each chapter's math uses

A *symbol* is a single Latin letter, a Greek letter command, `\\ell`, or a `\\mathcal`,
`\\mathbb`, `\\mathbf` letter, together with its decorations (`\\hat`, `\\tilde`, `\\bar`,
`\\overline`, a prime, a superscript `\\ast`) and a `\\text`/`\\mathrm` subscript: `\\mu_{pop}`
is not `\\mu`. Index subscripts (`x_i`, `\\mathbf{W}_c`, `x_{l+1}`) are symbols in their own
right, unless the table defines the compound (`K_A`, `k_h`). Operators and function names
(`\\mathrm{E}`, `\\sqrt`, `\\sum`, `\\log`, `\\mathrm{LN}`, ...) are not symbols; the ones
written with `\\mathrm`/`\\operatorname` or as plain letters must be in the data's
`operators` list. `\\text{...}` outside a subscript is prose and is skipped.

Keys are written as `\\hat{x}`, `\\mu_{pop}`, `W'`, `t^*`, `\\mathcal{L}`, `\\mathbf{W}`,
`\\hat{\\mathbf{W}}'` (a decoration and a prime on a bold letter), `K_A`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
DATA = CHAPTERS / "notation.yml"
PAGE = CHAPTERS / "notation.md"

GREEK = set(
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu "
    "xi pi varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta "
    "Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega ell".split()
)
DECORATIONS = {
    "hat": "hat", "widehat": "hat", "tilde": "tilde", "widetilde": "tilde",
    "bar": "bar", "overline": "bar", "dot": "dot", "vec": "vec",
}
ALPHABETS = {"mathcal", "mathbb", "mathbf", "boldsymbol", "bm"}
WORDS = {"mathrm", "operatorname", "text", "textrm", "textit", "texttt", "mathit", "textsf",
         "mathsf", "textbf"}
STARS = {"\\ast", "*", "\\star", "\\prime"}


@dataclass(frozen=True)
class Use:
    key: str      # the symbol, as a key of the data (see the module's docstring)
    math: str     # the math it occurs in, for the report


# ---------------------------------------------------------------------------- LaTeX reader

class _Reader:
    """Reads one math string and collects its symbols (see the module's docstring)."""

    def __init__(self, tex: str, operators: set[str], compounds: set[str]):
        self.s = tex
        self.ops = operators
        self.compounds = compounds
        self.found: list[str] = []
        self.unknown_words: list[str] = []

    # -- small helpers
    def _skip_ws(self, p: int) -> int:
        while p < len(self.s) and self.s[p].isspace():
            p += 1
        return p

    def _command(self, p: int) -> tuple[str, int]:
        """At a backslash: the command's name (letters, or one other char) and the end."""
        q = p + 1
        if q < len(self.s) and self.s[q].isalpha():
            while q < len(self.s) and self.s[q].isalpha():
                q += 1
            return self.s[p + 1:q], q
        return self.s[p + 1:q + 1], q + 1

    def _arg(self, p: int) -> tuple[str, int]:
        """One argument: a braced group's content, a command, or one character."""
        p = self._skip_ws(p)
        if p >= len(self.s):
            return "", p
        if self.s[p] == "{":
            depth, q = 0, p
            while q < len(self.s):
                c = self.s[q]
                if c == "\\":
                    q += 2
                    continue
                if c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                    if depth == 0:
                        return self.s[p + 1:q], q + 1
                q += 1
            return self.s[p + 1:], len(self.s)
        if self.s[p] == "\\":
            name, q = self._command(p)
            return "\\" + name, q
        return self.s[p], p + 1

    def _sub(self, tex: str) -> None:
        r = _Reader(tex, self.ops, self.compounds)
        r.run()
        self.found += r.found
        self.unknown_words += r.unknown_words

    @staticmethod
    def _word(arg: str) -> str | None:
        """`\\text{pop}` / `\\mathrm{DN}` / `\\mathrm DN` as an identity part, else None."""
        m = re.fullmatch(r"\s*\\(?:text|mathrm|textrm|operatorname|mathit|textsf|mathsf)"
                         r"\s*\{\s*([^{}]*?)\s*\}\s*", arg)
        return m.group(1).replace(" ", "") if m else None

    # -- a symbol and what follows it
    def _postfix(self, key: str, p: int) -> int:
        """Primes, `^\\ast`, `_{\\text{..}}` become part of `key`; other sub-/superscripts
        are read as math of their own. Records the symbol and returns the end."""
        subs: list[str] = []
        sups: list[str] = []
        while True:
            q = self._skip_ws(p)
            if q < len(self.s) and self.s[q] == "'":
                key += "'"
                p = q + 1
            elif q < len(self.s) and self.s[q] in "_^":
                kind = self.s[q]
                arg, p = self._arg(q + 1)
                if arg[1:] in WORDS:                 # x_\text{out}: the word is the next arg
                    word, p = self._arg(p)
                    arg = arg + "{" + word + "}"
                if kind == "^" and arg.strip() in STARS:
                    key += "^*"
                elif kind == "^":
                    sups.append(arg)
                elif self._word(arg) is not None:
                    key += "_{" + self._word(arg) + "}"
                else:
                    compact = arg.replace(" ", "")
                    cand = key + ("_" + compact if len(compact) == 1 else "_{" + compact + "}")
                    if cand in self.compounds:
                        key = cand
                    else:
                        subs.append(arg)
            else:
                break
        self.found.append(key)
        for t in subs + sups:
            self._sub(t)
        return p

    def run(self) -> None:
        s, p = self.s, 0
        while p < len(s):
            c = s[p]
            if c == "\\":
                name, q = self._command(p)
                if name in DECORATIONS:
                    arg, q = self._arg(q)
                    inner = _Reader(arg, self.ops, self.compounds)
                    inner.run()
                    if len(inner.found) == 1:
                        base = inner.found[0]
                        p = self._postfix(f"\\{DECORATIONS[name]}{{{base}}}", q)
                    else:   # a decorated expression: read its parts
                        self.found += inner.found
                        self.unknown_words += inner.unknown_words
                        p = q
                elif name in GREEK:
                    p = self._postfix("\\" + name, q)
                elif name in ALPHABETS:
                    arg, q = self._arg(q)
                    key = "\\" + name + "{" + arg.strip() + "}"
                    if key in self.ops:
                        p = q
                    else:
                        p = self._postfix(key, q)
                elif name in WORDS:
                    arg, q = self._arg(q)
                    word = arg.strip()
                    if name.startswith("text"):
                        p = q                        # prose inside math
                    elif word.replace(" ", "") in self.ops:
                        p = q
                    elif re.fullmatch(r"[A-Za-z]", word):
                        p = self._postfix(word, q)   # \mathrm{x}: a letter set upright
                    else:
                        self.unknown_words.append(word)
                        p = q
                elif name in {"begin", "end", "label", "tag", "color", "href", "ref",
                              "eqref", "cite", "hspace", "vspace", "mbox", "textcolor"}:
                    _, p = self._arg(q)
                    if name == "textcolor":
                        _, p = self._arg(p)
                else:
                    p = q            # an operator, a relation, spacing, a delimiter
            elif c.isalpha() and c.isascii():
                q = p
                while q < len(s) and s[q].isalpha() and s[q].isascii():
                    q += 1
                run = s[p:q]
                if run in self.ops and (len(run) > 1 or re.match(
                        r"\s*(\\[bB]igg?l?|\\left)?\s*\[", s[q:])):   # E[x], LN(x)
                    p = q
                    continue
                for letter in run[:-1]:
                    self.found.append(letter)
                p = self._postfix(run[-1], q)
            elif c in "_^":
                arg, p = self._arg(p + 1)    # a script on something that is no symbol
                if not (c == "^" and arg.strip() in STARS):
                    self._sub(arg)
            else:
                p += 1


def symbols_in(tex: str, operators: set[str], compounds: set[str] = frozenset()
               ) -> tuple[list[str], list[str]]:
    """The symbols of one math string, and the `\\mathrm` words that are neither a letter
    nor a listed operator."""
    r = _Reader(tex, set(operators), set(compounds))
    r.run()
    return r.found, r.unknown_words


# ---------------------------------------------------------------------------- markdown reader

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(.*)$")


def math_in_markdown(text: str) -> list[str]:
    """Every piece of math in a MyST markdown text: `$...$`, `$$...$$`, ```{math} blocks and
    {math}`...` roles. Code fences are skipped; directive fences (admonitions, figures) are
    read as markdown."""
    out: list[str] = []
    lines = text.split("\n")
    prose: list[str] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        ticks, info = m.group(2), m.group(3).strip()
        close = re.compile(r"^\s*" + re.escape(ticks[0]) + "{" + str(len(ticks)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = lines[i + 1:j]
        directive = re.match(r"\{([\w:-]+)\}", info)
        if directive and directive.group(1) == "math":
            body = [b for b in body if not re.match(r"^\s*:\w[\w-]*:", b)]
            out.append("\n".join(body))
        elif directive and directive.group(1) not in {"code-cell", "code", "code-block"}:
            out += math_in_markdown("\n".join(body))
        prose.append("")     # keep paragraphs apart
        i = j + 1
    text = "\n".join(prose)
    text = re.sub(r"\{math\}`([^`]*)`", lambda m: out.append(m.group(1)) or " ", text)
    text = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", " ", text, flags=re.S)    # code spans
    text = text.replace("\\$", " ")
    text = re.sub(r"\$\$(.+?)\$\$", lambda m: out.append(m.group(1)) or " ", text, flags=re.S)
    for para in re.split(r"\n\s*\n", text):
        out += re.findall(r"(?<!\$)\$(?!\$)([^$]+?)(?<!\\)\$(?!\$)", para)
    return out


def chapter_sources(root: Path = CHAPTERS) -> dict[str, str]:
    """The markdown of every chapter (notebook markdown cells, and *.md but this page)."""
    out = {}
    for path in sorted(root.glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "markdown"]
        out[path.stem] = "\n\n".join(
            "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells)
    for path in sorted(root.glob("*.md")):
        if path.name != PAGE.name:
            out[path.stem] = path.read_text(encoding="utf-8")
    return out


# ---------------------------------------------------------------------------- the data

def load(path: Path = DATA) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def defined(data: dict) -> dict[str, list[str]]:
    """Every key the table defines, with the meanings (one per row that defines it)."""
    out: dict[str, list[str]] = {}
    for section in data["sections"]:
        for row in section["rows"]:
            for key in row["defines"]:
                out.setdefault(key, []).append(row["meaning"])
    return out


def local(data: dict) -> dict[str, dict[str, str]]:
    """Per chapter, the symbols that stay inside one argument: key -> meaning."""
    out: dict[str, dict[str, str]] = {}
    for chapter, entry in (data.get("local") or {}).items():
        out[chapter] = {}
        for row in entry["symbols"]:
            for key in row["defines"]:
                out[chapter][key] = row["meaning"]
    return out


def compounds(data: dict) -> set[str]:
    keys = set(defined(data))
    for entry in local(data).values():
        keys |= set(entry)
    return {k for k in keys if "_" in k}


@dataclass(frozen=True)
class Violation:
    chapter: str
    symbol: str
    context: str

    def __str__(self) -> str:
        return f"{self.chapter}: {self.symbol}   in  ${self.context}$"


def check_text(chapter: str, text: str, data: dict) -> list[Violation]:
    """The symbols of `text`'s math that neither the table nor the chapter's list defines,
    and the `\\mathrm` words that are not operators; one violation per (symbol, math)."""
    ops = set(data["operators"])
    known = set(defined(data)) | set(local(data).get(chapter, {}))
    comp = compounds(data)
    out: list[Violation] = []
    seen = set()
    for math in math_in_markdown(text):
        found, words = symbols_in(math, ops, comp)
        context = " ".join(math.split())
        if len(context) > 90:
            context = context[:87] + "..."
        for key in found:
            if key not in known and (key, context) not in seen:
                seen.add((key, context))
                out.append(Violation(chapter, key, context))
        for word in words:
            if ("\\mathrm{" + word + "}", context) not in seen:
                seen.add(("\\mathrm{" + word + "}", context))
                out.append(Violation(chapter, "\\mathrm{" + word + "}", context))
    return out


def check_misuses(chapter: str, text: str, data: dict) -> list[Violation]:
    """Uses of a defined letter in a meaning the table gives to another symbol (the data's
    `misuses`: a regular expression on the math, and what to write instead)."""
    out: list[Violation] = []
    for math in math_in_markdown(text):
        for rule in data.get("misuses") or []:
            if re.search(rule["pattern"], math):
                context = " ".join(math.split())[:90]
                out.append(Violation(chapter, f"{rule['symbol']} ({rule['why']})", context))
    return out


def check_chapters(data: dict, root: Path = CHAPTERS) -> list[Violation]:
    out: list[Violation] = []
    for chapter, text in chapter_sources(root).items():
        out += check_text(chapter, text, data) + check_misuses(chapter, text, data)
    return out


# ---------------------------------------------------------------------------- the page

def _cell(text: str) -> str:
    return (text or "").strip().replace("|", "\\|").replace("\n", " ")


def render(data: dict) -> str:
    parts = [data["header"].strip(), ""]
    for section in data["sections"]:
        parts += [f"## {section['title']}", ""]
        parts += ["| symbol | meaning | PyTorch name | first appears |", "|---|---|---|---|"]
        for row in section["rows"]:
            cells = [row["tex"], _cell(row["meaning"]), row.get("torch"), row.get("first")]
            parts.append("|" + "|".join(f" {c} " if c else " " for c in cells) + "|")
        parts.append("")
        if section.get("after"):
            parts += [section["after"].strip(), ""]
    parts += [data["local_intro"].strip(), ""]
    for _chapter, entry in sorted((data.get("local") or {}).items()):
        items = "; ".join(f"{row['tex']} {row['meaning'].strip()}" for row in entry["symbols"])
        parts.append(f"- {entry['where']}: {items}.")
    parts += ["", data["footer"].strip(), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    ap.add_argument("--symbols", action="store_true",
                    help="print the symbols each chapter uses that the data lacks")
    args = ap.parse_args(argv)
    data = load()
    if args.symbols:
        bad = check_chapters(data)
        for v in bad:
            print(v)
        return 1 if bad else 0
    page = render(data)
    if args.check:
        if PAGE.read_text(encoding="utf-8") != page:
            print(f"chapters/{PAGE.name} is out of date: run python tools/notation.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
