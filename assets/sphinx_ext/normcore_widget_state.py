"""Sphinx extension: a page's widget state (its frames) in a file of its own, loaded with the
widget manager.

myst-nb writes a notebook's widget state, every frame of every widget, into the page's
<head> as <script type="application/vnd.jupyter.widget-state+json">; a reader who never
scrolls to a widget still downloads all of it (1.5 MB on chapter 5). This moves the state
into ``<page>.widget-state.js`` next to the page and leaves the script empty, with
``data-normcore-src`` naming the file; assets/static/normcore-widgets.js loads it (in
parallel with embed.js) when a widget first comes near the viewport, and fills the script
in before embed.js reads it.

The frames themselves (the ``<img src="data:image/...;base64,...">`` of each widget's
PNG or WebP frames, and the ``<source srcset=...>`` of a frame's narrow layout) leave the
state too: each is written once, named by its hash, to
``_frames/`` at the site's root, and its ``<img>`` points there, with its pixel size as
``width``/``height`` (so the box keeps its size while a frame loads). A widget renders only
the frame its controls select, so a reader's browser fetches a frame when it is shown, not
every frame of every widget (the 56 frames of chapter 5 are 1.3 MB as base64).

It runs when the build has finished, after normcore_math (which typesets the math of the
widget captions inside the state, in the page): both rewrite the written pages, and the
state must hold typeset math before it leaves the page. A page that an incremental build did
not rewrite has an empty state script already and is left alone.

The file is a script, not JSON to fetch(): a book opened from disk (file://, as `make book`
does) may load scripts but not fetch files. It assigns the state (JSON, as an object
literal) to ``window.normcoreWidgetState[<file name>]``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
from pathlib import Path

from normcore_math import STATE, site_pages  # the same pages, the same state script

SUFFIX = ".widget-state.js"
#: where the frames go, under the site's root
FRAMES = "_frames"

#: an embedded frame: an <img>'s src, or the srcset of a <picture>'s <source> (a widget's
#: narrow layout, normcore.widgets.static_widget(narrow=...))
_DATA_IMG = re.compile(r'<(img src|source media="[^"]*" srcset)="data:image/(png|webp);base64,([A-Za-z0-9+/=]+)"')


def image_size(fmt: str, data: bytes) -> tuple[int, int]:
    """Pixel width and height of a frame whose data URI says it is a `fmt` ("png", "webp")."""
    from PIL import Image  # matplotlib's own dependency, in the build's environment

    try:
        img = Image.open(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - PIL raises several kinds
        raise ValueError(f"a widget frame that is not a {fmt.upper()} image: {e}") from None
    if (img.format or "").lower() != fmt:
        raise ValueError(f"a widget frame that is not a {fmt.upper()} image (it is {img.format})")
    return img.size


def move_frames(value: str, page_dir: Path, outdir: Path) -> str:
    """`value` (a widget's HTML) with each embedded frame written to _frames/ and linked."""
    def one(m):
        fmt, data = m.group(2), base64.b64decode(m.group(3))
        w, h = image_size(fmt, data)
        target = outdir / FRAMES / f"{hashlib.sha256(data).hexdigest()[:20]}.{fmt}"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        src = Path(os.path.relpath(target, page_dir)).as_posix()
        return f'<{m.group(1)}="{src}" width="{w}" height="{h}"'

    return _DATA_IMG.sub(one, value)


def split_page(path: Path, outdir: Path) -> bool:
    """Move `path`'s widget state into <page>.widget-state.js, and its frames into
    `outdir`/_frames/; True if the page had a state to move."""
    text = path.read_text(encoding="utf-8")
    m = STATE.search(text)
    if m is None or not m.group(2).strip():
        return False
    if STATE.search(text, m.end()):
        raise ValueError(f"{path}: more than one widget-state script (myst-nb writes one)")
    state = json.loads(m.group(2))  # a state that is not JSON fails the build here, not in a reader's browser
    for model in state.get("state", {}).values():
        fields = model.get("state", {})
        if isinstance(fields.get("value"), str) and "data:image/" in fields["value"]:
            fields["value"] = move_frames(fields["value"], path.parent, Path(outdir))
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
    return sum(split_page(path, Path(outdir)) for path in site_pages(outdir))


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder is None or app.builder.format != "html":
        return
    split_site(Path(app.outdir))


def setup(app) -> dict:
    # after normcore_math's build-finished handler (priority 500), which typesets the captions
    app.connect("build-finished", _build_finished, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "2"}
