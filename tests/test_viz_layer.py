"""normcore.viz.layer: the LayerNorm chapter's pictures read their sets from normcore.axes
and their numbers from normcore.stats, and fit the widget budget."""
import math
import re

import pytest
import torch
import torch.nn.functional as TF
from matplotlib.figure import Figure

from normcore import axes
from normcore.viz import layer as vl


@pytest.mark.parametrize("k", [1, 2, 3])
def test_set_svg_highlights_the_sets_of_axes(k):
    element = (1, 2, 1, 0)
    svg = vl.set_svg(k, element)
    assert svg.startswith("<svg") and "<title>" in svg and " id=" not in svg
    shape = (2, 3, 2, 4)
    ln = axes.stat_groups("layer", shape, normalized_ndim=k)
    bn = axes.stat_groups("batch", shape)
    # the first 48 cells are the LN panel, the next 48 the BN panel, in (n, c, h, w) order
    cells = re.findall(r'<rect( class="(\w)")? x="[^"]+" y="[^"]+" width="22" height="22" '
                       r'data-e="(\d),(\d),(\d),(\d)"', svg)
    assert len(cells) == 96
    for panel, labels in ((cells[:48], ln), (cells[48:], bn)):
        for _, cls, *idx in panel:
            idx = tuple(map(int, idx))
            in_set = bool(labels[idx] == labels[element])
            assert cls == ("i" if idx == element else "s" if in_set else ""), (idx, cls)
    lay = axes.layout("layer", shape, normalized_ndim=k)
    assert f'data-layer-size="{lay.set_size}"' in svg
    assert 'data-batch-size="16"' in svg


def test_set_statistics_match_torch():
    x = vl.sample((2, 3, 2, 4))
    for k in (1, 2, 3):
        st = vl.set_statistics(x, "layer", (0, 1, 1, 2), k)
        y = TF.layer_norm(x, x.shape[4 - k:], eps=1e-5)[0, 1, 1, 2]
        assert math.isclose(float(y), (float(x[0, 1, 1, 2]) - st.mean)
                            / math.sqrt(st.var + 1e-5), rel_tol=1e-9)


def test_set_svg_bad_input():
    with pytest.raises(ValueError, match="normalized_ndim"):
        vl.set_svg(4)
    with pytest.raises(ValueError, match="not an index"):
        vl.set_svg(2, (2, 0, 0, 0))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        vl.set_svg(1, (0, 0, 0), shape=(2, 3, 4))


def test_numerics_methods_and_frames():
    bad = vl.numerics(1e4, torch.float32, "naive")
    good = vl.numerics(1e4, torch.float32, "two-pass")
    assert bad.var_error >= 0.99 and good.var_error < 1e-5
    assert good.out_error < 1e-2
    assert math.isnan(vl.numerics(1e3, torch.float16, "naive").var_error)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for method in vl.METHODS:
            svg = vl.numerics_svg(100, dtype, method)
            assert svg.startswith("<svg") and len(svg) < 8000
            assert f'data-method="{method}"' in svg
    # text at least 10 px as displayed: frames are at most 360 px wide and use 13 px type
    assert 'width="360"' in vl.numerics_svg(1, torch.float32, "naive")
    with pytest.raises(ValueError, match="method"):
        vl.numerics(1.0, torch.float32, "three-pass")


def test_figures():
    fig = vl.variance_error_figure([1, 10, 100], {"naive": [1e-7, float("nan"), 3.0],
                                                 "two-pass": [1e-8, 1e-8, 1e-8]})
    assert isinstance(fig, Figure)
    fig = vl.grad_norms_figure({"Post-LN": [0.1, 0.2], "Pre-LN": [0.2, 0.1]})
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 2


def test_numerics_frames_say_why_there_is_no_dot():
    # float16 at 1e4: every value rounds to 10000 (spacing 8); the frame says so in words
    r = vl.numerics(1e4, torch.float16, "two-pass")
    assert r.var_exact == 0 and len(set(r.values.tolist())) == 1
    svg = vl.numerics_svg(1e4, torch.float16, "two-pass")
    assert "all 64 values round to 10000: no spread left" in svg
    assert "all 64 dots" in svg and "not a number" not in svg
    # the naive variance: x * x overflows float16, so the output is NaN and no dot is drawn
    svg = vl.numerics_svg(1e4, torch.float16, "naive")
    assert "overflows float16 (max 65504)" in svg and "no dot to draw" in svg
    assert "<circle" not in svg
    svg = vl.numerics_svg(1e3, torch.float16, "naive")
    assert "overflows float16" in svg and "no spread left" not in svg
    # a frame with a spread left keeps its numbers
    assert "relative error of the variance" in vl.numerics_svg(100, torch.float32, "naive")
