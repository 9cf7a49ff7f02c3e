"""What a page shows, inspected: its math, images (loaded, at their aspect ratio, with alt
text), favicon, download links, widgets, what sticks out of the column, the contrast of its
text, the size of the text in widgets' frames, and the lines of its visible text that match a
pattern. Each function reports what it saw and asserts nothing; the JavaScript that looks is
in js/<name>.js.
"""

from __future__ import annotations

from . import _js


def inspect_math(page) -> dict:
    """Every .math element typeset (by MathJax, when the book was built): no raw TeX
    delimiters left, an mjx-container inside, no MathJax error nodes."""
    return page.evaluate(_js.load("math"))


def inspect_images(page) -> list[str]:
    """src of every <img> that did not load (naturalWidth 0)."""
    return page.evaluate(_js.load("broken_images"))


def inspect_aspect(page, tolerance: float = 0.02) -> list[dict]:
    """Images of the article shown at another aspect ratio than their own (squashed or
    stretched by more than ``tolerance``, relative): a width capped by the column with a
    height fixed by the img's attribute does that."""
    return page.evaluate(_js.load("aspect"), tolerance)


def inspect_favicon(page) -> dict:
    return page.evaluate(_js.load("favicon"))


def inspect_downloads(page) -> list[dict]:
    """The download buttons' links (sphinx-book-theme: the page's source, and the notebook
    for .ipynb pages), each fetched."""
    return page.evaluate(_js.load("downloads"))


def inspect_widgets(page) -> dict:
    return page.evaluate(_js.load("widgets"))


def inspect_overflow(page, phone: bool) -> dict:
    """Elements wider than the article column (see js/overflow.js), and by how much the page
    itself scrolls sideways."""
    return page.evaluate(_js.load("overflow"), phone)


def inspect_alt_text(page) -> list[dict]:
    return page.evaluate(_js.load("alt_text"))


def visible_text_matches(page, pattern: str) -> list[str]:
    """Lines of the page's visible text that match a JS regular expression."""
    return page.evaluate(_js.load("text_matches"), pattern)


def inspect_contrast(page, selector: str) -> list[dict]:
    return page.evaluate(_js.load("contrast"), selector)


def inspect_frame_text(page) -> list[dict]:
    """How large the text inside each widget's shown frame is on this screen, in CSS px:
    [{"widget", "kind" ("svg" or "img"), "px" (None: not measurable), "what"}, ...], one per
    frame layout on screen (see js/frame_text.js)."""
    return page.evaluate(_js.load("frame_text"))
