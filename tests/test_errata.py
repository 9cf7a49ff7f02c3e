"""The errata page (chapters/errata.md) and the chapters' "A common error" boxes.

Every box names the claim it corrects and is followed by a code cell that checks it with an
`assert`; every box has a row on the errata page, and every row links to a box that exists.
The sources are checked here; the built page's links in `test_errata_links_resolve` (marker
`site`).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
ERRATA = ROOT / "chapters" / "errata.md"
LETTERS = ["a", "b1", "b2", "c", "d", "e", "f", "g", "h", "i", "j", "k"]

BOX = re.compile(r"^(`{3,})\{admonition\}[^\n]*\n(?P<options>(?::[^\n]*\n)*)", re.M)


def _boxes() -> list[dict]:
    """Every admonition of class common-error in the chapters: its notebook, cell index, name,
    title and the cell after it."""
    boxes = []
    for nb_path in sorted((ROOT / "chapters").glob("*.ipynb")):
        cells = nbformat.read(nb_path, as_version=4).cells
        for i, cell in enumerate(cells):
            if cell.cell_type != "markdown":
                continue
            for m in BOX.finditer(cell.source):
                options = m.group("options")
                title = m.group(0).splitlines()[0].split("}", 1)[1].strip()
                if "common-error" not in options and not title.startswith("A common error"):
                    continue
                name = re.search(r"^:name:\s*(\S+)", options, re.M)
                boxes.append({
                    "where": f"{nb_path.name} cell {i}",
                    "name": name.group(1) if name else None,
                    "options": options,
                    "title": title,
                    "next": cells[i + 1] if i + 1 < len(cells) else None,
                })
    return boxes


def _rows() -> dict[str, list[str]]:
    """Letter of each row of the errata table -> the {ref} targets in that row."""
    rows = {}
    for line in ERRATA.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\|\s*([a-z]\d?)\s*\|", line)
        if m:
            rows[m.group(1)] = re.findall(r"\{ref\}`[^`<]*<([^>]+)>`", line)
    return rows


def test_the_page_has_one_row_per_error():
    assert list(_rows()) == LETTERS


def test_every_box_is_named_titled_and_listed():
    listed = {t for targets in _rows().values() for t in targets}
    problems = []
    for box in _boxes():
        if not box["name"]:
            problems.append(f"{box['where']}: no :name: (the errata page cannot link to it)")
        elif box["name"] not in listed:
            problems.append(f"{box['where']}: {box['name']} has no row in chapters/errata.md")
        if not box["title"].startswith("A common error: ") or len(box["title"]) < 30:
            problems.append(f"{box['where']}: the title must state the claim: {box['title']!r}")
        if "common-error" not in box["options"]:
            problems.append(f"{box['where']}: class common-error missing (the box's style)")
    assert not problems, "\n".join(problems)


def test_every_row_links_a_box_that_exists():
    names = {box["name"]: box for box in _boxes()}
    missing = [f"row {letter}: no box named {target}"
               for letter, targets in _rows().items() for target in targets
               if target not in names]
    assert not missing, "\n".join(missing)
    for letter, targets in _rows().items():
        assert targets and targets[0] == f"erratum-{letter}", (letter, targets)


def test_every_box_is_checked_by_the_cell_after_it():
    problems = []
    for box in _boxes():
        nxt = box["next"]
        if nxt is None or nxt.cell_type != "code" or not re.search(r"^\s*assert\b|assert_close",
                                                                   nxt.source, re.M):
            problems.append(f"{box['where']} ({box['name']}): the next cell asserts nothing")
    assert not problems, "\n".join(problems)


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.in_table = 0
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "table":
            self.in_table += 1
        if tag == "a" and self.in_table and attrs.get("href"):
            self.hrefs.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag == "table":
            self.in_table -= 1


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.mark.site
def test_errata_links_resolve(site):
    """Every link of the built errata table reaches an element with that id on its page."""
    html = ROOT / "_build" / "html"
    page = html / "chapters" / "errata.html"
    assert page.is_file(), "no errata page in the build (is chapters/errata in _toc.yml?)"
    hrefs = [h for h in _parse(page).hrefs if not urlparse(h).scheme]
    boxes = [h for h in hrefs if "#erratum-" in h]
    assert len(boxes) >= len(LETTERS), f"the table links {len(boxes)} boxes: {boxes}"
    broken = []
    for href in hrefs:
        url = urlparse(urljoin("chapters/errata.html", href))
        target = html / url.path
        if not target.is_file():
            broken.append(f"{href}: no page {url.path}")
        elif url.fragment and url.fragment not in _parse(target).ids:
            broken.append(f"{href}: {url.path} has no element with id {url.fragment!r}")
    assert not broken, "\n".join(broken)
