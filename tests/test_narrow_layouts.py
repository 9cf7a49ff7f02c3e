"""The phone layouts of the chapters' widgets (static_widget(narrow=...)) and figures
(responsive_figure(lambda narrow: ...)): drawn for a column of about 320 px, their text is at
least 10 px there. The site's test measures it in a browser at 390 px; these check the drawings
themselves, without a build."""

from __future__ import annotations

import functools
import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from normcore import choose, stats
from normcore.viz import batch as vb
from normcore.viz import choose as vc
from normcore.viz import cube
from normcore.viz import instance as vi
from normcore.viz import layer as vl
from normcore.viz import running as vr
from normcore.images import NARROW_WIDTH_PX, figure_to_png, responsive_figure
from normcore.images import smallest_text_px as _smallest_text_px

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
    texts = lambda s: sorted(re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text[^>]*>(.*?)</text>", s))
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


# --- the chapters' figures with a phone layout (responsive_figure(lambda narrow: ...)) -------

def _drawn_texts(fig):
    """The texts, not blank, that a render of ``fig`` at DPI draws (a tick label outside its
    axis' view exists, but is not drawn)."""
    from unittest import mock

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    drawn, draw = [], Text.draw

    def record(self, renderer):
        drawn.append(self)
        return draw(self, renderer)

    fig.set_dpi(DPI)
    with mock.patch.object(Text, "draw", record):
        FigureCanvasAgg(fig).draw()
    return [t for t in drawn if t.get_visible() and t.get_text().strip()]


def _check_phone_layout(fig):
    """A phone layout: as wide as a phone's column, no text below 10 px, none of it past the
    figure's edge, and every legend outside every axes (it hides no data)."""
    texts = _drawn_texts(fig)
    assert fig.get_figwidth() * DPI <= NARROW_WIDTH_PX
    assert _smallest_text_px(fig, DPI) >= 10 - 1e-9
    edge = fig.bbox
    for t in texts:
        box = t.get_window_extent()
        inside = (box.x0 >= edge.x0 - 0.5 and box.y0 >= edge.y0 - 0.5
                  and box.x1 <= edge.x1 + 0.5 and box.y1 <= edge.y1 + 0.5)
        assert inside, f"{t.get_text()!r} at {box.extents} is cut off by the edge, {edge.extents}"
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    for legend in legends:
        for ax in fig.axes:
            if ax.axison:
                assert not legend.get_window_extent().overlaps(ax.get_window_extent()), \
                    "a legend over the data"
    return texts


@functools.lru_cache
def _spread_data():
    gen = torch.Generator().manual_seed(10)
    sizes, mean_spread, var_spread = [2, 4, 8, 16, 32, 64, 128, 256], [], []
    for n in sizes:
        x = 3 + 2 * torch.randn(500, n, generator=gen, dtype=torch.float64)
        var, mean = torch.var_mean(x, dim=1)
        mean_spread.append(float(mean.std()))
        var_spread.append(float(var.std()))
    return sizes, mean_spread, var_spread


@functools.lru_cache
def _variance_errors():
    offsets = [10 ** (k / 2) for k in range(11)]
    noise = torch.randn(1024, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    errors = {"naive": [], "two-pass": [], "welford": []}
    for off in offsets:
        v = (off + noise).float()
        exact = float(v.double().var(correction=0))
        for name, fn in (("naive", stats.var_naive), ("two-pass", stats.var_two_pass),
                         ("welford", stats.var_welford)):
            errors[name].append(abs(float(fn(v, 0)) - exact) / exact)
    return offsets, errors


def _channel_stats():
    """Content, style and output (the style's) per-channel means and stds."""
    g = torch.Generator().manual_seed(3)
    mu_c, s_c, mu_s, s_s = (torch.rand(8, generator=g) + shift for shift in (0, 0.5, 0, 0.5))
    return mu_c, s_c, mu_s, s_s, mu_s, s_s


_Z = torch.randn(1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
_GRAD_NORMS = {"Post-LN": [0.3 * 1.1 ** k for k in range(8)],
               "Pre-LN": [0.38 * 0.9 ** k for k in range(8)],
               "DeepNorm": [0.1] * 8, "DeepNorm (alpha on F)": [0.43] * 8}
#: name -> (draw(narrow), the wide layout's size in inches, as it was before it had a phone layout)
PHONE_FIGURES = {
    "sigmoid": (lambda narrow: vb.sigmoid_figure(_Z, 3 * _Z + 2, narrow=narrow), (7.0, 2.4)),
    "graph": (lambda narrow: vb.graph_figure(narrow=narrow), (8.5, 2.65)),
    "spread": (lambda narrow: vb.spread_figure(*_spread_data(), narrow=narrow), (5.2, 2.8)),
    "ema_weights": (lambda narrow: vr.ema_weights_figure((0.01, 0.1, 0.5), lags=60, narrow=narrow),
                    (6.4, 2.6)),
    "variance_error": (lambda narrow: vl.variance_error_figure(*_variance_errors(), narrow=narrow),
                       (6.4, 3.2)),
    "grad_norms": (lambda narrow: vl.grad_norms_figure(_GRAD_NORMS, narrow=narrow), (6.4, 3.2)),
    "feature_stats": (lambda narrow: vi.feature_stats_figure(*_channel_stats(), narrow=narrow),
                      (5.6, 2.9)),
    "cost": (lambda narrow: vc.cost_figure(choose.load_cost(), narrow=narrow), (6.4, 3.6)),
}


@pytest.mark.parametrize("name", PHONE_FIGURES)
def test_a_chapter_figure_has_a_phone_layout(name):
    draw, wide_size = PHONE_FIGURES[name]
    wide, narrow = draw(False), draw(True)
    assert wide.get_size_inches().tolist() == pytest.approx(wide_size)    # the column's: as it was
    texts, wide_texts = _check_phone_layout(narrow), _drawn_texts(wide)
    # the same words on a phone, tick labels aside (a title wrapped onto two lines is the same
    # title; a shared x label stands once), but for the graph's "top to bottom"
    ticks = {id(t) for f in (wide, narrow) for ax in f.axes for axis in (ax.xaxis, ax.yaxis)
             for t in axis.get_ticklabels(which="both")}

    def words(texts):
        return {w.strip(".;") for t in texts if id(t) not in ticks for w in t.get_text().split()}

    assert words(texts) ^ words(wide_texts) <= {"left", "right", "top", "bottom"}
    out = responsive_figure(draw)
    assert out.narrow_size[0] <= NARROW_WIDTH_PX and out.phone_text_px() >= 10


def test_the_graph_on_a_phone_keeps_every_node_and_arrow_top_to_bottom():
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    wide, narrow = vb.graph_figure(), vb.graph_figure(narrow=True)
    for fig in (wide, narrow):
        _drawn_texts(fig)
    patches = {f: f.axes[0].patches for f in (wide, narrow)}
    boxes = {f: [p for p in patches[f] if isinstance(p, FancyBboxPatch)] for f in (wide, narrow)}
    arrows = {f: [p for p in patches[f] if isinstance(p, FancyArrowPatch)] for f in (wide, narrow)}
    assert len(boxes[narrow]) == len(boxes[wide]) == 8
    assert len(arrows[narrow]) == len(arrows[wide]) == 10
    labels = lambda f: sorted(t.get_text() for t in f.axes[0].texts[:-1])
    assert labels(narrow) == labels(wide)
    extents = [b.get_window_extent() for b in boxes[narrow]]
    for i, a in enumerate(extents):                     # no box on another
        assert not any(a.overlaps(b) for b in extents[i + 1:])
    # the input on top, the loss at the bottom: forward is top to bottom
    ys = [b.get_window_extent().y0 for b in boxes[narrow]]
    assert ys[0] == max(ys) and ys[-1] == min(ys)
    note = narrow.axes[0].texts[-1].get_text()
    assert "top to bottom" in note and note.count("\n") == 2


@pytest.mark.parametrize("name", ["sigmoid", "feature_stats"])
def test_panels_side_by_side_stand_one_above_the_other_on_a_phone(name):
    fig = PHONE_FIGURES[name][0](True)
    top, bottom = fig.axes
    _drawn_texts(fig)
    assert top.get_position().y0 > bottom.get_position().y1
    assert top.get_xlabel() == "" and bottom.get_xlabel()       # the shared x label, once
