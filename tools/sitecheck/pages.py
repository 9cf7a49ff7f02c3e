"""The book's pages: the HTML path of every file in the table of contents, in order."""

from __future__ import annotations

import re
from pathlib import Path

import yaml


def toc_pages(toc_file: Path) -> list[str]:
    """HTML paths (relative to the site root) of every file in a jb-book _toc.yml, in order."""
    toc = yaml.safe_load(Path(toc_file).read_text(encoding="utf-8"))
    files = [toc["root"]]

    def visit(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            visit(entry.get("sections"))
            visit(entry.get("chapters"))

    for part in toc.get("parts", []):
        visit(part.get("chapters"))
    visit(toc.get("chapters"))
    return [re.sub(r"\.(md|ipynb|rst)$", "", f) + ".html" for f in files]
