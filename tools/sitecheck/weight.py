"""A page's own weight on disk: its HTML, its widget state (in the page or a file of its
own), the widgets' frames, and its images; the size of a folder, a file's hash.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

PAGE_BUDGET = 3 * 1024 * 1024  # bytes of a page's own weight


_IMG_SRC = re.compile(r"""<img\b[^>]*?\bsrc=["']([^"']+)["']""", re.I)
# a frame in the widget state file, moved to _frames/ (JSON escapes the attribute's quotes)
_FRAME_SRC = re.compile(r'<img src=\\"([^"\\]+)\\"')
_STATE_SRC = re.compile(r'<script\b[^>]*\bdata-normcore-src="([^"]+)"[^>]*>')
_STATE = re.compile(r'<script type="application/vnd\.jupyter\.widget-state\+json">(.*?)</script>', re.S)
# typeset math, in the page or in the widget state (where JSON writes "</" as "<\/")
_MATH_MARKUP = re.compile(r'<mjx-container\b.*?<\\?/mjx-container>|<style id="normcore-math".*?</style>', re.S)


@dataclass
class PageWeight:
    rel: str
    html: int
    images: int
    widget_state: int  # part of `html`, or in `state_file`
    embed_js: bool
    math: int = 0  # the typeset math (CHTML markup, its stylesheet), in `html` or the state file
    state_file: int = 0  # the page's <page>.widget-state.js, loaded with the widget manager
    frames: int = 0  # the widgets' frames in _frames/, each fetched when it is shown

    @property
    def own(self) -> int:
        return self.html + self.images + self.state_file + self.frames


def page_weight(html_dir: Path, rel: str) -> PageWeight:
    """A page's own weight: its HTML, its widget state (in the HTML or a file of its own), the
    widgets' frames, and the images it references outside _static/ (shared by every page,
    counted separately)."""
    path = Path(html_dir) / rel
    text = path.read_text(encoding="utf-8")
    images = 0
    seen = set()
    for src in _IMG_SRC.findall(text):
        if src.startswith(("data:", "http:", "https:")) or "_static/" in src:
            continue
        f = (path.parent / src.split("?")[0].split("#")[0]).resolve()
        if f not in seen and f.is_file():
            seen.add(f)
            images += f.stat().st_size
    state = sum(len(m.encode("utf-8")) for m in _STATE.findall(text))
    # the widget state moved to a file of its own (assets/sphinx_ext/normcore_widget_state.py)
    # counts too
    files = [path.parent / src for src in sorted(set(_STATE_SRC.findall(text)))]
    files_text = [f.read_text(encoding="utf-8") for f in files if f.is_file()]
    state_file = sum(len(s.encode("utf-8")) for s in files_text)
    math = sum(len(m.encode("utf-8")) for s in [text, *files_text] for m in _MATH_MARKUP.findall(s))
    frame_files = {(path.parent / src).resolve() for s in files_text for src in _FRAME_SRC.findall(s)}
    missing = sorted(str(f) for f in frame_files if not f.is_file())
    if missing:
        raise FileNotFoundError(f"{rel}: widget frames missing from the site: {missing[:3]}")
    frames = sum(f.stat().st_size for f in frame_files)
    return PageWeight(rel, len(text.encode("utf-8")), images, state + state_file,
                      "html-manager/embed.js" in text, math, state_file, frames)


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

