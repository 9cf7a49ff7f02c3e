"""Draw the book's logo (assets/logo.svg) and favicon (assets/favicon.png).

Both are generated here, from one description of the mark, rather than downloaded:
a dark tile holding a bell curve over five bars, the bars drawn at equal height under the
curve, i.e. "what normalization does to a set of activations".

Run: .venv/bin/python tools/make_brand_assets.py   (the outputs are committed)
"""

from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
TILE = "#1f4e79"  # dark blue tile
INK = "#ffffff"
ACCENT = "#f2a541"  # the highlighted set S_i


def _curve_points(x0: float, x1: float, base: float, height: float, n: int = 48):
    """Points of a Gaussian bump from x0 to x1 (±3 sigma), peak `height` above `base`."""
    pts = []
    for k in range(n + 1):
        t = -3.0 + 6.0 * k / n
        x = x0 + (x1 - x0) * k / n
        y = base - height * math.exp(-0.5 * t * t)
        pts.append((x, y))
    return pts


def _bars(x0: float, x1: float, base: float, h: float, n: int = 5):
    """n equal bars between x0 and x1, height h, sitting on base."""
    w = (x1 - x0) / (2 * n - 1)
    return [(x0 + 2 * k * w, base - h, x0 + 2 * k * w + w, base) for k in range(n)]


def logo_svg() -> str:
    s = 64  # tile size in SVG units
    curve = _curve_points(8, 56, 40, 28)
    path = "M " + " L ".join(f"{x:.2f} {y:.2f}" for x, y in curve)
    bars = _bars(12, 52, 54, 9)
    rects = "\n".join(
        f'    <rect x="{a:.2f}" y="{b:.2f}" width="{c - a:.2f}" height="{d - b:.2f}" '
        f'fill="{ACCENT if k == 2 else INK}"/>'
        for k, (a, b, c, d) in enumerate(bars)
    )
    return f"""<svg xmlns="http://www.w3.org/2000/svg" width="244" height="{s}" viewBox="0 0 244 {s}" role="img" aria-label="normcore">
  <title>normcore</title>
  <rect x="0" y="0" width="{s}" height="{s}" rx="10" fill="{TILE}"/>
  <path d="{path}" fill="none" stroke="{INK}" stroke-width="3.5" stroke-linejoin="round" stroke-linecap="round"/>
  <g>
{rects}
  </g>
  <text x="76" y="42" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="30" font-weight="600" fill="{TILE}">normcore</text>
</svg>
"""  # noqa: E501 - the SVG's lines as the committed logo has them


def favicon_png(size: int = 64) -> Image.Image:
    scale = 4  # draw large, downsample for anti-aliasing
    big = size * scale
    f = big / 64.0
    img = Image.new("RGBA", (big, big), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle([0, 0, big - 1, big - 1], radius=int(10 * f), fill=TILE)
    pts = [(x * f, y * f) for x, y in _curve_points(8, 56, 40, 28)]
    d.line(pts, fill=INK, width=int(4.5 * f), joint="curve")
    for k, (a, b, c, e) in enumerate(_bars(12, 52, 54, 9)):
        d.rectangle([a * f, b * f, c * f, e * f], fill=ACCENT if k == 2 else INK)
    return img.resize((size, size), Image.LANCZOS)


def main() -> None:
    (ROOT / "assets").mkdir(exist_ok=True)
    (ROOT / "assets" / "logo.svg").write_text(logo_svg(), encoding="utf-8")
    favicon_png(64).save(ROOT / "assets" / "favicon.png", optimize=True)
    print("wrote assets/logo.svg and assets/favicon.png")


if __name__ == "__main__":
    main()
