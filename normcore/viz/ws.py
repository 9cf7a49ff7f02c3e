r"""Pictures for the Weight Standardization chapter.

* :func:`filter_weights`: the seeded depthwise ``3 x 3`` filters the widget shows (4 output
  channels, fan-in :math:`F = 9`: small enough that the conventions differ visibly);
* :func:`standardize_svg`: each output channel's weights as a row of dots, raw
  (:math:`a\mathbf{W} + \delta`) on top and standardized below, with every row's mean and standard
  deviation written beside it, as a hand-written SVG.  The frames of the chapter's
  static-first widget: the top panel moves with the scale :math:`a` and the shift :math:`\delta`,
  the bottom panel does not; the convention changes the bottom panel's spread.

The standardized weights come from :func:`normcore.functional.weight_standardize`; nothing
is restated here.
"""
from __future__ import annotations

import torch

from .. import functional as F

__all__ = ["filter_weights", "standardize_svg"]

_COLORS = ("#1f77b4", "#d62728", "#2a7d2a", "#8c4bb4")


def filter_weights(seed: int = 7) -> torch.Tensor:
    """A seeded ``(4, 1, 3, 3)`` weight: torch's ``Conv2d`` initialization of a depthwise
    ``3 x 3`` conv (``groups = 4``), float64."""
    torch.manual_seed(seed)
    conv = torch.nn.Conv2d(4, 4, 3, groups=4, bias=False, dtype=torch.float64)
    return conv.weight.detach().clone()


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def standardize_svg(scale: float, shift: float, convention: str,
                    weight: torch.Tensor | None = None) -> str:
    """The widget frame as a hand-written SVG (small, sharp at any zoom, quick to draw):
    raw weights ``scale * W + shift`` on top and their standardization in ``convention``
    below, one row of dots per output channel with its mean and (biased) standard deviation
    at the right."""
    w = filter_weights() if weight is None else weight
    raw = scale * w + shift
    what = F.weight_standardize(raw, convention=convention)
    c_out = w.shape[0]
    width, x0, x1, lim, row_h, font = 400, 52, 292, 2.6, 30, 13
    panel_h = 28 + c_out * row_h + 28

    def xpos(v: float) -> float:
        return x0 + (v + lim) / (2 * lim) * (x1 - x0)

    title = (f"Raw weights scaled by {scale:g} and shifted by {shift:g} (top), and their "
             f"'{convention}' weight standardization (bottom), one row per output channel")
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {2 * panel_h + 8}" '
            f'width="{width}" height="{2 * panel_h + 8}" style="max-width: 100%; height: auto" role="img" '
            f'font-family="DejaVu Sans, Arial, sans-serif" font-size="{font}">'),
           f"<title>{_esc(title)}</title>",
           f'<rect width="{width}" height="{2 * panel_h + 8}" fill="#ffffff"/>']
    panels = ((raw, f"raw weights aW + \u03b4   (a = {scale:g}, \u03b4 = {shift:g})"),
              (what, f"standardized, '{convention}'"))
    for p, (vals, head) in enumerate(panels):
        top = p * (panel_h + 8)
        out.append(f'<text x="{x0}" y="{top + 16}" font-weight="bold">{_esc(head)}</text>')
        y_axis = top + 28 + c_out * row_h
        out.append(f'<line x1="{xpos(0):.1f}" y1="{top + 26}" x2="{xpos(0):.1f}" '
                   f'y2="{y_axis}" stroke="#888888" stroke-width="1"/>')
        out.append(f'<line x1="{x0}" y1="{y_axis}" x2="{x1}" y2="{y_axis}" '
                   f'stroke="#444444" stroke-width="1"/>')
        for t in (-2, -1, 0, 1, 2):
            out.append(f'<line x1="{xpos(t):.1f}" y1="{y_axis}" x2="{xpos(t):.1f}" '
                       f'y2="{y_axis + 4}" stroke="#444444"/>')
            out.append(f'<text x="{xpos(t):.1f}" y="{y_axis + 18}" '
                       f'text-anchor="middle">{t}</text>')
        for c in range(c_out):
            y = top + 28 + (c + 0.5) * row_h
            v = vals[c].flatten()
            out.append(f'<text x="{x0 - 8}" y="{y + 4:.1f}" text-anchor="end">c = {c}</text>')
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" '
                       f'stroke="#dddddd" stroke-width="1"/>')
            for value in v.tolist():
                out.append(f'<circle cx="{xpos(max(-lim, min(lim, value))):.1f}" '
                           f'cy="{y:.1f}" r="4.5" fill="{_COLORS[c % 4]}" '
                           f'fill-opacity="0.75"/>')
            mean = round(float(v.mean()), 2) + 0.0
            std = float(v.std(correction=0))
            out.append(f'<text x="{x1 + 8}" y="{y - 2:.1f}">mean {mean:+.2f}</text>')
            out.append(f'<text x="{x1 + 8}" y="{y + 12:.1f}">std {std:.3f}</text>')
    out.append("</svg>")
    return "\n".join(out)
