"""normcore.viz.instance: the photographs, the adjustments, the numbers behind the contrast
widget, the frames (2x PNGs with readable text) and bad arguments."""
from __future__ import annotations

import base64
import io
import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
from matplotlib.figure import Figure
from PIL import Image

import normcore.functional as F
from normcore.viz import instance as vi
from normcore.widgets import figure_to_png

PNG = b"\x89PNG\r\n\x1a\n"


def test_photos_shape_range_and_copy():
    x = vi.photos()
    assert x.shape == (2, 3, 72, 108) and x.dtype == torch.float64
    assert 0 <= float(x.min()) and float(x.max()) <= 1
    assert not torch.equal(x[0], x[1])
    x.zero_()                                        # a copy: the cache is untouched
    assert float(vi.photos().max()) > 0.5
    assert vi.photos(height=36).shape == (2, 3, 36, 54)
    for bad in (1, 0, 1000, 2.5, True):
        with pytest.raises(ValueError):
            vi.photos(bad)


def test_adjust_is_affine_and_checks_contrast():
    x = vi.photos()[:1]
    assert torch.allclose(vi.adjust(x, 2.0, 0.1), 2.0 * x - 0.5 + 0.1, atol=1e-12)
    assert torch.equal(vi.adjust(x), x)
    with pytest.raises(ValueError):
        vi.adjust(x, 0.0)


def test_normalized_outputs():
    photos = vi.photos()
    for contrast, brightness in ((1.0, 0.0), (0.5, 0.2), (2.0, -0.2)):
        inorm = vi.normalized("instance", contrast, brightness)
        assert torch.allclose(inorm.mean((1, 2)), torch.zeros(3, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(inorm, F.instance_norm(photos[:1])[0], atol=2e-3)
        bn = vi.normalized("batch", contrast, brightness)
        batch = torch.cat([vi.adjust(photos[:1], contrast, brightness), photos[1:]])
        assert torch.equal(bn, F.batch_norm(batch, None, None, training=True)[0])
    assert not torch.allclose(vi.normalized("batch", 0.5), vi.normalized("batch", 2.0), atol=0.1)
    assert torch.equal(vi.normalized("none"), photos[0])
    with pytest.raises(ValueError):
        vi.normalized("group")


def test_to_display():
    y = torch.tensor([-3.0, 0.0, 3.0, 9.0]).view(1, 1, 4).expand(3, 1, 4)
    d = vi.to_display(y, "instance")
    assert d.shape == (1, 4, 3)
    assert torch.allclose(d[0, :, 0], torch.tensor([0.0, 0.5, 1.0, 1.0]))
    assert float(vi.to_display(y, "none").max()) == 1.0


@pytest.mark.parametrize("make", [lambda: vi.contrast_figure(1.0, 0.0, "instance"),
                                  lambda: vi.contrast_figure(2.0, -0.2, "none"),
                                  lambda: vi.adain_figure("china", "flower", 0.5)],
                         ids=["contrast-instance", "contrast-none", "adain"])
def test_frames_are_small_2x_pngs_with_readable_text(make):
    fig = make()
    assert isinstance(fig, Figure)
    assert fig.get_figwidth() * 80 == vi.FRAME_WIDTH
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]
    assert sizes and min(sizes) * 80 / 72 >= 10          # >= 10 px as displayed
    png = figure_to_png(fig, dpi=160, colors=128)         # as static_widget renders it
    assert png.startswith(PNG) and len(png) < 40_000
    w, h = Image.open(io.BytesIO(png)).size
    assert w == 2 * vi.FRAME_WIDTH                         # twice the display width


def test_frames_are_deterministic():
    a = figure_to_png(vi.adain_figure("flower", "china", 1.0), dpi=160)
    b = figure_to_png(vi.adain_figure("flower", "china", 1.0), dpi=160)
    assert a == b


def test_feature_stats_figure():
    t = torch.arange(4, dtype=torch.float64)
    fig = vi.feature_stats_figure(t, t + 1, t, t, t, t)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    # the legend sits below the panels, outside both axes, so it hides no point
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["content", "style",
                                                          "AdaIN output"]
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(box.y1 < ax.get_window_extent().y0 for ax in fig.axes)


def test_widget_frames_are_shown_at_the_frame_width():
    from normcore.widgets import static_widget

    w = static_widget(lambda a: vi.adain_figure("china", "china", a), {"a": [0.0, 1.0]},
                      colors=128)
    for frame in w.frames.values():
        # a raster frame is an <img alt=...> (PNG or lossless WebP): shown at FRAME_WIDTH css px, at most
        # the column's width, with twice the pixels (HiDPI)
        img = re.search(r'<img src="data:image/(?:png|webp);base64,([^"]+)" alt="[^"]+" style="([^"]+)"',
                        frame.value)
        assert img, frame.value[:200]
        assert f"width:{vi.FRAME_WIDTH}px" in img.group(2) and "max-width:100%" in img.group(2)
        png = base64.b64decode(img.group(1))
        assert Image.open(io.BytesIO(png)).size[0] == 2 * vi.FRAME_WIDTH
