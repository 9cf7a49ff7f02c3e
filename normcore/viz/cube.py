r"""The N x C x (H·W) cube of the Group Normalization paper, drawn as a small SVG.

Wu & He (2018, Figure 2) draw an activation tensor as a cube with one axis for the samples
``N``, one for the channels ``C`` and one for the spatial positions ``H·W`` (height and width
flattened into one axis), and shade the elements that share one mean and one variance with a
chosen element :math:`x_i`: the set :math:`S_i` of

.. math::

    y_i = \gamma\,\frac{x_i - \mu_i}{\sqrt{\sigma_i^2 + \epsilon}} + \beta, \qquad
    \mu_i = \frac{1}{|S_i|}\sum_{k\in S_i} x_k, \qquad
    \sigma_i^2 = \frac{1}{|S_i|}\sum_{k\in S_i} (x_k - \mu_i)^2 .

:func:`cube_svg` draws that cube for one norm and one element :math:`i = (n, c, s)`.  Which
cells are shaded is *read* from :func:`normcore.axes.stat_groups` (a label array in which
equal labels share statistics): this module never describes a norm itself.  Given a sample
tensor it also prints :math:`|S_i|`, :math:`\mu_i`, :math:`\sigma_i^2` and :math:`y_i`,
computed by :func:`normcore.functional.normalize` (:func:`set_statistics`).

The drawing
-----------
A solid cube hides most of its cells, and a set such as "channel 2 of sample 1" would be
invisible inside it.  So the cube is drawn *pulled apart along N*: one slab per sample,
each slab ``C`` cells wide, ``H·W`` cells tall and one cell deep, the slabs receding along
the oblique N axis (sample 0 in front).  Every element is one cell of a slab's front face;
the slabs' top and right faces show the cells (n, c, 0) and (n, C-1, s) again, with the same
shading, so a set reads as a 3-D block, as in the paper.

The SVG is hand-written, with no ``id`` attributes (a page holds many frames; ids would
clash and ``url(#id)`` references would resolve into hidden frames) and one ``<style>``
whose rules are all scoped under the root class ``nc-cube``.  It is readable without colour:
the three kinds of cell differ in lightness *and* outline (other: light, thin grey outline;
:math:`S_i`: mid blue, dark outline; :math:`i`: dark, black outline and a white "i").  A
``<title>`` states the set in words for screen readers.  A frame is 5-7 KB.

Machine-readable structure (what ``tests/test_viz_cube.py`` checks).  Each slab is a
``<g data-n="n">``.  Its faces are drawn whole (the grid of every element), and then every
element of :math:`S_i` again, shaded, as a ``<path>`` with class ``s`` (``i`` for the element
itself):

* front face: ``data-c`` and ``data-s``, the element :math:`(n, c, s)`;
* top face (class ``t``): ``data-c``, the element :math:`(n, c, 0)`;
* right face (class ``r``): ``data-s``, the element :math:`(n, C-1, s)`.

The root ``<svg>`` carries ``data-norm``, ``data-groups`` (GroupNorm only), ``data-element``,
``data-size`` and, with a sample, ``data-mean`` and ``data-var``.
"""
from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch

from .. import axes
from ..functional import normalize

__all__ = ["SetStatistics", "set_mask", "set_statistics", "cube_svg", "cube_panels_svg",
           "MAX_N", "MAX_C", "MAX_S"]

#: The largest tensors the cube is drawn for: it is a diagram, one cell per element.
MAX_N, MAX_C, MAX_S = 8, 16, 16

# --- geometry (px) ------------------------------------------------------------------------
_U = 15               # side of a cell's front face
_TX, _TY = 6, -6      # a slab's depth (one cell) in the oblique projection
_GAP = 9              # vertical gap between consecutive slabs
_SLANT = 0.62         # horizontal over vertical offset of consecutive slabs (the N axis)

