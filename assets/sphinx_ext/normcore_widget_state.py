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
PNG or WebP frames) leave the state too: each is written once, named by its hash, to
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
import json
import os
import re
import struct
from pathlib import Path

SUFFIX = ".widget-state.js"
#: where the frames go, under the site's root
FRAMES = "_frames"
#: folders of the output that hold no pages
SKIP_DIRS = {"_static", "_sources", "_downloads", "_images"}
_STATE = re.compile(
    r'<script type="application/vnd\.jupyter\.widget-state\+json">(.*?)</script>', re.S
)

_DATA_IMG = re.compile(r'<img src="data:image/(png|webp);base64,([A-Za-z0-9+/=]+)"')


def image_size(fmt: str, data: bytes) -> tuple[int, int]:
    """Pixel width and height of a PNG or WebP (VP8L lossless, VP8 lossy, VP8X extended)."""
    if fmt == "png" and data[:8] == b"\x89PNG\r\n\x1a\n":
        return struct.unpack(">II", data[16:24])
    if fmt == "webp" and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        if chunk == b"VP8L":
            b = int.from_bytes(data[21:25], "little")
            return (b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return w & 0x3FFF, h & 0x3FFF
        if chunk == b"VP8X":
            return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise ValueError(f"a widget frame that is not a {fmt.upper()} image")


def move_frames(value: str, page_dir: Path, outdir: Path) -> str:
    """`value` (a widget's HTML) with each embedded frame written to _frames/ and linked."""
    def one(m):
        fmt, data = m.group(1), base64.b64decode(m.group(2))
        w, h = image_size(fmt, data)
        target = outdir / FRAMES / f"{hashlib.sha256(data).hexdigest()[:20]}.{fmt}"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        src = Path(os.path.relpath(target, page_dir)).as_posix()
        return f'<img src="{src}" width="{w}" height="{h}"'

    return _DATA_IMG.sub(one, value)


def split_page(path: Path, outdir: Path | None = None) -> bool:
    """Move `path`'s widget state into <page>.widget-state.js; True if the page had one."""
    text = path.read_text(encoding="utf-8")
    m = _STATE.search(text)
    if m is None or not m.group(1).strip():
        return False
    if _STATE.search(text, m.end()):
        raise ValueError(f"{path}: more than one widget-state script (myst-nb writes one)")
    state = json.loads(m.group(1))  # a state that is not JSON fails the build here, not in a reader's browser
    for model in state.get("state", {}).values():
        fields = model.get("state", {})
        if isinstance(fields.get("value"), str) and "data:image/" in fields["value"]:
            fields["value"] = move_frames(fields["value"], path.parent, Path(outdir or path.parent))
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
        split_page(path, outdir)
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
