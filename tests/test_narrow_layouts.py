"""The phone layouts of the chapters' widgets (static_widget(narrow=...)): drawn for a column of
about 320 px, their text is at least 10 px there. The site's test measures it in a browser at
390 px; these check the drawings themselves, without a build."""

from __future__ import annotations

import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from normcore.viz import batch as vb  # noqa: E402
from normcore.viz import cube  # noqa: E402
from normcore.viz import running as vr  # noqa: E402
from normcore.images import NARROW_WIDTH_PX, figure_to_png  # noqa: E402
from normcore.images import smallest_text_px as _smallest_text_px  # noqa: E402

DPI = 80  # static_widget's default: a font of p points is p * 80 / 72 px
# An SVG frame is drawn at most 320 px wide; on a 390 px phone it is shown 291 to 328 px wide
# (inside the widget's box, and in dark mode on a card with padding), so its smallest text must
# be 11 px to stay above 10 px. A raster frame is drawn NARROW_WIDTH_PX wide (296 px) and
# shown at least that wide, so its smallest text is 10 px.
SVG_NARROW_MAX, SVG_MIN_FONT = 320, 11


def _svg_width(svg: str) -> float:
    return float(re.search(r'viewBox="0 0 ([0-9.]+) ', svg).group(1))


def _svg_font_px(svg: str) -> list[float]:
    return [float(v) for v in re.findall(r"font(?:-size)?:\s*([0-9.]+)px", svg)]


@pytest.mark.parametrize("norm,G", [("batch", None), ("layer", None), ("group", 2), ("instance", None)])
def test_cube_narrow_fits_a_phone_column_with_its_text_size(norm, G):
    x = torch.randn(4, 6, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    wide = cube.cube_svg(norm, (1, 2, 3), G, x=x)
    narrow = cube.cube_svg(norm, (1, 2, 3), G, x=x, narrow=True)
    assert _svg_width(wide) > 500
    assert _svg_width(narrow) <= SVG_NARROW_MAX
    assert min(_svg_font_px(narrow)) >= SVG_MIN_FONT
    # the same picture: every number and label of the wide layout is in the narrow one
    texts = lambda s: sorted(re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text[^>]*>(.*?)</text>", s))  # noqa: E731
    assert texts(narrow) == texts(wide)


def _check_figure(fig):
    png = figure_to_png(fig, dpi=DPI)                  # drawn: tick labels exist
    assert fig.get_figwidth() * DPI <= NARROW_WIDTH_PX
    assert _smallest_text_px(fig, DPI) >= 10 - 1e-9
    return png


def test_running_simulation_narrow():
    from normcore import experiments

    sims = experiments.running_stats_grid()
    _check_figure(vr.simulation_figure(sims[0.1, 8, True], narrow=True))


@pytest.mark.parametrize("batch_size", [2, 64])
def test_batch_dependence_narrow(batch_size):
    fig = vb.batch_dependence_figure(batch_size, 1, narrow=True)
    _check_figure(fig)
    assert len(fig.axes) == 2 and fig.axes[0].get_position().y0 > fig.axes[1].get_position().y1


@pytest.mark.parametrize("G", [1, 2, 8])
@pytest.mark.parametrize("narrow", [False, True])
def test_group_explorer_fits_its_note_and_a_phone(G, narrow):
    from normcore.viz import group as vg

    x = torch.randn(3, 8, 2, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    svg = vg.group_explorer_svg(x, G, (1, 2, 1), narrow=narrow)
    width = _svg_width(svg)
    if narrow:
        assert width <= SVG_NARROW_MAX and min(_svg_font_px(svg)) >= SVG_MIN_FONT
    # the note ("G = 1: this is LayerNorm over (C, H, W)") ends inside the picture: its x plus
    # 7 px a character (12 px sans-serif) -- it was clipped at "(C, H, W" before
    for x0, text in re.findall(r'<text class="note" x="([0-9.]+)"[^>]*>([^<]*)</text>', svg):
        assert float(x0) + 7 * len(text) <= width, (text, x0, width)


def test_text_of_an_axes_that_is_off_does_not_count():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    img, plot = fig.subplots(1, 2)
    img.imshow([[0, 1], [1, 0]])
    img.set_axis_off()                       # its tick labels (10 pt) are never drawn
    plot.plot([0, 1])
    plot.tick_params(labelsize=12)
    plot.set_title("t", fontsize=14)
    figure_to_png(fig, dpi=DPI)
    assert _smallest_text_px(fig, DPI) == 12 * DPI / 72