# --- style: three states (other, in S_i, element i) x three faces (front, top, right) -----
# Lightness falls from "other" to "S_i" to "i" on every face, and the outlines differ too,
# so the picture survives grayscale printing and colour-vision deficiencies.
_CSS = (
    ".nc-cube{font:12px sans-serif;fill:#222}"
    # a white halo under every label, so the dashed N-axis edges never cross a glyph
    ".nc-cube text{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}"
    ".nc-cube path{fill:#f1f3f5;stroke:#a3abb3;stroke-width:.7}"
    ".nc-cube .top{fill:#e0e4e8}.nc-cube .side{fill:#cfd5db}"
    ".nc-cube .in-set{fill:#86b4ea;stroke:#123f80;stroke-width:1.1}"
    ".nc-cube .top.in-set{fill:#6a9edc}.nc-cube .side.in-set{fill:#5088c8}"
    ".nc-cube .element{fill:#0d3b82;stroke:#000;stroke-width:1.8}"
    ".nc-cube .top.element{fill:#0a2f68}.nc-cube .side.element{fill:#082655}"
    ".nc-cube .axis{stroke:#8a949e;stroke-dasharray:3 3;fill:none}"
    ".nc-cube .on-dark{fill:#fff;stroke:none;font-weight:bold}"
    ".nc-cube .mid{text-anchor:middle}.nc-cube .end{text-anchor:end}"
    ".nc-cube .title{font-weight:bold;font-size:13.5px}.nc-cube .note{fill:#555}"
    ".nc-cube .sub{font-size:11px}.nc-cube .small{font-size:11px;fill:#555}"
)


# ------------------------------------------------------------------------------------------
# which cells: read from normcore.axes
# ------------------------------------------------------------------------------------------
def _check_shape(shape) -> tuple[int, int, int, tuple[int, ...]]:
    if isinstance(shape, torch.Tensor):
        shape = tuple(shape.shape)
    if (isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence)
            or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape)):
        raise TypeError(f"shape must be a sequence of ints (N, C, *spatial), got {shape!r}")
    shape = tuple(int(s) for s in shape)
    if len(shape) < 3:
        raise ValueError(
            f"the cube needs a shape (N, C, *spatial) with at least one spatial dim, got {shape}; "
            f"for an (N, C) input use shape (N, C, 1)")
    N, C = shape[:2]
    S = math.prod(shape[2:])
    if min(shape) < 1:
        raise ValueError(f"every dim of shape must be >= 1, got {shape}")
    if N > MAX_N or C > MAX_C or S > MAX_S:
        raise ValueError(
            f"shape {shape} is too large to draw one cell per element; the cube is a diagram "
            f"for N <= {MAX_N}, C <= {MAX_C}, H·W <= {MAX_S} (got N={N}, C={C}, H·W={S})")
    return N, C, S, shape


def _check_element(element, N: int, C: int, S: int) -> tuple[int, int, int]:
    if (isinstance(element, (str, bytes)) or not isinstance(element, Sequence)
            or len(element) != 3
            or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in element)):
        raise TypeError(
            f"element must be a tuple of three ints (n, c, s), s the flattened spatial index, "
            f"got {element!r}")
    n, c, s = (int(k) for k in element)
    for name, k, size in (("n", n, N), ("c", c, C), ("s", s, S)):
        if not 0 <= k < size:
            raise ValueError(
                f"element {tuple(element)} is outside the tensor: {name}={k} must be in "
                f"0..{size - 1} for N, C, H·W = {N}, {C}, {S}")
    return n, c, s


def _check_groups(norm: str, num_groups) -> int | None:
    axes.check_norm(norm)
    if norm == "group":
        if num_groups is None:
            raise ValueError("GroupNorm needs num_groups (a divisor of C)")
        if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral):
            raise TypeError(f"num_groups must be an int, got {num_groups!r}")
        return int(num_groups)
    if num_groups is not None:
        raise ValueError(
            f"num_groups={num_groups!r} applies to GroupNorm only; pass num_groups=None for "
            f"{axes.TITLES[norm]}")
    return None


