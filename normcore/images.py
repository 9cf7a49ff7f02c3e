"""Frames as images: a matplotlib figure as a small PNG, the PNG as it is embedded, and the
words that describe a figure (for its text alternative).

:func:`normcore.widgets.static_widget` draws its raster frames with :func:`figure_to_png`
(palette PNG) and embeds them as :func:`compact_image` chooses (lossless WebP where smaller).
"""

from __future__ import annotations

import io
import re
from typing import Any

__all__ = ["IMAGE_FORMATS", "check_image_format", "compact_image", "figure_description", "figure_to_png",
           "png_description"]


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
