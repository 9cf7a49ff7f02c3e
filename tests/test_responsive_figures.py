"""Figures with a phone layout (normcore.images.responsive_figure) and the book's extension
that shows it on a phone (assets/sphinx_ext/normcore_figures.py), without a build."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from normcore.images import (FIGURE_NARROW, ResponsiveFigure, narrow_from_svg, png_add_text,
                             png_pop_text, responsive_figure, svg_text_px)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "assets" / "sphinx_ext"))
import normcore_figures  # noqa: E402 - importable once sys.path has its folder


def _draw(narrow: bool, font: float = 9.5):
    fig, ax = plt.subplots(figsize=(3.7, 3.0) if narrow else (8, 3))
    ax.plot([0, 1], [1, 0])
    ax.set_xlabel("step $t$", fontsize=font)
    ax.tick_params(labelsize=font)
    ax.set_title("a title", fontsize=font)
    return fig


def _svg(width: int, font: float) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="100" viewBox="0 0 {width} 100">'
            f'<style>.a{{font:{font}px sans-serif}}</style><text class="a" x="1" y="20">hi</text></svg>')


def test_png_text_chunks_round_trip_and_keep_the_pixels():
    fig = _draw(False)
    from normcore.images import figure_to_png

    png = figure_to_png(fig)
    tagged = png_add_text(png, {"normcore-x": "1,2"})
    back, found = png_pop_text(tagged, ("normcore-x",))
    assert found == {"normcore-x": "1,2"} and back == png
    with pytest.raises(ValueError, match="not a PNG"):
        png_pop_text(b"GIF89a", ("x",))


def test_a_png_figure_carries_its_phone_layout():
    out = responsive_figure(_draw)
    assert isinstance(out, ResponsiveFigure) and out.kind == "png"
    data, meta = out._repr_mimebundle_()
    assert meta["image/png"] == {"width": 640, "height": 240}        # CSS px at dpi 80
    _, found = png_pop_text(data["image/png"], (FIGURE_NARROW,))
    assert found[FIGURE_NARROW]                                       # the phone layout rides along
    assert out.phone_text_px() >= 10
    assert data["text/plain"] == repr(out) and repr(out).startswith("ResponsiveFigure(png: 640x240 px")


def test_a_phone_layout_with_small_text_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"needs 10 px: draw it about 296 px wide .* fonts of at least 9.0 pt"):
        responsive_figure(lambda narrow: _draw(narrow, font=8))
    # drawn for the desktop and reused on a phone: scaled to half, refused
    with pytest.raises(ValueError, match=r"smallest text at 5\.1 px"):
        responsive_figure(lambda narrow: _draw(False))
    with pytest.raises(ValueError, match="both layouts"):
        responsive_figure(lambda narrow: _svg(300, 12) if narrow else _draw(False))
    with pytest.raises(TypeError, match="matplotlib Figure or an SVG"):
        responsive_figure(lambda narrow: 3)


def test_an_svg_figure_carries_its_phone_layout():
    assert svg_text_px(_svg(500, 12)) == 12
    out = responsive_figure(lambda narrow: _svg(300, 11) if narrow else _svg(500, 12))
    svg = out._repr_mimebundle_()[0]["image/svg+xml"]
    wide, narrow, sizes = narrow_from_svg(svg)
    assert wide == _svg(500, 12) and narrow == _svg(300, 11) and sizes == "12.00,11.00"


def _page(tmp_path: Path, fig: ResponsiveFigure, ext: str) -> Path:
    images = tmp_path / "_images"
    images.mkdir()
    data = fig._repr_mimebundle_()[0]
    if ext == "png":
        (images / "f.png").write_bytes(data["image/png"])
    else:
        (images / "f.svg").write_text(data["image/svg+xml"], encoding="utf-8")
    (images / "plain.png").write_bytes(b"\x89PNG\r\n\x1a\nnot read")
    page = tmp_path / "chapters" / "c.html"
    page.parent.mkdir()
    page.write_text(f'<p><img alt="A plot." src="../_images/f.{ext}" style="width: 640px; height: 240px;" />'
                    '<img alt="x" src="../_images/plain.png" /></p>', encoding="utf-8")
    return page


@pytest.mark.parametrize("ext", ["png", "svg"])
def test_the_extension_makes_a_picture_and_takes_the_phone_layout_out(tmp_path, ext):
    fig = responsive_figure(_draw) if ext == "png" else \
        responsive_figure(lambda narrow: _svg(300, 11) if narrow else _svg(500, 12))
    page = _page(tmp_path, fig, ext)
    assert normcore_figures.rewrite_site(tmp_path) == 1
    html = page.read_text(encoding="utf-8")
    assert html.count('<picture class="normcore-figure">') == 1
    assert '<source media="(max-width: 600px)" srcset="../_images/f.narrow.' in html
    assert 'alt="A plot."' in html and "style=" not in html.split("plain.png")[0]
    assert '<img alt="x" src="../_images/plain.png" />' in html      # a figure without one: as it was
    info = json.loads((tmp_path / "_images" / "f.figure.json").read_text())
    assert info["text_px"] == pytest.approx(fig.text_px, abs=0.01)          # each layout its own
    assert info["narrow_text_px"] == pytest.approx(fig.narrow_text_px, abs=0.01)
    assert f'data-text-px="{fig.text_px:.1f}"' in html
    assert f'data-narrow="{info["narrow"]}" data-narrow-text-px="{fig.narrow_text_px:.1f}"' in html
    narrow = tmp_path / "_images" / info["narrow"]
    assert narrow.is_file()
    wide = (tmp_path / "_images" / f"f.{ext}").read_bytes()
    assert b"normcore-narrow" not in wide and b"normcore-figure" not in wide   # a desktop reader skips it
    # run again (an incremental build): the page stays, and a rewritten page is rebuilt alike
    assert normcore_figures.rewrite_site(tmp_path) == 0
    assert page.read_text(encoding="utf-8") == html


# What a chapter's figure cell leaves as its text output when it is not a responsive figure:
# a bare matplotlib figure, an IPython SVG or Image, or HTML (an inline SVG).
_BARE = ("<Figure size", "<IPython.core.display.SVG object>", "<IPython.core.display.Image object>",
         "<IPython.core.display.HTML object>", "<matplotlib.figure.Figure")


def test_every_chapter_figure_has_a_phone_layout():
    """A figure drawn for the desktop column shows its text at half size on a phone: every
    chapter figure is a responsive_figure (its stored text output says so)."""
    bare = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            for out in cell.get("outputs", []):
                text = "".join(out.get("data", {}).get("text/plain", ""))
                if text.startswith(_BARE):
                    bare.append(f"{path.name} cell {cell.get('id')}: {text[:50]}")
    assert not bare, ("figures without a phone layout (show them with "
                      "normcore.images.responsive_figure):\n" + "\n".join(bare))