def _labels3(norm: str, shape: tuple[int, ...], num_groups: int | None) -> torch.Tensor:
    """``stat_groups`` of ``norm`` for ``shape``, viewed as (N, C, H·W)."""
    N, C = shape[:2]
    return axes.stat_groups(norm, shape, num_groups).reshape(N, C, -1)


def set_mask(norm: str, shape, element, num_groups: int | None = None) -> torch.Tensor:
    """Boolean ``(N, C, H·W)`` mask of :math:`S_i` for ``element = (n, c, s)``.

    It is ``labels == labels[n, c, s]`` for the label array of
    :func:`normcore.axes.stat_groups`: the elements that share :math:`x_i`'s statistics.
    """
    N, C, S, shape = _check_shape(shape)
    G = _check_groups(norm, num_groups)
    n, c, s = _check_element(element, N, C, S)
    labels = _labels3(norm, shape, G)
    return labels == labels[n, c, s]


class SetStatistics(NamedTuple):
    """The set :math:`S_i` of one element and its statistics on a sample tensor."""

    element: tuple[int, int, int]
    mask: torch.Tensor   # (N, C, H·W) bool
    size: int            # |S_i|
    mean: float          # mu_i
    var: float           # sigma_i^2, biased (divided by |S_i|)
    x: float             # x_i
    y: float             # y_i with gamma = 1, beta = 0


