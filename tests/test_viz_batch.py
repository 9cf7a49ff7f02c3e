"""Tests of normcore.viz.batch: the numbers behind the batch-dependence widget, its frames,
the other BatchNorm-chapter figures, and bad arguments."""
from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")
import pytest
import torch
import torch.nn.functional as TF
from matplotlib.figure import Figure

from normcore.viz import batch as vb
from normcore.widgets import Control, figure_to_png, static_widget

SIZES = (2, 4, 8, 32)
DRAWS = range(vb.NUM_DRAWS)


def png(fig) -> bytes:
    return figure_to_png(fig, dpi=40)


# ---------------------------------------------------------------------------------------
# the numbers
# ---------------------------------------------------------------------------------------
def test_fixed_sample_is_row_zero_of_every_batch():
    first = vb.batch_dependence(2, 0).batch[0]
    for b, d in itertools.product(SIZES, DRAWS):
        frame = vb.batch_dependence(b, d)
        assert frame.batch.shape == (b, len(vb.POPULATION_MEAN))
        assert torch.equal(frame.batch[0], first)


def test_bn_output_depends_on_the_batch_mates():
    for b in SIZES[1:]:
        outs = [vb.batch_dependence(b, d).bn for d in DRAWS]
        for i, j in itertools.combinations(range(len(outs)), 2):
            assert not torch.allclose(outs[i], outs[j], atol=1e-3), (b, i, j)
    # with B = 2 only the signs are left (next test), and two draws may share them
    signs = {tuple(vb.batch_dependence(2, d).bn.sign().tolist()) for d in DRAWS}
    assert len(signs) >= 2


def test_ln_output_is_the_same_for_every_batch():
    ref = vb.batch_dependence(2, 0).ln
    for b, d in itertools.product(SIZES, DRAWS):
        assert torch.equal(vb.batch_dependence(b, d).ln, ref)


def test_outputs_match_torch():
    for b, d in ((2, 0), (8, 3), (32, vb.NUM_DRAWS - 1)):
        f = vb.batch_dependence(b, d)
        bn = TF.batch_norm(f.batch, None, None, training=True, eps=1e-5)[0]
        ln = TF.layer_norm(f.batch, (f.batch.shape[1],), eps=1e-5)[0]
        torch.testing.assert_close(f.bn, bn)
        torch.testing.assert_close(f.ln, ln)


def test_population_value_is_the_sample_in_population_units():
    f = vb.batch_dependence(4, 0)
    torch.testing.assert_close(f.population, torch.tensor(vb.SAMPLE_Z, dtype=torch.float64),
                               atol=1e-4, rtol=1e-4)


def test_a_larger_batch_extends_a_smaller_one():
    for d in DRAWS:
        small, big = vb.batch_dependence(4, d).batch, vb.batch_dependence(32, d).batch
        assert torch.equal(big[:4], small)


def test_batch_of_two_gives_plus_minus_one():
    # x_hat = (x0 - m) / 2 / sqrt(((x0 - m) / 2)^2 + eps): +-1 up to eps, the sign of x0 - m
    for d in DRAWS:
        f = vb.batch_dependence(2, d)
        half = (f.batch[0] - f.batch[1]) / 2
        torch.testing.assert_close(f.bn, half / (half**2 + 1e-5).sqrt())
        assert torch.equal(f.bn.sign(), half.sign())
        assert float((f.bn.abs() - 1).abs().max()) < 0.02


def test_seed_changes_the_batch_mates_but_not_the_sample():
    a, b = vb.batch_dependence(8, 1, seed=0), vb.batch_dependence(8, 1, seed=1)
    assert torch.equal(a.batch[0], b.batch[0])
    assert not torch.equal(a.batch[1:], b.batch[1:])
    assert torch.equal(vb.batch_dependence(8, 1, seed=1).batch, b.batch)


# ---------------------------------------------------------------------------------------
# the frames
# ---------------------------------------------------------------------------------------
def test_frames_are_deterministic():
    assert png(vb.batch_dependence_figure(4, 2)) == png(vb.batch_dependence_figure(4, 2))


@pytest.mark.parametrize("panel", ["both", "bn"])
def test_frames_differ_for_different_batch_mates(panel):
    frames = [png(vb.batch_dependence_figure(4, d, panel=panel)) for d in DRAWS]
    assert len(set(frames)) == len(frames)
    assert png(vb.batch_dependence_figure(2, 0, panel=panel)) != frames[0]


