"""Static-first widgets: every frame rendered ahead of time, switched in the browser.

An ipywidget whose Python callback needs a kernel is frozen on a static web page: the
controls move and nothing happens. The widgets of this book are therefore built the
*static-first* way:

1. render every frame over a discrete grid of control values (SVG for diagrams, small
   PNGs for plots);
2. put the frames in :class:`ipywidgets.Stack` containers -- one level of nesting per
   control, so a grid of ``n1 x n2`` values is an outer Stack of ``n1`` inner Stacks of
   ``n2`` frames each;
3. tie each control's ``index`` to the ``selected_index`` of every Stack of its level with
   :func:`ipywidgets.jslink`.

``jslink`` runs in the browser, so the widget responds on the static site (whose widget
state myst-nb embeds at build time) and in JupyterLab alike, with no kernel round trip.

Usage::

    from normcore.widgets import static_widget, Control

    def render(norm, groups):
        return cube_svg(norm, groups)          # an SVG string, PNG bytes, or a Figure

    static_widget(
        render,
        {"norm": ["batch", "layer", "instance", "group"],       # toggle buttons
         "groups": Control([1, 2, 4], kind="slider", description="G")},
        caption="The highlighted cells share one mean and one variance.",
    )

Every frame has a text alternative, for screen readers (WCAG 2.1, 1.1.1): ``alt=`` (a
function of the same values as ``render``) says in one sentence what the frame shows;
without it the frame's own words are used (an SVG's ``<title>``, a figure's titles and axis
labels) with the control settings. On the book's site, ``assets/static/normcore-a11y.js``
names each control by its visible label and moves toggle buttons with the arrow keys.

The page-weight budget of the book is 3 MB per page, and every frame counts in it (in a
notebook the frames are in the widget state; on the book's site each raster frame is a file
that the browser fetches when the frame is shown, assets/sphinx_ext/normcore_widget_state.py),
so :func:`static_widget` refuses grids that are too large (``max_frames``) or whose frames
add up to too many bytes (``max_bytes``) with a :class:`WidgetBudgetError` that says by
how much.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._extras import require
from .images import (NARROW_SCREEN_PX, NARROW_STYLE, NARROW_WIDTH_PX, check_image_format, compact_image,
                     figure_description, figure_to_png, png_description, smallest_text_px,
                     with_narrow_variant)

require(__name__)   # without normcore[book]: an ImportError that names it

import ipywidgets  # noqa: E402 - imported once require() has checked the extra

__all__ = [
    "Control",
    "StaticWidget",
    "WidgetBudgetError",
    "static_widget",
    "figure_to_png",
    "figure_description",
    "png_description",
    "compact_image",
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_BYTES",
    "NARROW_SCREEN_PX",
    "NARROW_WIDTH_PX",
]

#: Largest number of frames one widget may hold (the product of the control sizes).
DEFAULT_MAX_FRAMES = 64
#: Largest embedded size of one widget's frames, in bytes as they appear in the page's
#: widget state (image bytes are base64 encoded there, so they count 4/3). The page budget
#: is 3 MB; one widget may take at most 1 MB of it by default.
DEFAULT_MAX_BYTES = 1_000_000

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_KINDS = ("auto", "slider", "dropdown", "toggle")


class WidgetBudgetError(ValueError):
    """The frame grid is too large for the page-weight budget."""


@dataclass(frozen=True)
class Control:
    """One control of a static widget.

    values:
        The grid of values, in display order. Each item is either a value, or a
        ``(label, value)`` pair with a ``str`` label (all items one way or the other).
        Values are passed to ``render`` unchanged; labels are what the reader sees.
    kind:
        ``"slider"`` (:class:`ipywidgets.SelectionSlider`), ``"dropdown"``
        (:class:`ipywidgets.Dropdown`), ``"toggle"`` (:class:`ipywidgets.ToggleButtons`),
        or ``"auto"``: a slider for numbers, toggle buttons for at most 5 short labels,
        a dropdown otherwise.
    description:
        The label shown next to the control; defaults to the control's name.
    index:
        Which value is selected first.
    """

    values: Sequence[Any]
    kind: str = "auto"
    description: str | None = None
    index: int = 0
    labels: tuple[str, ...] = field(init=False, repr=False)
    items: tuple[Any, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.values, (str, bytes)) or not isinstance(self.values, Sequence):
            raise TypeError(
                f"Control values must be a list or tuple of values, got {type(self.values).__name__}"
            )
        values = list(self.values)
        if not values:
            raise ValueError("a Control needs at least one value")
        pairs = [_is_pair(v) for v in values]
        if any(pairs) and not all(pairs):
            raise ValueError(
                "Control values must be all plain values or all (label, value) pairs, not a mix"
            )
        if all(pairs):
            labels = tuple(v[0] for v in values)
            items = tuple(v[1] for v in values)
        else:
            labels = tuple(_label(v) for v in values)
            items = tuple(values)
        if len(set(labels)) != len(labels):
            dup = sorted({x for x in labels if labels.count(x) > 1})
            raise ValueError(f"Control labels must be distinct; repeated: {dup}")
        if self.kind not in _KINDS:
            raise ValueError(f"Control kind must be one of {_KINDS}, got {self.kind!r}")
        if not 0 <= self.index < len(values):
            raise ValueError(f"Control index {self.index} out of range for {len(values)} values")
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "items", items)

    def __len__(self) -> int:
        return len(self.items)

    def resolved_kind(self) -> str:
        if self.kind != "auto":
            return self.kind
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in self.items):
            return "slider"
        if len(self.labels) <= 5 and all(len(x) <= 12 for x in self.labels):
            return "toggle"
        return "dropdown"

    def make_widget(self, name: str) -> ipywidgets.widgets.widget_selection._Selection:
        kind = self.resolved_kind()
        desc = self.description if self.description is not None else name
        common = dict(
            options=list(self.labels),
            index=self.index,
            description=desc,
            style={"description_width": "initial"},
        )
        if kind == "slider":
            w = ipywidgets.SelectionSlider(
                continuous_update=True, readout=True,
                layout=ipywidgets.Layout(width="28em", max_width="100%"), **common
            )
        elif kind == "dropdown":
            w = ipywidgets.Dropdown(layout=ipywidgets.Layout(width="max-content"), **common)
        else:
            w = ipywidgets.ToggleButtons(**common)
        w.add_class("normcore-control")
        return w


def _is_pair(v: Any) -> bool:
    return isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str)


def _label(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return f"{float(v):g}"
    return str(v)


def _is_figure(obj: Any) -> bool:
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return False
    return isinstance(obj, Figure)


def _frame(obj: Any, key: tuple, dpi: int, hidpi: bool = True,
           colors: int | None = 256) -> tuple[ipywidgets.Widget, int, str]:
    """Turn one render result into a frame widget; return (widget, embedded bytes, format).

    A matplotlib Figure is drawn at ``dpi`` pixels per inch *as displayed*; with ``hidpi``
    its PNG holds twice the pixels (sharp on 2x screens) and the image is shown at half its
    pixel width, so a font of ``p`` points is ``p * dpi / 72`` px on the page either way.
    """
    width = text_px = None
    if _is_figure(obj):
        width = round(obj.get_figwidth() * dpi)
        fig = obj
        obj = figure_to_png(fig, dpi=2 * dpi if hidpi else dpi, colors=colors)
        text_px = smallest_text_px(fig, dpi)     # once drawn: tick labels are set by drawing
    if isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        if not data.startswith(_PNG_SIGNATURE):
            raise TypeError(f"render{key} returned bytes that are not a PNG image")
        # not an ipywidgets.Image: it cannot carry alt text, and a widget made and closed
        # again would still be recorded in the notebook's widget state (twice the bytes)
        return (_Png(data, None if width is None else f"{width}px", text_px, 2 if hidpi and width else 1),
                4 * math.ceil(len(data) / 3), "png")
    if isinstance(obj, str):
        text = obj.lstrip()
        if text.startswith("<?xml"):
            text = text[text.index("?>") + 2:].lstrip()
        if not text.startswith("<svg"):
            raise TypeError(f"render{key} returned a string that is not an SVG document ('<svg ...')")
        w = ipywidgets.HTML(value=text)
        return w, len(text.encode("utf-8")), "svg"
    raise TypeError(
        f"render{key} returned {type(obj).__name__}; expected an SVG string, PNG bytes "
        "or a matplotlib Figure"
    )


# --- text alternatives (WCAG 2.1 1.1.1) -------------------------------------------------------

_SVG_OPEN = re.compile(r"<svg\b[^>]*>", re.S)
_SVG_TITLE = re.compile(r"<svg\b[^>]*>\s*(?:<[^>]*>\s*)*?<title>(.*?)</title>", re.S)


class _Png(NamedTuple):
    """A PNG frame before it becomes an ``<img alt=...>`` (:func:`_with_text_alternative`)."""

    value: bytes
    width: str | None      # displayed width, e.g. "608px"; None: the PNG's own
    text_px: float | None = None   # its smallest text as displayed at that width, in px
    density: int = 1       # image pixels per displayed px (2: drawn for HiDPI screens)


def _with_text_alternative(w: ipywidgets.Widget | _Png, fmt: str, alt: str | None,
                           settings: str, image_format: str = "png") -> tuple[ipywidgets.Widget, int, str]:
    """Give a frame its text alternative.

    An SVG frame becomes ``<svg role="img">`` named by ``alt`` (as ``aria-label``) or by its
    own ``<title>``. A PNG frame becomes an ``<img alt=...>`` inside an ``ipywidgets.HTML``
    (``ipywidgets.Image`` renders an ``<img>`` with no way to give it alt text), its pixels
    encoded as :func:`compact_image` chooses. Returns (frame, embedded bytes, format)."""
    if alt is not None and not (isinstance(alt, str) and alt.strip()):
        raise TypeError(f"alt(...) must return a non-empty str, got {alt!r}")
    if fmt == "svg":
        text = w.value
        tag = _SVG_OPEN.search(text).group(0)
        title = _SVG_TITLE.match(text)
        named = "aria-label=" in tag or (title is not None and title.group(1).strip())
        attrs = "" if re.search(r"\brole=", tag) else ' role="img"'
        if alt is not None:
            tag = re.sub(r'\saria-label="[^"]*"', "", tag)
            attrs += f' aria-label="{html.escape(alt.strip(), quote=True)}"'
        elif not named:
            attrs += f' aria-label="{html.escape("Picture for " + settings, quote=True)}"'
        text = tag[:4] + attrs + tag[4:] + text[len(tag):] if attrs else text
        w.value = text
        return w, len(text.encode("utf-8")), fmt
    data = bytes(w.value)
    if alt is None:
        own = png_description(data)
        alt = f"{own}. Shown for {settings}." if own else f"Picture for {settings}."
    fmt, data = compact_image(data, image_format)
    style = "max-width:100%;height:auto" + (f";width:{w.width}" if w.width else "")
    # the smallest text of a figure, and the pixel density it was drawn at: the site's tests
    # compute from them how large that text is on a reader's screen
    data_text = (f' data-text-px="{w.text_px:.1f}" data-density="{w.density}"'
                 if w.text_px is not None else "")
    value = (f'<img src="data:image/{fmt};base64,{base64.b64encode(data).decode("ascii")}" '
             f'alt="{html.escape(alt.strip(), quote=True)}" style="{style}"{data_text}>')
    return ipywidgets.HTML(value=value), len(value.encode("utf-8")), fmt


class StaticWidget(ipywidgets.VBox):
    """The widget :func:`static_widget` returns: controls, nested frame Stacks, caption.

    Attributes (for tests and for chapter code that wants to inspect it):

    ``controls``  dict name -> selection widget, in grid order
    ``stacks``    list, one entry per control, of the Stacks at that nesting level
    ``links``     the :func:`ipywidgets.jslink` objects, (control.index -> stack.selected_index)
    ``frames``    dict index tuple -> frame widget (``ipywidgets.HTML``: an ``<svg role="img">``
                  or an ``<img alt=...>``, each with its text alternative)
    ``nbytes``    embedded size of all frames in bytes (images counted base64-encoded)
    ``formats``   set of frame formats used ("svg", "png", "webp")
    """

    def _summary(self) -> str:
        shape = ", ".join(f"{name}={len(c.options)}" for name, c in self.controls.items())
        fmt = "+".join(sorted(self.formats))
        narrow = ", each also narrow" if self.narrow else ""
        return f"StaticWidget({shape}; {len(self.frames)} {fmt} frames{narrow})"

    # A short, deterministic text/plain: it is what the committed notebook stores for the
    # widget's output, and what nbval compares (the widget-view JSON holds random model ids
    # and is never compared).
    def __repr__(self) -> str:
        return self._summary()

    def current_frame(self) -> ipywidgets.Widget:
        """The frame the Python-side selection points at (mirrors what the browser shows)."""
        key = tuple(c.index for c in self.controls.values())
        return self.frames[key]


def static_widget(
    render: Callable[..., Any],
    controls: Mapping[str, Sequence[Any] | Control],
    caption: str | None = None,
    *,
    alt: Callable[..., str] | None = None,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    dpi: int = 80,
    hidpi: bool = True,
    colors: int | None = 256,
    image_format: str = "auto",
    narrow: Callable[..., Any] | None = None,
) -> StaticWidget:
    """Render ``render(**values)`` over the whole grid of ``controls``, frames switched in JS.

    Parameters
    ----------
    render:
        Called once per grid point with one keyword argument per control (the control's
        *value*, not its label). Returns an SVG string, PNG bytes, or a matplotlib Figure
        (rendered to a PNG at ``dpi`` and closed).
    controls:
        Ordered mapping ``name -> values`` (a list of values or of ``(label, value)``
        pairs), or ``name -> Control(...)`` to choose the kind of control. The first control
        is the outermost Stack level.
    caption:
        HTML shown under the frames: tell the reader what to look for. Required in spirit;
        pass ``None`` only for widgets whose surrounding text already says it. Math in the
        caption is typeset by MathJax: write it as ``\\(\\gamma\\)`` (``$`` is not a math
        delimiter outside the notebook's markdown cells).
    alt:
        The text alternative of each frame (what a screen reader says, what shows when
        images are off): called like ``render``, with the values, it returns one plain
        sentence saying what that frame shows. Without it a frame's text alternative is its
        own description -- an SVG's ``<title>``, a PNG's ``Description`` text (which
        :func:`figure_to_png` writes from a figure's titles and axis labels) -- followed by
        the control settings that select the frame.
    max_frames, max_bytes:
        Page-weight guard; see :data:`DEFAULT_MAX_FRAMES`, :data:`DEFAULT_MAX_BYTES`.
    dpi:
        Resolution of matplotlib figures as displayed (pixels per inch on the page): a font
        of ``p`` points is ``p * dpi / 72`` px, so at the default 80 write at least 9 pt.
    hidpi:
        Render matplotlib figures with twice the pixels (sharp on HiDPI screens) and display
        them at their ``dpi`` size.
    colors:
        Palette size of matplotlib frames (see :func:`figure_to_png`; ``None``: full RGBA).
    image_format:
        How raster frames are embedded: ``"auto"`` (the smaller of the PNG and a lossless
        WebP of the same pixels), ``"webp"`` or ``"png"``; see :func:`compact_image`.
    narrow:
        The layout for narrow screens (a phone): called like ``render``, it returns the same
        frame drawn for a column of about :data:`NARROW_WIDTH_PX` pixels, so that its text is
        as large on a phone as on a desktop (a frame drawn for the desktop column is scaled
        down by about half there). Below :data:`NARROW_SCREEN_PX` of screen width the page
        shows these frames instead: a raster frame as the ``<source>`` of a ``<picture>``
        (the browser fetches only the one it shows), an SVG frame as a second ``<svg>`` that
        the stylesheet shows instead of the first. Both count in ``max_bytes``.

    Returns
    -------
    StaticWidget
        A :class:`ipywidgets.VBox` of the controls, the frames and the caption. Display it
        as the last expression of a cell. Its text form (what nbval compares) is a short
        summary such as ``StaticWidget(norm=4, groups=3; 12 svg frames)``.
    """
    if not callable(render):
        raise TypeError("render must be callable")
    check_image_format(image_format)  # before any frame is rendered
    if not isinstance(controls, Mapping) or not controls:
        raise ValueError("controls must be a non-empty mapping name -> values")
    specs: dict[str, Control] = {}
    for name, spec in controls.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"control names must be Python identifiers (they are keyword arguments), got {name!r}")
        specs[name] = spec if isinstance(spec, Control) else Control(spec)

    names = list(specs)
    sizes = [len(specs[n]) for n in names]
    n_frames = math.prod(sizes)
    if n_frames > max_frames:
        raise WidgetBudgetError(
            f"static_widget: the grid {' x '.join(f'{n}={s}' for n, s in zip(names, sizes))} "
            f"has {n_frames} frames, more than max_frames={max_frames}. Every frame ships with "
            "the page (budget 3 MB per page): use fewer values per control, or raise "
            "max_frames if the frames are tiny."
        )

    # 1. render every frame
    frames: dict[tuple[int, ...], ipywidgets.Widget] = {}
    formats: set[str] = set()
    total = 0
    for key in itertools.product(*(range(s) for s in sizes)):
        kwargs = {n: specs[n].items[i] for n, i in zip(names, key)}
        w, nbytes, fmt = _frame(render(**kwargs), key, dpi, hidpi, colors)
        settings = "; ".join(f"{specs[n].description or n}: {specs[n].labels[i]}" for n, i in zip(names, key))
        text = alt(**kwargs) if alt is not None else None
        w, nbytes, fmt = _with_text_alternative(w, fmt, text, settings, image_format)
        if narrow is not None:
            nw, nbytes2, nfmt = _frame(narrow(**kwargs), key, dpi, hidpi, colors)
            nw, nbytes2, nfmt = _with_text_alternative(nw, nfmt, text, settings, image_format)
            w = with_narrow_variant(w, fmt, nw, nfmt, key)
            nbytes += nbytes2
        w.add_class("normcore-frame")
        total += nbytes
        if total > max_bytes:
            raise WidgetBudgetError(
                f"static_widget: frames exceed max_bytes={max_bytes} after {len(frames) + 1} of "
                f"{n_frames} frames ({total} bytes so far, ~{total * n_frames // (len(frames) + 1)} "
                "projected). Use smaller figures (figsize, dpi), SVG for diagrams, or fewer values."
            )
        frames[key] = w
        formats.add(fmt)

    # 2. nested Stacks, one level per control
    control_widgets = {n: specs[n].make_widget(n) for n in names}
    stacks: list[list[ipywidgets.Stack]] = [[] for _ in names]

    def build(level: int, prefix: tuple[int, ...]) -> ipywidgets.Stack:
        if level == len(names) - 1:
            children = [frames[prefix + (i,)] for i in range(sizes[level])]
        else:
            children = [build(level + 1, prefix + (i,)) for i in range(sizes[level])]
        stack = ipywidgets.Stack(children=children, selected_index=specs[names[level]].index)
        stacks[level].append(stack)
        return stack

    root = build(0, ())
    root.add_class("normcore-frames")

    # 3. tie each control to every Stack of its level, in the browser
    links = [
        ipywidgets.jslink((control_widgets[n], "index"), (stack, "selected_index"))
        for level, n in enumerate(names)
        for stack in stacks[level]
    ]

    children: list[ipywidgets.Widget] = [
        ipywidgets.VBox(list(control_widgets.values())).add_class("normcore-controls"),
        root,
    ]
    if narrow is not None:
        # which SVG layout shows: here, not only in the book's stylesheet, so that a notebook
        # in JupyterLab shows one layout too
        children.append(ipywidgets.HTML(value=NARROW_STYLE).add_class("normcore-narrow-style"))
    if caption:
        children.append(
            ipywidgets.HTMLMath(value=f'<div class="normcore-caption">{caption}</div>').add_class(
                "normcore-caption-box"
            )
        )
    box = StaticWidget(children=children)
    box.add_class("normcore-widget")
    box.controls = control_widgets
    box.stacks = stacks
    box.links = links
    box.frames = frames
    box.nbytes = total
    box.formats = formats
    box.narrow = narrow is not None
    box.specs = specs
    return box

