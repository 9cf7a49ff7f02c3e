"""Link each chapter's first mention of a normcore public name to its API reference entry.

A *public name* is one of ``normcore.nn.__all__`` or ``normcore.functional.__all__`` (and the
two modules themselves). A *mention* is an inline code span in the prose of a chapter (the
markdown cells of chapters/*.ipynb, the text of chapters/*.md outside code cells and fenced
blocks) that starts with the name, whole, in one of these forms:

- qualified: ```normcore.nn.BatchNorm2d```, ```normcore.functional.layer_norm(input, ...)```,
  ```normcore.nn```;
- through the chapter's own alias of the module, read from its code
  (``import normcore.functional as F``, ``from normcore import nn as ncnn``): ```F.layer_norm```;
- bare, for a name that neither ``torch.nn`` nor ``torch.nn.functional`` has (so it can only
  mean normcore's): ```from_torch```, ```convert_ln_to_dyt```, ```weight_standardize```.
  A bare ```BatchNorm2d``` or ```batch_norm``` may be torch's, and is not a mention.

The name must end the span or be followed by ``(`` or a space: ```DyT.alpha``` is an
attribute, not a mention of ``DyT``. The first mention of each name in a chapter becomes a
markdown link to the entry, the span kept as its text: ```F.layer_norm``` becomes
``[`F.layer_norm`](#normcore.functional.layer_norm)``. MyST resolves ``#name`` through the
Python domain (a wrong name fails the build), and JupyterLab (jupyterlab-myst) shows the span
as it was, where a role with a title (``{py:func}`F.layer_norm <normcore...>```) shows its
raw text ``F.layer_norm <normcore.functional.layer_norm>``. A mention already written as
such a link, or as a ``py`` role, counts as a link.

Usage:
  python tools/api_links.py chapters/*.ipynb chapters/*.md          # link in place
  python tools/api_links.py --check chapters/*.ipynb chapters/*.md  # exit 1 if one is missing

The notebooks' markdown cells only are rewritten (code cells and outputs are left as they
are: nbval compares them), in nbformat's own JSON layout.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

MODULES = ("normcore.nn", "normcore.functional")

# an inline code span, or a MyST role with its content; a markdown link's text is matched
# as a whole (`[...](...)`) so that a span inside one is not taken for a plain mention
_SPAN = re.compile(
    r"\[[^\]\n]*\]\((?P<url>[^)\n]*)\)"               # a markdown link: not a mention
    r"|\{(?P<role>[\w:.-]+)\}`(?P<rtext>[^`\n]+)`"   # a role
    r"|(?<!`)`(?P<code>[^`\n]+)`(?!`)"               # an inline code span
)
_FENCE = re.compile(r"^(```|~~~)", re.M)
_NAME = re.compile(r"[A-Za-z_][\w.]*")
_ROLE_TARGET = re.compile(r"<([\w.]+)>$")


@dataclass(frozen=True)
class Name:
    full: str   # normcore.nn.BatchNorm2d
    role: str   # py:class, py:func, py:data, py:mod


def public_names() -> dict[str, Name]:
    """Every public name, by its full dotted name."""
    import importlib

    names = {}
    for mod_name in MODULES:
        module = importlib.import_module(mod_name)
        names[mod_name] = Name(mod_name, "py:mod")
        for attr in module.__all__:
            obj = getattr(module, attr)
            role = ("py:class" if inspect.isclass(obj) else
                    "py:func" if callable(obj) else "py:data")
            names[f"{mod_name}.{attr}"] = Name(f"{mod_name}.{attr}", role)
    return names


def _torch_names() -> set[str]:
    import torch

    return set(dir(torch.nn)) | set(dir(torch.nn.functional))


def aliases(code: str) -> dict[str, str]:
    """The chapter's names for normcore's modules: {"F": "normcore.functional", ...}."""
    out = {}
    for mod in ("nn", "functional"):
        full = f"normcore.{mod}"
        for m in re.finditer(rf"^\s*import normcore\.{mod} as (\w+)", code, re.M):
            out[m[1]] = full
        for m in re.finditer(r"^\s*from normcore import ([^\n]+)", code, re.M):
            for part in m[1].strip("()").split(","):
                words = part.split()
                if words and words[0] == mod:
                    out[words[2] if len(words) == 3 and words[1] == "as" else mod] = full
    return out


class Resolver:
    """Which public name, if any, a code span mentions, in one chapter."""

    def __init__(self, names: dict[str, Name], alias: dict[str, str], torch_names: set[str]):
        self.names = names
        self.alias = alias
        self.bare = {}
        for full in names:
            short = full.rsplit(".", 1)[1]
            if full.count(".") == 2 and short not in torch_names:
                self.bare.setdefault(short, []).append(full)
        self.bare = {k: v[0] for k, v in self.bare.items() if len(v) == 1}

    def __call__(self, text: str) -> str | None:
        m = _NAME.match(text)
        if not m:
            return None
        rest = text[m.end():]
        if rest and rest[0] not in "( ":
            return None
        word = m[0]
        if word in self.names:
            return word
        head, _, tail = word.partition(".")
        if head in self.alias and tail and "." not in tail:
            full = f"{self.alias[head]}.{tail}"
            return full if full in self.names else None
        return self.bare.get(word)


def prose_pieces(text: str, markdown_file: bool) -> list[tuple[int, int]]:
    """(start, end) of the prose of a text: its lines outside fenced blocks (in a MyST page,
    its code cells are fenced too) and, in a MyST page, after the front matter."""
    pieces, pos, inside = [], 0, False
    if markdown_file and text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        pos = end + 5 if end >= 0 else 0
    start = pos
    for line in text[pos:].splitlines(keepends=True):
        if _FENCE.match(line):
            if not inside:
                pieces.append((start, pos))
            inside = not inside
            start = pos + len(line)
        pos += len(line)
    if not inside:
        pieces.append((start, pos))
    return pieces


def link(text: str, resolve: Resolver, seen: set[str], markdown_file: bool,
         problems: list[str] | None = None) -> str:
    """``text`` with the first mention of each name not in ``seen`` made a link to its
    entry (``seen`` grows); with ``problems`` given, nothing is changed and each unlinked first mention is
    added to it instead."""
    out, last = [], 0
    for a, b in prose_pieces(text, markdown_file):
        for m in _SPAN.finditer(text, a, b):
            if m["role"] is not None:
                target = _ROLE_TARGET.search(m["rtext"])
                full = target[1] if target else m["rtext"].lstrip("~")
                if m["role"].startswith("py:") and full in resolve.names:
                    seen.add(full)
                continue
            if m["url"] is not None:                   # a link, to the reference or not
                if m["url"].startswith("#") and m["url"][1:] in resolve.names:
                    seen.add(m["url"][1:])
                continue
            if m["code"] is None:
                continue
            full = resolve(m["code"])
            if full is None or full in seen:
                continue
            seen.add(full)
            if problems is not None:
                problems.append(f"`{m['code']}` ({full})")
                continue
            out.append(text[last:m.start()])
            out.append(f"[`{m['code']}`](#{full})")
            last = m.end()
    out.append(text[last:])
    return "".join(out)


def process(path: Path, names: dict[str, Name], torch_names: set[str], check: bool) -> list[str]:
    """Link (or, with ``check``, list the unlinked) first mentions of one chapter."""
    problems: list[str] | None = [] if check else None
    seen: set[str] = set()
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        resolve = Resolver(names, aliases(code), torch_names)
        changed = False
        for cell in nb.cells:
            if cell.cell_type != "markdown" or "remove-cell" in cell.metadata.get("tags", []):
                continue                      # code, outputs, and cells the page does not show
            new = link(cell.source, resolve, seen, False, problems)
            if new != cell.source:
                cell.source, changed = new, True
        if changed and not check:
            nbformat.write(nb, path)
    else:
        text = path.read_text(encoding="utf-8")
        code = "\n".join(re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", text, re.S))
        resolve = Resolver(names, aliases(code), torch_names)
        new = link(text, resolve, seen, True, problems)
        if new != text and not check:
            path.write_text(new, encoding="utf-8")
    return [f"{path.name}: {p}" for p in problems or []]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only list unlinked first mentions")
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    names, torch_names = public_names(), _torch_names()
    problems = []
    for path in args.paths:
        problems += process(path, names, torch_names, args.check)
    for p in problems:
        print(f"not linked to the API reference: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