def test_ln_frame_is_identical_for_every_batch():
    frames = {png(vb.batch_dependence_figure(b, d, panel="ln"))
              for b, d in itertools.product((2, 8, 32), (0, 3))}
    assert len(frames) == 1


def test_widget_over_the_grid():
    w = static_widget(
        lambda batch_size, draw: vb.batch_dependence_figure(batch_size, draw),
        {"batch_size": Control([2, 4], kind="slider"),
         "draw": Control([("draw 1", 0), ("draw 2", 1)], kind="toggle")},
        caption="test")
    values = {k: v.value for k, v in w.frames.items()}
    assert len(values) == 4 and len(set(values.values())) == 4
    assert w.nbytes < 4 * 60_000


def test_other_figures():
    g = vb.graph_figure()
    assert isinstance(g, Figure) and len(g.axes) == 1
    z = torch.randn(50, generator=torch.Generator().manual_seed(0))
    s = vb.sigmoid_figure(z, 3 * z + 2)
    assert isinstance(s, Figure) and len(s.axes) == 2
    sp = vb.spread_figure([2, 4, 8], [1.0, 0.7, 0.5], [1.4, 1.0, 0.7])
    assert isinstance(sp, Figure) and len(sp.axes) == 1
    for fig in (g, s, sp):
        assert png(fig).startswith(b"\x89PNG")


# ---------------------------------------------------------------------------------------
# bad arguments
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, err, match", [
    (dict(batch_size=1, draw=0), ValueError, "at least 2 values per channel"),
    (dict(batch_size=0, draw=0), ValueError, "between 2 and"),
    (dict(batch_size=vb.MAX_BATCH + 1, draw=0), ValueError, "between 2 and"),
    (dict(batch_size=4, draw=-1), ValueError, r"range\(4\)"),
    (dict(batch_size=4, draw=vb.NUM_DRAWS), ValueError, r"range\(4\)"),
    (dict(batch_size=4, draw=0, num_draws=0), ValueError, "num_draws"),
    (dict(batch_size=4.0, draw=0), TypeError, "batch_size must be an int"),
    (dict(batch_size=True, draw=0), TypeError, "batch_size must be an int"),
    (dict(batch_size=4, draw="1"), TypeError, "draw must be an int"),
    (dict(batch_size=4, draw=0, seed=0.5), TypeError, "seed must be an int"),
])
def test_bad_arguments(kwargs, err, match):
    with pytest.raises(err, match=match):
        vb.batch_dependence(**kwargs)
    with pytest.raises(err, match=match):
        vb.batch_dependence_figure(**kwargs)


def test_bad_panel():
    with pytest.raises(ValueError, match="panel must be"):
        vb.batch_dependence_figure(4, 0, panel="group")


def test_spread_figure_needs_matching_lengths():
    with pytest.raises(ValueError, match="same length"):
        vb.spread_figure([2, 4, 8], [1.0, 0.7], [1.4, 1.0, 0.7])


def test_widget_frame_text_is_at_least_10px_as_displayed():
    """The chapter's widget shows the frames at 80 px per inch (twice the pixels in the PNG,
    for HiDPI screens): every text is then at least 10 px."""
    import matplotlib.text
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = vb.batch_dependence_figure(4, 1)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip()]
    assert min(sizes) * 80 / 72 >= 10, sorted(sizes)[:3]


def test_hidpi_frames_are_shown_at_their_dpi_size():
    import base64
    import io
    import re

    from PIL import Image

    w = static_widget(lambda n: vb.batch_dependence_figure(n, 0), {"n": [2, 4]}, dpi=80)
    frame = w.frames[(0,)]
    # a raster frame is an <img alt=...> (PNG or lossless WebP), shown at the dpi's width, with 2x pixels
    img = re.search(r'<img src="data:image/(?:png|webp);base64,([^"]+)" alt="[^"]+" style="([^"]+)"',
                    frame.value)
    assert img, frame.value[:200]
    assert f"width:{round(7.6 * 80)}px" in img.group(2)                   # displayed size
    png = Image.open(io.BytesIO(base64.b64decode(img.group(1))))
    assert png.size[0] == round(7.6 * 160)                               # 2x pixels
