"""Sphinx extension: a chapter figure's phone layout, shown on a phone.

A figure made with ``normcore.images.responsive_figure`` is a cell output like any other (a
PNG, or an SVG), so myst-nb keeps its caption, its name and its alt text. It carries a second
layout drawn for a phone's column inside the file: in a PNG text chunk, or in an SVG
``<metadata>`` element, with the smallest text of both layouts. When the build has finished,
this takes that layout out into a file of its own next to the figure in ``_images/``
(``<name>.narrow.png``/``.svg``), removes it from the figure's file (a desktop reader does not
download it), and makes the figure's ``<img>`` a ``<picture>``:

    <picture class="normcore-figure">
      <source media="(max-width: 600px)" srcset="../_images/<name>.narrow.png" width=.. height=..>
      <img src="../_images/<name>.png" width=.. height=.. data-text-px=.. data-density=..
           data-narrow="<name>.narrow.png" data-narrow-text-px=..>
    </picture>

The browser fetches only the layout it shows. ``data-text-px`` and ``data-narrow-text-px``
(the smallest text of the desktop and of the phone layout, in CSS px at the layout's own
size), ``data-narrow`` (the phone layout's file, to tell which one the browser chose) and
``data-density`` (pixels per CSS px) are what the site's phone test reads, as for a widget's
frames: each layout is measured by its own text, on the screen that shows it.

What it learned of a figure is kept beside it (``<name>.figure.json``): an incremental build
that copies nothing new still rewrites a page's ``<img>`` the same way.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from pathlib import Path

from normcore_math import site_pages  # the same pages

from normcore.images import (FIGURE_NARROW, FIGURE_TEXT_PX, NARROW_SCREEN_PX, narrow_from_svg,
                             png_pop_text, svg_size)

_IMG = re.compile(r'<picture class="normcore-figure">.*?</picture>'
                  r'|<img\b([^>]*?)\bsrc="([^"]*_images/[^"/]+\.(png|svg))"([^>]*?)/?>', re.S)
_STYLE = re.compile(r'\s*style="[^"]*"')


def _png_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    return Image.open(io.BytesIO(data)).size


def take_narrow(image: Path) -> dict | None:
    """Move the phone layout out of `image` (a figure in _images/); what is known of the
    figure: ``{"narrow": file name, "size", "narrow_size" (CSS px), "density", "text_px",
    "narrow_text_px"}`` (the smallest text of each layout, in CSS px at its own size),
    or None for a figure without one."""
    sidecar = image.with_suffix(".figure.json")
    if image.suffix == ".png":
        data = image.read_bytes()
        wide, found = png_pop_text(data, (FIGURE_NARROW, FIGURE_TEXT_PX))
        if FIGURE_NARROW not in found:
            return json.loads(sidecar.read_text()) if sidecar.is_file() else None
        narrow, sizes = base64.b64decode(found[FIGURE_NARROW]), found[FIGURE_TEXT_PX]
        (w, h), (nw, nh), density = _png_size(wide), _png_size(narrow), 2
    else:
        svg = image.read_text(encoding="utf-8")
        wide, narrow_svg, sizes = narrow_from_svg(svg)
        if not narrow_svg:
            return json.loads(sidecar.read_text()) if sidecar.is_file() else None
        narrow, density = narrow_svg.encode("utf-8"), 1
        (w, h), (nw, nh) = svg_size(wide), svg_size(narrow_svg)
        wide = wide.encode("utf-8")
    name = f"{image.stem}.narrow.{hashlib.sha256(narrow).hexdigest()[:12]}{image.suffix}"
    (image.parent / name).write_bytes(narrow)
    image.write_bytes(wide)
    info = {"narrow": name, "size": [w / density, h / density], "narrow_size": [nw / density, nh / density],
            "density": density}
    info["text_px"], info["narrow_text_px"] = (float(v) for v in sizes.split(","))
    sidecar.write_text(json.dumps(info), encoding="utf-8")
    return info


def rewrite_page(path: Path, cache: dict) -> int:
    """Make each responsive figure's <img> on the page at `path` a <picture>; how many."""
    text = path.read_text(encoding="utf-8")
    count = 0

    def one(m):
        nonlocal count
        if m.group(2) is None:          # a <picture> of an earlier run
            return m.group(0)
        src = m.group(2)
        image = (path.parent / src).resolve()
        if image not in cache:
            cache[image] = take_narrow(image) if image.is_file() else None
        info = cache[image]
        if info is None:
            return m.group(0)
        count += 1
        (w, h), (nw, nh) = info["size"], info["narrow_size"]
        narrow = src.rsplit("/", 1)[0] + "/" + info["narrow"] if "/" in src else info["narrow"]
        attrs = _STYLE.sub("", m.group(1) + m.group(4)).strip()
        return (f'<picture class="normcore-figure"><source media="(max-width: {NARROW_SCREEN_PX}px)" '
                f'srcset="{narrow}" width="{nw:.0f}" height="{nh:.0f}" />'
                f'<img {attrs} src="{src}" width="{w:.0f}" height="{h:.0f}" '
                f'data-text-px="{info["text_px"]:.1f}" data-density="{info["density"]}" '
                f'data-narrow="{info["narrow"]}" '
                f'data-narrow-text-px="{info.get("narrow_text_px", info["text_px"]):.1f}" /></picture>')

    new = _IMG.sub(one, text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return count


def rewrite_site(outdir: Path) -> int:
    """Rewrite every page of the built site `outdir`; the number of figures given a phone layout."""
    cache: dict = {}
    return sum(rewrite_page(p, cache) for p in site_pages(Path(outdir)))


def _build_finished(app, exception) -> None:
    if exception is not None or app.builder is None or app.builder.format != "html":
        return
    rewrite_site(Path(app.outdir))


def setup(app) -> dict:
    app.connect("build-finished", _build_finished, priority=550)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
