"""Sphinx extension: a page's widget state (its frames) in a file of its own, loaded with the
widget manager.

myst-nb writes a notebook's widget state, every frame of every widget, into the page's
<head> as <script type="application/vnd.jupyter.widget-state+json">; a reader who never
scrolls to a widget still downloads all of it (1.5 MB on chapter 5). This moves the state
into ``<page>.widget-state.js`` next to the page and leaves the script empty, with
``data-normcore-src`` naming the file; assets/static/normcore-widgets.js loads it (in
parallel with embed.js) when a widget first comes near the viewport, and fills the script
in before embed.js reads it.

It runs when the build has finished, after normcore_math (which typesets the math of the
widget captions inside the state, in the page): both rewrite the written pages, and the
state must hold typeset math before it leaves the page. A page that an incremental build did
not rewrite has an empty state script already and is left alone.

The file is a script, not JSON to fetch(): a book opened from disk (file://, as `make book`
does) may load scripts but not fetch files. It assigns the state (JSON, as an object
literal) to ``window.normcoreWidgetState[<file name>]``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SUFFIX = ".widget-state.js"
#: folders of the output that hold no pages
SKIP_DIRS = {"_static", "_sources", "_downloads", "_images"}
_STATE = re.compile(
    r'<script type="application/vnd\.jupyter\.widget-state\+json">(.*?)</script>', re.S
)


def split_page(path: Path) -> bool:
    """Move `path`'s widget state into <page>.widget-state.js; True if the page had one."""
    text = path.read_text(encoding="utf-8")
    m = _STATE.search(text)
    if m is None or not m.group(1).strip():
        return False
    if _STATE.search(text, m.end()):
        raise ValueError(f"{path}: more than one widget-state script (myst-nb writes one)")
    state = json.loads(m.group(1))  # a state that is not JSON fails the build here, not in a reader's browser
    name = path.stem + SUFFIX
    body = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    (path.parent / name).write_text(
        f"(window.normcoreWidgetState = window.normcoreWidgetState || {{}})[{json.dumps(name)}] =\n{body};\n",
        encoding="utf-8",
    )
    empty = f'<script type="application/vnd.jupyter.widget-state+json" data-normcore-src="{name}"></script>'
    path.write_text(text[: m.start()] + empty + text[m.end():], encoding="utf-8")
    return True


def split_site(outdir: Path) -> int:
    """Split every page under `outdir`; the number of pages whose state moved."""
    outdir = Path(outdir)
    return sum(
        split_page(path)
        for path in sorted(outdir.rglob("*.html"))
        if not SKIP_DIRS & set(path.relative_to(outdir).parts[:-1])
    )


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder is None or app.builder.format != "html":
        return
    split_site(Path(app.outdir))


def setup(app) -> dict:
    # after normcore_math's build-finished handler (priority 500), which typesets the captions
    app.connect("build-finished", _build_finished, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "2"}
