"""Frames as images: a matplotlib figure as a small PNG, the PNG as it is embedded, and the
words that describe a figure (for its text alternative).

:func:`normcore.widgets.static_widget` draws its raster frames with :func:`figure_to_png`
(palette PNG) and embeds them as :func:`compact_image` chooses (lossless WebP where smaller).
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Callable
from typing import Any

from ._extras import require

require(__name__)   # without normcore[book]: an ImportError that names it

__all__ = ["IMAGE_FORMATS", "ResponsiveFigure", "check_image_format", "compact_image", "figure_description",
           "figure_to_png", "png_description", "responsive_figure"]


def figure_to_png(fig: Any, dpi: int = 80, *, colors: int | None = 256) -> bytes:
    """Render a matplotlib Figure to PNG bytes and close it.

    The PNG carries no timestamp or software tag, so the same figure always gives the same
    bytes. With ``colors`` (default 256) the image is quantized to an adaptive palette,
    which typically makes plots 2-4x smaller with no visible change; ``None`` keeps RGBA.
    The PNG's ``Description`` text is the figure's own words (:func:`figure_description`),
    which :func:`static_widget` uses as the frame's text alternative.
    """
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        description = figure_description(fig) or None
        fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None, "Description": description})
    finally:
        plt.close(fig)
    data = buf.getvalue()
    if colors:
        from PIL import Image

        img = Image.open(io.BytesIO(data)).convert("RGB")
        pal = img.quantize(colors=colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        out = io.BytesIO()
        info = None
        if description:
            from PIL.PngImagePlugin import PngInfo

            info = PngInfo()
            info.add_itxt("Description", description)
        pal.save(out, format="png", optimize=True, pnginfo=info)
        if out.tell() < len(data):
            data = out.getvalue()
    return data


def figure_description(fig: Any) -> str:
    """A figure described by its own words: the suptitle, then each panel's title with its
    axis labels, TeX markup dropped. Empty if the figure has no text."""

    def plain(s: str) -> str:
        s = re.sub(r"\\([A-Za-z]+)", r"\1", s.replace("$", "").replace("{", "").replace("}", ""))
        return " ".join(s.split())

    parts = []
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text().strip():
        parts.append(plain(sup.get_text()))
    for ax in fig.get_axes():
        title = plain(" ".join(t for t in (ax.get_title("left"), ax.get_title(), ax.get_title("right")) if t))
        x, y = plain(ax.get_xlabel()), plain(ax.get_ylabel())
        plot = (f"plot of {y}" if y else "plot") + (f" over {x}" if x else "") if (x or y) else ""
        if title and plot:
            parts.append(f"{title} ({plot})")
        elif title or plot:
            parts.append(title or plot)
    return "; ".join(p for p in parts if p)


def png_description(data: bytes) -> str:
    """The ``Description`` (or ``Title``) text chunk of a PNG, or ``""``."""
    from PIL import Image

    text = getattr(Image.open(io.BytesIO(data)), "text", {}) or {}
    return " ".join(str(text.get("Description") or text.get("Title") or "").split())


#: How raster frames are embedded (``static_widget(image_format=...)``).
IMAGE_FORMATS = ("auto", "png", "webp")


def check_image_format(image_format: str) -> None:
    """Raise ValueError, naming the choices, unless `image_format` is one of IMAGE_FORMATS."""
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format must be one of {IMAGE_FORMATS}, got {image_format!r}")


def compact_image(data: bytes, image_format: str = "auto") -> tuple[str, bytes]:
    """A PNG frame as it is embedded in the page: ``(format, bytes)``, format ``"png"`` or
    ``"webp"``.

    ``"webp"`` re-encodes the PNG as *lossless* WebP: the same pixels, exactly (a palette
    PNG becomes WebP's colour-indexed form), typically 20% smaller than the optimized PNG for
    this book's frames; every current browser shows it (Chromium, Firefox, Safari >= 14).
    ``"auto"`` takes the smaller of the two, ``"png"`` keeps the PNG. Lossy JPEG and WebP were
    measured and left out: the frames' photographs are small images enlarged with visible
    pixel edges, next to text, and at a quality without ringing around that text (WebP 90,
    JPEG 90 4:4:4) they came out 1.9x and 4x larger than the lossless palette frame.
    """
    check_image_format(image_format)
    if image_format == "png":
        return "png", data
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    if img.mode not in ("RGB", "RGBA"):
        img = img.convert("RGBA" if img.has_transparency_data else "RGB")
    out = io.BytesIO()
    # method 4: within 1% of the smallest (method 6) at 1/30 of its time
    img.save(out, format="webp", lossless=True, quality=100, method=4, exact=True)
    webp = out.getvalue()
    if image_format == "webp" or len(webp) < len(data):
        return "webp", webp
    return "png", data


# --- frames for narrow screens (static_widget(narrow=...)) ------------------------------------

def smallest_text_px(fig: Any, dpi: int) -> float | None:
    """The size of the smallest visible text of a matplotlib figure, in px at ``dpi``."""
    from matplotlib.text import Text

    # the tick and axis labels of an axes drawn with set_axis_off() exist, but are not drawn
    hidden = {id(t) for ax in fig.axes if not ax.axison
              for axis in (ax.xaxis, ax.yaxis) for t in axis.findobj(Text)}
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and id(t) not in hidden]
    return min(sizes) * dpi / 72 if sizes else None


#: Screens narrower than this (CSS px) get a widget's ``narrow`` frames (the media query
#: of each ``<picture>`` and NARROW_STYLE say the same number).
NARROW_SCREEN_PX = 600
#: The width to draw a narrow raster frame for: the text column of a 390 px phone is 328 px,
#: 312 inside the light card that dark mode puts around a frame.
NARROW_WIDTH_PX = 296

NARROW_STYLE = (
    "<style>.normcore-widget .normcore-narrow{display:none}"
    f"@media (max-width:{NARROW_SCREEN_PX}px){{.normcore-widget .normcore-wide{{display:none}}"
    ".normcore-widget .normcore-narrow{display:block}}</style>"
)
_TEXT_PX = re.compile(r'data-text-px="([0-9.]+)"')
_IMG_SRC = re.compile(r'^<img src="(data:image/[a-z]+;base64,[A-Za-z0-9+/=]+)"')


def with_narrow_variant(wide: Any, fmt: str, narrow: Any, nfmt: str, key: tuple) -> Any:
    """One frame (an ``ipywidgets.HTML``) holding both layouts: a ``<picture>`` whose
    ``<source>`` is the narrow image (raster frames), or two ``<svg>`` of which
    :data:`NARROW_STYLE` shows one (SVG frames)."""
    if (fmt == "svg") != (nfmt == "svg"):
        raise TypeError(f"narrow{key} returned a {nfmt} frame for a {fmt} frame of render{key}: "
                        "both layouts must be SVG, or both images")
    if fmt == "svg":
        wide.value = (f'<div class="normcore-wide">{wide.value}</div>'
                      f'<div class="normcore-narrow">{narrow.value}</div>')
        return wide
    src = _IMG_SRC.match(narrow.value).group(1)
    value = wide.value
    sizes = [float(m) for v in (wide.value, narrow.value) for m in _TEXT_PX.findall(v)]
    if sizes:   # the smaller of the two layouts' smallest text (the img shows either)
        value = _TEXT_PX.sub(f'data-text-px="{min(sizes):.1f}"', value)
    wide.value = (f'<picture><source media="(max-width: {NARROW_SCREEN_PX}px)" '
                  f'srcset="{src}">{value}</picture>')
    return wide


# --- figures with a phone layout (responsive_figure) -----------------------------------------
#
# A chapter's figure is a cell output, shown by myst-nb as an <img> (a PNG, or an SVG file).
# Drawn for the desktop column, its text is scaled to half on a phone. responsive_figure()
# draws it twice, for the column and for a phone, and ships the phone layout *inside* the
# output (a PNG text chunk, an SVG <metadata> element), so that myst-nb's figure (caption,
# name, alt text) stays as it is. The book's extension assets/sphinx_ext/normcore_figures.py
# takes the phone layout out into a file of its own and makes the <img> a <picture>.

#: keys of the PNG text chunks (and SVG metadata) that carry a figure's phone layout
FIGURE_NARROW, FIGURE_TEXT_PX = "normcore-narrow", "normcore-text-px"
#: a phone's text column (390 px screen) inside dark mode's card: the narrowest a figure shows
PHONE_COLUMN_PX = 312
#: the smallest text a figure may show on a phone, in CSS px
PHONE_MIN_TEXT_PX = 10.0
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SVG_METADATA = re.compile(r'<metadata id="normcore-figure" data-text-px="([0-9.,]+)"><!\[CDATA\[(.*?)\]\]></metadata>',
                           re.S)


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    import struct

    if not data.startswith(_PNG_SIGNATURE):
        raise ValueError("not a PNG image (its signature is missing)")
    out, p = [], len(_PNG_SIGNATURE)
    while p < len(data):
        (n,) = struct.unpack(">I", data[p:p + 4])
        out.append((data[p + 4:p + 8], data[p + 8:p + 8 + n]))
        p += 12 + n
    return out


def _png_from_chunks(chunks: list[tuple[bytes, bytes]]) -> bytes:
    import struct
    import zlib

    return _PNG_SIGNATURE + b"".join(struct.pack(">I", len(body)) + kind + body
                                     + struct.pack(">I", zlib.crc32(kind + body)) for kind, body in chunks)


def png_add_text(data: bytes, items: dict[str, str]) -> bytes:
    """The PNG `data` with a ``tEXt`` chunk for each ``key: value`` (Latin-1) before its end."""
    chunks = _png_chunks(data)
    extra = [(b"tEXt", k.encode("latin-1") + b"\0" + v.encode("latin-1")) for k, v in items.items()]
    return _png_from_chunks(chunks[:-1] + extra + chunks[-1:])


def png_pop_text(data: bytes, keys: tuple[str, ...]) -> tuple[bytes, dict[str, str]]:
    """The PNG without its ``tEXt`` chunks named in `keys`, and their values; the other
    chunks, the pixels among them, are kept byte for byte."""
    kept, found = [], {}
    for kind, body in _png_chunks(data):
        key, _, value = body.partition(b"\0")
        if kind == b"tEXt" and key.decode("latin-1") in keys:
            found[key.decode("latin-1")] = value.decode("latin-1")
        else:
            kept.append((kind, body))
    return _png_from_chunks(kept), found


def svg_text_px(svg: str) -> float | None:
    """The smallest font size an SVG of this book sets (``font-size``, in CSS ``font:`` or
    attributes), in px as drawn at its own width; None if it sets none."""
    sizes = [float(v) for v in re.findall(r'font(?:-size)?\s*[:=]\s*"?(?:[a-z]+\s+)*([0-9.]+)(?:px)?', svg)]
    vb = re.search(r'viewBox="[-0-9. ]*? ([0-9.]+) [0-9.]+"', svg)
    w = re.search(r'<svg\b[^>]*?\bwidth="([0-9.]+)', svg)
    scale = float(w.group(1)) / float(vb.group(1)) if vb and w else 1.0
    return min(sizes) * scale if sizes else None


def svg_size(svg: str) -> tuple[float, float]:
    """The size an SVG is drawn at: its ``width``/``height``, or its viewBox's."""
    tag = re.search(r"<svg\b[^>]*>", svg)
    attrs = dict(re.findall(r'\b(width|height|viewBox)="([^"]*)"', tag.group(0) if tag else ""))
    if "width" in attrs and "height" in attrs:
        return float(attrs["width"]), float(attrs["height"])
    if "viewBox" in attrs:
        _, _, w, h = (float(v) for v in attrs["viewBox"].split())
        return w, h
    raise ValueError("an SVG figure needs a width and a height, or a viewBox")


class ResponsiveFigure:
    """A figure in two layouts, for the text column and for a phone (see
    :func:`responsive_figure`). Shown as the last expression of a cell."""

    def __init__(self, kind: str, wide: bytes | str, narrow: bytes | str, size: tuple[float, float],
                 narrow_size: tuple[float, float], text_px: float, narrow_text_px: float):
        self.kind, self.wide, self.narrow = kind, wide, narrow
        self.size, self.narrow_size = size, narrow_size
        self.text_px, self.narrow_text_px = text_px, narrow_text_px

    def phone_text_px(self) -> float:
        """The smallest text of the phone layout as a phone's column shows it."""
        return self.narrow_text_px * min(1.0, PHONE_COLUMN_PX / self.narrow_size[0])

    def __repr__(self) -> str:
        (w, h), (nw, nh) = self.size, self.narrow_size
        return (f"ResponsiveFigure({self.kind}: {w:.0f}x{h:.0f} px, on a phone {nw:.0f}x{nh:.0f} px; "
                f"smallest text {self.text_px:.1f} px, on a phone {self.phone_text_px():.1f} px)")

    def _repr_mimebundle_(self, include=None, exclude=None):
        text = f"{self.text_px:.2f},{self.narrow_text_px:.2f}"
        if self.kind == "svg":
            narrow = self.narrow.replace("]]>", "]]]]><![CDATA[>")
            meta = f'<metadata id="normcore-figure" data-text-px="{text}"><![CDATA[{narrow}]]></metadata>'
            svg = re.sub(r"(<svg\b[^>]*>)", lambda m: m.group(1) + meta, self.wide, count=1)
            return {"image/svg+xml": svg, "text/plain": repr(self)}, {}
        png = png_add_text(self.wide, {FIGURE_TEXT_PX: text,
                                       FIGURE_NARROW: base64.b64encode(self.narrow).decode("ascii")})
        w, h = self.size
        return ({"image/png": png, "text/plain": repr(self)},
                {"image/png": {"width": round(w), "height": round(h)}})


def responsive_figure(draw: Callable[[bool], Any], *, dpi: int = 80) -> ResponsiveFigure:
    """A chapter's figure, drawn for the text column (``draw(False)``) and for a phone
    (``draw(True)``): each call returns a matplotlib Figure (drawn at `dpi` pixels per inch
    on the page, with twice the pixels for sharp screens) or an SVG string. On a screen
    narrower than :data:`NARROW_SCREEN_PX` the book shows the phone layout.

    Raises ValueError, naming the figure, if the phone layout's smallest text would show
    below :data:`PHONE_MIN_TEXT_PX` on a phone's :data:`PHONE_COLUMN_PX` column (draw it
    narrower, about :data:`NARROW_WIDTH_PX` px, or with larger fonts), or if the two layouts
    are not of one kind.
    """
    def one(out):
        if isinstance(out, str):
            return "svg", out, svg_size(out), svg_text_px(out)
        if not hasattr(out, "savefig"):
            raise TypeError(f"draw must return a matplotlib Figure or an SVG string, got {type(out).__name__}")
        px = smallest_text_px(out, dpi)
        size = (out.get_figwidth() * dpi, out.get_figheight() * dpi)
        return "png", figure_to_png(out, dpi=2 * dpi), size, px

    wide, narrow = one(draw(False)), one(draw(True))
    if wide[0] != narrow[0]:
        raise ValueError(f"draw(False) gave a {wide[0]} figure and draw(True) a {narrow[0]}: "
                         "both layouts must be SVG, or both matplotlib figures")
    if wide[3] is None or narrow[3] is None:
        raise ValueError("a figure without text (or whose font sizes cannot be read): "
                         "show it with IPython.display instead")
    fig = ResponsiveFigure(wide[0], wide[1], narrow[1], wide[2], narrow[2], wide[3], narrow[3])
    if fig.phone_text_px() < PHONE_MIN_TEXT_PX - 1e-9:
        raise ValueError(
            f"the phone layout of this figure shows its smallest text at {fig.phone_text_px():.1f} px "
            f"(drawn {narrow[2][0]:.0f} px wide with {narrow[3]:.1f} px text, shown at most "
            f"{PHONE_COLUMN_PX} px wide); it needs {PHONE_MIN_TEXT_PX:.0f} px: draw it about "
            f"{NARROW_WIDTH_PX} px wide ({NARROW_WIDTH_PX / dpi:.2f} in at dpi {dpi}) with fonts of at least "
            f"{PHONE_MIN_TEXT_PX * 72 / dpi:.1f} pt")
    return fig


def narrow_from_svg(svg: str) -> tuple[str, str, str]:
    """An SVG figure's ``(wide svg without its phone layout, phone svg, text px "wide,narrow")``,
    or ``(svg, "", "")`` if it carries none (the book's extension calls this)."""
    m = _SVG_METADATA.search(svg)
    if m is None:
        return svg, "", ""
    return svg[:m.start()] + svg[m.end():], m.group(2).replace("]]]]><![CDATA[>", "]]>"), m.group(1)
