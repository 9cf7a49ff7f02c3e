r"""The GroupNorm chapter's group explorer: the cube with :math:`S_i` shaded, and the
histogram of the normalized values of that set, for one group count ``G``.

A frame is one SVG: on top :func:`normcore.viz.cube.cube_svg` for GroupNorm with
``num_groups = G`` (the set read from :func:`normcore.axes.stat_groups`, the statistics from
:func:`normcore.functional.normalize`), under it a histogram of
:math:`\hat x_k = (x_k - \mu_i)\, r_i` for every :math:`k \in S_i`, drawn by hand (bars and
axis labels, no matplotlib).  At ``G = 1`` the note under the panel names the identity
"= LayerNorm over (C, H, W)", at ``G = C`` "= InstanceNorm".

Machine-readable structure (what ``tests/test_viz_group.py`` checks): the root ``<svg>``
carries ``data-groups``, ``data-element``, ``data-size`` (:math:`|S_i|`) and
``data-identity`` (``"layer"``, ``"instance"`` or ``""``); each histogram bar is a
``<rect class="bar" data-count="k">``.
"""
from __future__ import annotations

import html

import torch

from .. import axes
from ..functional import normalize
from .cube import _sub, cube_svg

__all__ = ["identity_of", "group_values", "group_explorer_svg", "HIST_EDGES"]

#: Bin edges of the histogram of normalized values (values outside are clamped in).
HIST_EDGES = tuple(-2.5 + 0.5 * k for k in range(11))

_HW, _HH = 230, 150          # the histogram's plot area (px)
_XLABEL = _sub("x\u0302 = (x \u2212 \u03bc_i) r_i")


def identity_of(num_groups: int, num_channels: int) -> str:
    """``"layer"`` when G = 1, ``"instance"`` when G = C (C > 1), else ``""``."""
    G = axes.check_num_groups(num_groups, num_channels)
    if G == 1:
        return "layer"
    if G == num_channels:
        return "instance"
    return ""


def group_values(x: torch.Tensor, num_groups: int, element) -> torch.Tensor:
    r"""The normalized values :math:`\hat x_k` of every :math:`k \in S_i` (GroupNorm,
    no affine), for ``element = (n, c, s)`` with ``s`` the flattened spatial index."""
    lay = axes.layout("group", x.shape, num_groups)
    xhat = normalize(x, lay, 1e-5).output
    N, C = x.shape[:2]
    labels = axes.stat_groups("group", x.shape, num_groups).reshape(N, C, -1)
    n, c, s = element
    mask = labels == labels[n, c, s]
    return xhat.reshape(N, C, -1)[mask]


def _counts(values: torch.Tensor) -> list[int]:
    v = values.clamp(HIST_EDGES[0], HIST_EDGES[-1] - 1e-9)
    idx = torch.floor((v - HIST_EDGES[0]) / 0.5).long()
    return [int((idx == k).sum()) for k in range(len(HIST_EDGES) - 1)]


def group_explorer_svg(x: torch.Tensor, num_groups: int, element=(0, 0, 0), *,
                       narrow: bool = False) -> str:
    """One frame of the group explorer (see the module docstring), as SVG text.
    ``narrow``: the phone layout, the cube's panel under it (:func:`cube_svg`), about 310 px
    wide, so that its text keeps its size in a phone's column."""
    N, C = x.shape[:2]
    identity = identity_of(num_groups, C)
    note = {"layer": "G = 1: this is LayerNorm over (C, H, W)",
            "instance": "G = C: this is InstanceNorm"}.get(identity)
    cube = cube_svg("group", element, num_groups, x=x, note=note, narrow=narrow)
    head = cube[:cube.index(">") + 1]
    cw = int(float(head.split('width="')[1].split('"')[0]))
    ch = int(float(head.split('height="')[1].split('"')[0]))
    values = group_values(x, num_groups, element)
    counts = _counts(values)
    top = max(max(counts), 1)
    # the histogram goes under the cube, so that the frame stays narrow enough to be shown at
    # full size (its text >= 10 px) in the book's column
    left, y0 = 60, ch + 40
    body = [(f'<text x="{left - 30}" y="{ch + 22}" style="font:bold 13.5px sans-serif;fill:#222">'
             f'{_sub(f"normalized values of S_i ({len(values)})")}</text>')]
    bw = _HW / len(counts)
    for k, cnt in enumerate(counts):
        h = _HH * cnt / top
        body.append(f'<rect class="bar" data-count="{cnt}" x="{left + k * bw + 1:.1f}" '
                    f'y="{y0 + _HH - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
                    f'style="fill:#5088c8;stroke:#123f80;stroke-width:1"/>')
    axis = "font:11.5px sans-serif;fill:#222"
    body.append(f'<path d="M{left} {y0 + _HH}h{_HW}M{left} {y0}v{_HH}" '
                f'style="stroke:#444;fill:none"/>')
    for k, edge in enumerate(HIST_EDGES):
        if k % 2 == 1:
            xx = left + k * bw
            label = f"{edge:g}".replace("-", "\u2212")
            body.append(f'<text x="{xx:.1f}" y="{y0 + _HH + 15}" text-anchor="middle" '
                        f'style="{axis}">{label}</text>')
    body.append(f'<text x="{left + _HW / 2:.0f}" y="{y0 + _HH + 32}" text-anchor="middle" '
                f'style="{axis}">{_XLABEL}</text>')
    body.append(f'<text x="{left - 6}" y="{y0 + 4}" text-anchor="end" style="{axis}">{top}</text>')
    body.append(f'<text x="{left - 6}" y="{y0 + _HH}" text-anchor="end" style="{axis}">0</text>')
    mean = float(values.mean())
    std = float(values.var(correction=0).sqrt())
    body.append(f'<text x="{left}" y="{y0 + _HH + 52}" style="{axis}">mean '
                f'{mean:.3f}, std {std:.3f}</text>'.replace("-0.000", "0.000"))
    width = max(cw, left + _HW + 16)
    height = y0 + _HH + 62
    n, c, s = element
    title = (f"GroupNorm with G = {num_groups} on an input with C = {C} channels: the set of "
             f"element (n={n}, c={c}, s={s}) has {len(values)} elements; their normalized "
             f"values have mean {mean:.3f} and standard deviation {std:.3f}."
             + (f" {note}." if note else ""))
    inner = cube.replace('<svg xmlns="http://www.w3.org/2000/svg" ', '<svg x="0" y="0" ', 1)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" '
            f'style="max-width:100%;height:auto;background:#fff" data-groups="{num_groups}" '
            f'data-element="{n},{c},{s}" data-size="{len(values)}" data-identity="{identity}">'
            f"<title>{html.escape(title)}</title>" + inner + "".join(body) + "</svg>")
