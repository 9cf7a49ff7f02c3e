"""Sphinx extension: a page's widget state (its frames) in a file of its own, loaded with the
widget manager.

myst-nb writes a notebook's widget state, every frame of every widget, into the page's
<head> as <script type="application/vnd.jupyter.widget-state+json">; a reader who never
scrolls to a widget still downloads all of it (1.5 MB on chapter 5). This moves the state
into ``<page>.widget-state.js`` next to the page and leaves the script empty, with
``data-normcore-src`` naming the file; assets/static/normcore-widgets.js loads it (in
parallel with embed.js) when a widget first comes near the viewport, and fills the script
in before embed.js reads it.

The file is a script, not JSON to fetch(): a book opened from disk (file://, as `make book`
does) may load scripts but not fetch files. It assigns the JSON that myst-nb made, as an
object literal, to ``window.normcoreWidgetState[<file name>]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATE = "application/vnd.jupyter.widget-state+json"
SUFFIX = ".widget-state.js"


def _split(app, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    if app.builder is None or app.builder.format != "html":
        return
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    for i, js in enumerate(scripts):
        attrs = getattr(js, "attributes", None) or {}
        if attrs.get("type") != STATE or not attrs.get("body"):
            continue
        target = Path(app.outdir) / (pagename + SUFFIX)
        target.parent.mkdir(parents=True, exist_ok=True)
        name = Path(pagename).name + SUFFIX
        target.write_text(f"(window.normcoreWidgetState = window.normcoreWidgetState || {{}})[{json.dumps(name)}] =\n"
                          f"{attrs['body']};\n", encoding="utf-8")
        rest = {k: v for k, v in attrs.items() if k != "body"}
        rest["data-normcore-src"] = name
        scripts[i] = type(js)(js.filename, priority=js.priority, **rest, body="")


def setup(app) -> dict:
    # after myst-nb's html-page-context handler (priority 500), which adds the state
    app.connect("html-page-context", _split, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