def set_statistics(x: torch.Tensor, norm: str, element, num_groups: int | None = None,
                   eps: float = 1e-5) -> SetStatistics:
    r""":math:`S_i`, :math:`\mu_i`, :math:`\sigma_i^2` and :math:`y_i` for one element of ``x``.

    The statistics come from :func:`normcore.functional.normalize` on
    :func:`normcore.axes.layout` (the code path of every norm in the package), broadcast back
    to ``x``'s shape and read at ``element``; ``y`` is the normalized value without affine
    parameters (:math:`\gamma = 1, \beta = 0`).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("x must be a floating-point torch.Tensor of shape (N, C, *spatial)")
    N, C, S, shape = _check_shape(x.shape)
    G = _check_groups(norm, num_groups)
    n, c, s = _check_element(element, N, C, S)
    lay = axes.layout(norm, shape, G)
    out = normalize(x, lay, eps)
    mean = out.mean.expand(lay.view_shape).reshape(N, C, S)
    var = out.var.expand(lay.view_shape).reshape(N, C, S)
    labels = _labels3(norm, shape, G)
    mask = labels == labels[n, c, s]
    return SetStatistics((n, c, s), mask, int(mask.sum()), float(mean[n, c, s]),
                         float(var[n, c, s]), float(x.reshape(N, C, S)[n, c, s]),
                         float(out.output.reshape(N, C, S)[n, c, s]))


# ------------------------------------------------------------------------------------------
# words
# ------------------------------------------------------------------------------------------
def _span(idx: list[int], total: int, one: str, many: str) -> str:
    """'channel 2', 'channels 2-3', 'all 6 channels' (en dash), from a sorted index list."""
    if len(idx) == total and total > 1:
        return f"all {total} {many}"
    if len(idx) == 1:
        return f"{one} {idx[0]}"
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"{many} {idx[0]}\u2013{idx[-1]}"
    return f"{many} {', '.join(map(str, idx))}"


def _extent(mask: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
    """The distinct n, c and s indices of a (N, C, S) mask."""
    return tuple(sorted(set(mask.nonzero()[:, d].tolist())) for d in range(3))



def _num(v: float) -> str:
    """3 decimals, a true minus sign, no negative zero."""
    text = f"{v:.3f}"
    if text in ("-0.000",):
        text = "0.000"
    return text.replace("-", "\u2212")


def _norm_title(norm: str, G: int | None) -> str:
    return axes.TITLES[norm] + (f", G = {G}" if norm == "group" else "")


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


# ------------------------------------------------------------------------------------------
# drawing
# ------------------------------------------------------------------------------------------
def _cube_geometry(S: int):
    dy = S * _U - _TY + _GAP                  # vertical offset between slabs
    dx = round(dy * _SLANT)                   # horizontal offset: the oblique N axis
    return dx, dy


def _cube_size(N: int, C: int, S: int, left: int = 34, bottom: int = 34) -> tuple[int, int]:
    dx, dy = _cube_geometry(S)
    width = left + (N - 1) * dx + C * _U + _TX + 40      # 40: the "n = k" labels
    height = (N - 1) * dy + S * _U - _TY + bottom
    return width, height


def _cube(labels: torch.Tensor, element: tuple[int, int, int], ox: int, oy: int,
          left: int = 34) -> list[str]:
    """SVG fragments of the exploded cube, its top-left corner at (ox, oy)."""
    N, C, S = labels.shape
    n0, c0, s0 = element
    mask = labels == labels[n0, c0, s0]
    dx, dy = _cube_geometry(S)
    X0 = ox + left                            # front face of slab 0, top-left corner
    Y0 = oy - _TY + (N - 1) * dy
    W, H = C * _U, S * _U

    def state(n: int, c: int, s: int) -> str:
        if (n, c, s) == element:
            return "element"
        return "in-set" if mask[n, c, s] else ""

    out = []
    # the N axis: dashed edges of the un-exploded cube, from slab 0 to slab N-1
    if N > 1:
        bx, by = (N - 1) * dx + _TX, -(N - 1) * dy + _TY
        d = "".join(f"M{X0 + x} {Y0 + y}l{bx} {by}" for x, y in ((0, 0), (W, 0), (W, H), (0, H)))
        out.append(f'<path class="axis" d="{d}"/>')
        # axis label, along the dashed edge through the slabs' top-left corners
        ang = math.degrees(math.atan2(by, bx))
        lx, ly = X0 + bx / 2 - 9, Y0 + by / 2 - 4
        out.append(f'<text class="mid" transform="translate({lx:.0f} {ly:.0f}) rotate({ang:.0f})">'
                   f'N (samples) \u2192</text>')
    for n in reversed(range(N)):                      # back to front
        x0, y0 = X0 + n * dx, Y0 - n * dy
        # one group per sample, translated: the coordinates inside are small numbers
        out.append(f'<g data-n="{n}" transform="translate({x0} {y0})">')
        # top and right faces: drawn whole, with the cell edges, then the cells of S_i on
        # them again, shaded (the top face shows the elements (n, c, 0), the right face the
        # elements (n, C-1, s))
        top = "".join(f"M{c * _U} 0l{_TX} {_TY}" for c in range(1, C))
        right = "".join(f"M{W} {s * _U}l{_TX} {_TY}" for s in range(1, S))
        out.append(f'<path class="top" d="M0 0l{_TX} {_TY}h{W}l{-_TX} {-_TY}z{top}"/>')
        out.append(f'<path class="side" d="M{W} 0l{_TX} {_TY}v{H}l{-_TX} {-_TY}z{right}"/>')
        for c in range(C):
            if state(n, c, 0):
                out.append(f'<path class="top {state(n, c, 0)}" data-c="{c}" '
                           f'd="M{c * _U} 0l{_TX} {_TY}h{_U}l{-_TX} {-_TY}z"/>')
        for s in range(S):
            if state(n, C - 1, s):
                out.append(f'<path class="side {state(n, C - 1, s)}" data-s="{s}" '
                           f'd="M{W} {s * _U}l{_TX} {_TY}v{_U}l{-_TX} {-_TY}z"/>')
        # front face: drawn whole with its grid, then every element of S_i on it again,
        # shaded and tagged with its (n, c, s)
        grid = ("".join(f"M{c * _U} 0v{H}" for c in range(1, C))
                + "".join(f"M0 {s * _U}h{W}" for s in range(1, S)))
        out.append(f'<path d="M0 0h{W}v{H}h{-W}z{grid}"/>')
        for c in range(C):
            for s in range(S):
                if state(n, c, s):
                    out.append(f'<path class="{state(n, c, s)}" data-c="{c}" data-s="{s}" '
                               f'd="M{c * _U} {s * _U}h{_U}v{_U}h{-_U}z"/>')
        # at the bottom right, where the dashed edge through the slab corners is still left of it
        out.append(f'<text x="{W + _TX + 4}" y="{H}">n = {n}</text></g>')
    # the element itself: a white "i" on its (dark) front cell
    out.append(f'<text class="mid on-dark" x="{X0 + n0 * dx + c0 * _U + _U // 2 + 1}" '
               f'y="{Y0 - n0 * dy + s0 * _U + _U // 2 + 4}">i</text>')
    # the C and H·W axes, with indices, on slab 0 (one <text>, one position per glyph); the
    # arrows point the way the index grows (the H·W label reads upwards, its arrow points down)
    out.append(_indices([X0 + c * _U + _U // 2 + 1 for c in range(C)], [Y0 + H + 12] * C, "mid note"))
    out.append(_indices([X0 - 4] * S, [Y0 + s * _U + _U // 2 + 4 for s in range(S)], "end note"))
    out.append(f'<text class="mid" x="{X0 + W // 2}" y="{Y0 + H + 27}">C (channels) \u2192</text>')
    out.append(f'<text class="mid" transform="translate({X0 - 17} {Y0 + H // 2}) rotate(-90)">'
               f'\u2190 H\u00b7W (positions)</text>')
    return out



def _indices(xs: list[int], ys: list[int], cls: str) -> str:
    """Index labels 0, 1, 2, ... as one <text>: a list of glyph positions when every index is
    one digit, otherwise one <tspan> per index."""
    k = len(xs)
    if k <= 10:
        return (f'<text class="{cls}" x="{" ".join(map(str, xs))}" y="{" ".join(map(str, ys))}">'
                + "".join(map(str, range(k))) + "</text>")
    return (f'<text class="{cls}">' + "".join(
        f'<tspan x="{x}" y="{y}">{j}</tspan>' for j, (x, y) in enumerate(zip(xs, ys))) + "</text>")


def _svg(width: int, height: int, title: str, body: list[str], attrs: dict[str, str]) -> str:
    data = "".join(f' data-{k}="{_esc(v)}"' for k, v in attrs.items())
    # path data needs no space before a minus sign: "l5 -5" is "l5-5"
    body = [re.sub(r'( d="[^"]*")', lambda m: m.group(1).replace(" -", "-"), b) for b in body]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="nc-cube" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'style="max-width:100%;height:auto;background:#fff"{data}>'
        f"<title>{_esc(title)}</title><style>{_CSS}</style>" + "".join(body) + "</svg>"
    )


def _sub(text: str) -> str:
    """Escape ``text`` and typeset ``_i`` as a subscript i (a <tspan>; U+1D62 is missing from
    many fonts).  The text after it goes in a second <tspan> that moves the baseline back."""
    head, *rest = text.split("_i")
    out = _esc(head)
    for part in rest:
        out += '<tspan class="sub" dy="3">i</tspan>'
        if part:
            out += f'<tspan dy="-3">{_esc(part)}</tspan>'
    return out


def _legend(x: int, y: int) -> list[str]:
    """Three swatches, each drawn in the style of the cells it names."""
    rows = (("", "other elements"), ("in-set", "in S_i: they share \u03bc_i, \u03c3_i\u00b2"),
            ("element", "the element i"))
    out = []
    for k, (cls, text) in enumerate(rows):
        yy = y + 19 * k
        c = f' class="{cls}"' if cls else ""
        out.append(f'<path{c} d="M{x} {yy}h{_U}v{_U}h{-_U}z"/>')
        out.append(f'<text x="{x + _U + 6}" y="{yy + 12}">{_sub(text)}</text>')
    return out


def cube_svg(norm: str, element=(0, 0, 0), num_groups: int | None = None, *,
             shape=(4, 6, 4), x: torch.Tensor | None = None, eps: float = 1e-5,
             note: str | None = None, narrow: bool = False) -> str:
    r"""The exploded N x C x (H·W) cube with :math:`S_i` of ``element`` shaded, as SVG text.

    Parameters
    ----------
    norm:
        ``"batch"``, ``"layer"``, ``"instance"`` or ``"group"`` (:data:`normcore.axes.NORMS`).
    element:
        :math:`i = (n, c, s)`, ``s`` the flattened spatial index ``h * W + w``.
    num_groups:
        For ``"group"`` only (required there): a divisor of ``C``.
    shape:
        ``(N, C, *spatial)``; spatial dims are drawn flattened.  Ignored when ``x`` is given.
    x:
        A sample tensor.  With it, a panel beside the cube shows :math:`|S_i|`,
        :math:`\mu_i`, :math:`\sigma_i^2` (biased), :math:`x_i` and :math:`y_i`
        (:func:`set_statistics`); without it, only :math:`|S_i|`.
    eps:
        :math:`\epsilon` for :math:`y_i`.
    note:
        One extra line of plain text under the panel (e.g. which controls do nothing here).
    narrow:
        A phone's layout: the panel under the cube, the picture about 320 px wide.

    Returns
    -------
    str
        A standalone ``<svg>`` document (a few KB), with a ``<title>`` for screen readers.
    """
    G = _check_groups(norm, num_groups)
    if x is not None:
        st = set_statistics(x, norm, element, G, eps)
        N, C, S, shape = _check_shape(x.shape)
        mask = st.mask
    else:
        N, C, S, shape = _check_shape(shape)
        mask = set_mask(norm, shape, element, G)
        st = None
    e = _check_element(element, N, C, S)
    labels = _labels3(norm, shape, G)
    ns, cs, ss = _extent(mask)
    size = int(mask.sum())
    where = (f"{_span(cs, C, 'channel', 'channels')} of "
             f"{_span(ns, N, 'sample', 'samples')}, {_span(ss, S, 'position', 'positions')}")
    title = (f"{_norm_title(norm, G)} on an N\u00d7C\u00d7H\u00b7W = {N}\u00d7{C}\u00d7{S} tensor. "
             f"The set S_i of element i = (n={e[0]}, c={e[1]}, s={e[2]}) is {where}: "
             f"|S_i| = {size} elements")
    if st is not None:
        title += f", mean {_num(st.mean)}, variance {_num(st.var)}"
    title += "."

    top = 26
    cw, ch = _cube_size(N, C, S)
    body = [f'<text class="title" x="8" y="17">{_esc(_norm_title(norm, G))}</text>']
    body += _cube(labels, e, 4, top)
    px, py = (8, top + ch) if narrow else (cw + 18, top + 6)    # the panel: under, or beside
    lines = [(f"element i = (n={e[0]}, c={e[1]}, s={e[2]})", "")]
    lines.append(("S_i = " + where, ""))
    factors = " \u00d7 ".join(str(len(v)) for v in (ns, cs, ss))
    box = len(ns) * len(cs) * len(ss) == size            # every S_i here is a box
    lines.append((f"|S_i| = {factors} = {size}" if box else f"|S_i| = {size}", "title"))
    if box:
        lines.append(("(samples \u00d7 channels \u00d7 positions)", "small"))
    if st is not None:
        lines.append((f"\u03bc_i = {_num(st.mean)}", "title"))
        lines.append((f"\u03c3_i\u00b2 = {_num(st.var)}", "title"))
        lines.append((f"x_i = {_num(st.x)} \u2192 y_i = {_num(st.y)}", ""))
    yy = py
    panel = []
    for text, cls in lines:
        yy += {"title": 20, "small": 13}.get(cls, 18)
        if ", " in text and len(text) > 34:
            # wrap "S_i = channels 2–3 of sample 1, all 4 positions" after the comma
            head, tail = text.split(", ", 1)
            panel.append(f'<text x="{px}" y="{yy}">{_sub(head)},</text>')
            yy += 15
            panel.append(f'<text x="{px + 12}" y="{yy}">{_sub(tail)}</text>')
            continue
        c = f' class="{cls}"' if cls else ""
        panel.append(f'<text{c} x="{px}" y="{yy}">{_sub(text)}</text>')
    panel += _legend(px, yy + 16)
    yy += 16 + 3 * 19
    if note:
        yy += 14
        panel.append(f'<text class="note" x="{px}" y="{yy}">{_esc(note)}</text>')
    body += panel
    # a note longer than the 225 px panel widens the picture (12 px text: <= 7 px a character)
    panel_w = max(225, 7 * len(note) + 8) if note else 225
    width = max(cw + 8, px + panel_w) if narrow else px + panel_w
    height = max(top + ch, yy + 8)
    attrs = {"norm": norm, "element": f"{e[0]},{e[1]},{e[2]}", "size": str(size)}
    if G is not None:
        attrs["groups"] = str(G)
    if st is not None:
        attrs.update(mean=f"{st.mean:.9g}", var=f"{st.var:.9g}")
    return _svg(width, height, title, body, attrs)


def cube_panels_svg(panels: Sequence[tuple[str, int | None]] = (
                        ("batch", None), ("layer", None), ("instance", None), ("group", 2)),
                    element=(0, 0, 0), *, shape=(4, 6, 4), columns: int | None = None) -> str:
    """Several cubes in one picture, one per ``(norm, num_groups)``, for one element.

    The default is the Group Normalization paper's Figure 2: BatchNorm, LayerNorm,
    InstanceNorm and GroupNorm (here with G = 2), each with :math:`S_i` shaded.  The cubes
    go left to right in rows of ``columns`` (default: all in one row).
    """
    if isinstance(panels, (str, bytes)) or not isinstance(panels, Sequence) or not panels:
        raise TypeError("panels must be a non-empty sequence of (norm, num_groups) pairs")
    columns = len(panels) if columns is None else columns
    if isinstance(columns, bool) or not isinstance(columns, numbers.Integral) or columns < 1:
        raise ValueError(f"columns must be a positive int, got {columns!r}")
    columns = min(int(columns), len(panels))
    N, C, S, shape = _check_shape(shape)
    e = _check_element(element, N, C, S)
    cw, ch = _cube_size(N, C, S, left=26)
    cw -= 12                                  # the "n = k" labels are shortened below
    pw, ph = cw + 24, 44 + ch + 14            # one panel, with its margins
    body, parts = [], []
    for k, (norm, G) in enumerate(panels):
        G = _check_groups(norm, G)
        mask = set_mask(norm, shape, e, G)
        ns, cs, ss = _extent(mask)
        x, y = (k % columns) * pw, (k // columns) * ph
        body.append(f'<text class="title mid" x="{x + cw // 2}" y="{y + 16}">'
                    f'{_esc(_norm_title(norm, G))}</text>')
        body.append(f'<text class="mid note" x="{x + cw // 2}" y="{y + 31}">{_sub("|S_i| = ")}'
                    f'{int(mask.sum())}</text>')
        body += _cube(_labels3(norm, shape, G), e, x, y + 44, left=26)
        parts.append(f"{_norm_title(norm, G)}: {_span(cs, C, 'channel', 'channels')} of "
                     f"{_span(ns, N, 'sample', 'samples')}, "
                     f"{_span(ss, S, 'position', 'positions')} ({int(mask.sum())} elements)")
    body = [b.replace(">n = ", ">n=") for b in body]
    title = (f"The set S_i of element i = (n={e[0]}, c={e[1]}, s={e[2]}) of an "
             f"N\u00d7C\u00d7H\u00b7W = {N}\u00d7{C}\u00d7{S} tensor for each norm. "
             + "; ".join(parts) + ".")
    rows = -(-len(panels) // columns)
    width, height = columns * pw - 24, rows * ph - 14
    return _svg(width, height, title, body, {"element": f"{e[0]},{e[1]},{e[2]}"})
