"""Tests of normcore.widgets.static_widget: the structure that makes a widget work with no
kernel (frames in nested Stacks, each control jslinked to selected_index), its guards, and
what it embeds. The browser side (the same structure actually moving on the built site) is
tested in tests/test_site.py."""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import re

import ipywidgets
import numpy as np
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from ipywidgets.embed import embed_data
from ipywidgets.widgets.widget_link import DirectionalLink, Link
from matplotlib.figure import Figure
from PIL import Image

from normcore.widgets import (
    DEFAULT_MAX_FRAMES,
    Control,
    StaticWidget,
    WidgetBudgetError,
    figure_to_png,
    static_widget,
)


def svg_render(**values):
    text = " ".join(f"{k}={v}" for k, v in sorted(values.items()))
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" width="160" height="20">'
        f'<text x="2" y="15">{text}</text></svg>'
    )


def fig_render(slope):
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [0, slope])
    ax.set_ylim(0, 3)
    return fig


def walk_visible(w: StaticWidget) -> ipywidgets.Widget:
    """Follow selected_index from the outer Stack down to a frame, as the browser does."""
    node = w.stacks[0][0]
    while isinstance(node, ipywidgets.Stack):
        node = node.children[node.selected_index]
    return node


def propagate_links(w: StaticWidget) -> None:
    """Apply every jslink source -> target, as the browser would after a control moves."""
    for link in w.links:
        (src, src_attr), (dst, dst_attr) = link.source, link.target
        setattr(dst, dst_attr, getattr(src, src_attr))


def frame_payload(frame: ipywidgets.Widget):
    return bytes(frame.value) if isinstance(frame.value, memoryview) else frame.value


_IMG = re.compile(r'^<img src="data:image/(png|webp);base64,([A-Za-z0-9+/=]+)" alt="([^"]+)"')


def frame_png(frame: ipywidgets.Widget) -> bytes:
    """The image bytes of a raster frame (an <img> with a data: URL in an HTML widget): a PNG
    or a lossless WebP."""
    m = _IMG.match(frame.value)
    assert m, frame.value[:80]
    return base64.b64decode(m.group(2))


def frame_alt(frame: ipywidgets.Widget) -> str:
    return html.unescape(_IMG.match(frame.value).group(3))


def pixels(data: bytes):
    """(size, RGBA pixel bytes) of an encoded image."""
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    return img.size, img.convert("RGBA").tobytes()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --- structure ------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(4,), (3, 2), (2, 3, 2)])
def test_frame_count_nesting_and_links(sizes):
    names = ["a", "b", "c"][: len(sizes)]
    controls = {n: list(range(s)) for n, s in zip(names, sizes)}
    w = static_widget(svg_render, controls, caption="what to look for")

    assert isinstance(w, ipywidgets.VBox)
    assert len(w.frames) == math.prod(sizes)
    assert set(w.frames) == set(itertools.product(*(range(s) for s in sizes)))
    assert all(isinstance(f, ipywidgets.HTML) for f in w.frames.values())

    # one Stack level per control: level k has prod(sizes[:k]) Stacks of sizes[k] children
    assert len(w.stacks) == len(sizes)
    for level, stacks in enumerate(w.stacks):
        assert len(stacks) == math.prod(sizes[:level])
        for stack in stacks:
            assert isinstance(stack, ipywidgets.Stack)
            assert len(stack.children) == sizes[level]
            inner = ipywidgets.Stack if level < len(sizes) - 1 else ipywidgets.HTML
            assert all(isinstance(c, inner) for c in stack.children)

    # every Stack of level k is linked to control k, once, and nothing else is linked
    assert len(w.links) == sum(math.prod(sizes[:k]) for k in range(len(sizes)))
    seen = set()
    for link in w.links:
        assert isinstance(link, Link) and not isinstance(link, DirectionalLink)  # jslink, both ways
        (src, src_attr), (dst, dst_attr) = link.source, link.target
        assert src_attr == "index"
        assert dst_attr == "selected_index"
        level = list(w.controls.values()).index(src)
        assert any(dst is s for s in w.stacks[level])
        assert id(dst) not in seen
        seen.add(id(dst))
    assert len(seen) == sum(len(s) for s in w.stacks)

    # the widget shows controls, the outer Stack and the caption
    assert w.stacks[0][0] in w.children
    captions = [c for c in w.children if isinstance(c, ipywidgets.HTMLMath)]
    assert len(captions) == 1 and "what to look for" in captions[0].value
    assert w.children[-1] is captions[0]


def test_every_grid_point_reaches_its_own_frame():
    w = static_widget(svg_render, {"a": [1, 2, 3], "b": ["x", "y"], "c": [0.1, 0.2]})
    controls = list(w.controls.values())
    for key in itertools.product(range(3), range(2), range(2)):
        for control, i in zip(controls, key):
            control.index = i
        propagate_links(w)
        assert walk_visible(w) is w.frames[key]
        assert w.current_frame() is w.frames[key]


def test_distinct_values_give_distinct_frames_and_render_gets_values():
    calls = []

    def render(norm, eps):
        calls.append((norm, eps))
        return svg_render(norm=norm, eps=eps)

    w = static_widget(
        render,
        {"norm": [("BatchNorm", "bn"), ("LayerNorm", "ln")], "eps": [1e-5, 1e-1, 1.0]},
    )
    # render receives the values, never the labels, once per grid point, in grid order
    assert calls == list(itertools.product(["bn", "ln"], [1e-5, 1e-1, 1.0]))
    payloads = [frame_payload(f) for f in w.frames.values()]
    assert len(set(payloads)) == len(payloads) == 6
    # the reader sees the labels
    assert list(w.controls["norm"].options) == ["BatchNorm", "LayerNorm"]
    assert list(w.controls["eps"].options) == ["1e-05", "0.1", "1"]


def test_initial_index_selects_initial_frame():
    w = static_widget(svg_render, {"a": Control([1, 2, 3], index=2), "b": Control(["x", "y"], index=1)})
    assert w.controls["a"].index == 2 and w.controls["b"].index == 1
    assert all(s.selected_index == 2 for s in w.stacks[0])
    assert all(s.selected_index == 1 for s in w.stacks[1])
    assert walk_visible(w) is w.frames[(2, 1)]


# --- controls -------------------------------------------------------------------------


def test_control_kinds():
    w = static_widget(
        svg_render,
        {
            "eps": [1e-5, 1e-3],  # numbers -> slider
            "norm": ["batch", "layer"],  # few short labels -> toggle buttons
            "model": ["a rather long model name", "another long model name"],  # -> dropdown
            "g": Control([1, 2], kind="dropdown"),
        },
    )
    assert isinstance(w.controls["eps"], ipywidgets.SelectionSlider)
    assert isinstance(w.controls["norm"], ipywidgets.ToggleButtons)
    assert isinstance(w.controls["model"], ipywidgets.Dropdown)
    assert isinstance(w.controls["g"], ipywidgets.Dropdown)
    assert w.controls["g"].description == "g"


@pytest.mark.parametrize(
    "values, message",
    [
        ([], "at least one value"),
        (["a", "a"], "distinct"),
        ([("one", 1), 2], "mix"),
        ("abc", "list or tuple"),
    ],
)
def test_bad_control_values(values, message):
    with pytest.raises((ValueError, TypeError), match=message):
        static_widget(svg_render, {"a": values})


def test_bad_control_spec():
    with pytest.raises(ValueError, match="kind"):
        Control([1, 2], kind="knob")
    with pytest.raises(ValueError, match="index"):
        Control([1, 2], index=2)
    with pytest.raises(ValueError, match="identifier"):
        static_widget(svg_render, {"not a name": [1]})
    with pytest.raises(ValueError, match="non-empty"):
        static_widget(svg_render, {})


# --- frames ---------------------------------------------------------------------------


def test_figures_become_png_images_and_are_closed():
    before = set(plt.get_fignums())
    w = static_widget(fig_render, {"slope": [0.5, 1.0, 2.0]})
    assert set(plt.get_fignums()) == before  # every rendered figure was closed
    frames = list(w.frames.values())
    # an <img> with alt text (ipywidgets.Image cannot carry alt text), the image as a data:
    # URL: the figure's palette PNG re-encoded as lossless WebP, which is smaller
    assert all(isinstance(f, ipywidgets.HTML) for f in frames)
    assert all(f.value.startswith('<img src="data:image/webp;base64,') for f in frames)
    assert all(frame_png(f)[:4] == b"RIFF" and frame_png(f)[8:12] == b"WEBP" for f in frames)
    assert len({frame_png(f) for f in frames}) == 3
    assert w.formats == {"webp"}
    # the same pixels as the PNG that figure_to_png draws
    png = figure_to_png(fig_render(0.5), dpi=160)
    assert pixels(frame_png(frames[0])) == pixels(png)
    assert len(frame_png(frames[0])) < len(png)
    # frames count as embedded in the page (the PNG base64-encoded)
    assert w.nbytes == sum(len(f.value.encode("utf-8")) for f in frames)
    assert w.nbytes > sum(4 * math.ceil(len(frame_png(f)) / 3) for f in frames)


def test_figure_to_png_is_deterministic_and_small():
    a = figure_to_png(fig_render(1.0))
    b = figure_to_png(fig_render(1.0))
    assert a == b
    rgba = figure_to_png(fig_render(1.0), colors=None)
    assert len(a) < len(rgba)


def test_png_bytes_pass_through():
    png = figure_to_png(fig_render(1.0))
    w = static_widget(lambda v: png if v else figure_to_png(fig_render(2.0)), {"v": [True, False]},
                      image_format="png")
    assert frame_png(w.frames[(0,)]) == png
    assert w.formats == {"png"}
    # re-encoded, the pixels stay exactly the same
    w = static_widget(lambda v: png, {"v": [True]})
    assert pixels(frame_png(w.frames[(0,)])) == pixels(png)


def test_compact_image_is_lossless_and_never_larger():
    from PIL import Image

    from normcore.widgets import compact_image

    rng = np.random.default_rng(0)
    photo = Image.fromarray(rng.integers(0, 256, (40, 60, 4), dtype=np.uint8), "RGBA")  # alpha too
    flat = figure_to_png(fig_render(1.0), dpi=160)                                     # a palette plot
    for img in (photo, flat):
        if isinstance(img, Image.Image):
            buf = io.BytesIO()
            img.save(buf, format="png")
            img = buf.getvalue()
        fmt, data = compact_image(img, "webp")
        assert fmt == "webp" and pixels(data) == pixels(img)
        fmt, data = compact_image(img)                   # auto: the smaller of the two
        assert len(data) <= len(img) and pixels(data) == pixels(img)
        assert compact_image(img, "png") == ("png", img)
    assert compact_image(flat)[0] == "webp"
    with pytest.raises(ValueError, match="image_format"):
        compact_image(flat, "jpeg")
    with pytest.raises(ValueError, match="image_format"):
        static_widget(fig_render, {"slope": [1.0]}, image_format="gif")


def test_bad_render_results():
    with pytest.raises(TypeError, match="not a PNG"):
        static_widget(lambda a: b"GIF89a...", {"a": [1]})
    with pytest.raises(TypeError, match="not an SVG"):
        static_widget(lambda a: "<div>hello</div>", {"a": [1]})
    with pytest.raises(TypeError, match="expected an SVG string"):
        static_widget(lambda a: 42, {"a": [1]})


def test_xml_declaration_is_dropped():
    w = static_widget(lambda a: '<?xml version="1.0"?>\n' + svg_render(a=a), {"a": [1]})
    assert w.frames[(0,)].value.startswith("<svg")


# --- page-weight guard ----------------------------------------------------------------


def test_too_many_frames_fails_before_rendering():
    calls = []

    def render(a, b):
        calls.append(1)
        return svg_render(a=a, b=b)

    with pytest.raises(WidgetBudgetError, match=r"a=10 x b=10 has 100 frames, more than max_frames=64"):
        static_widget(render, {"a": list(range(10)), "b": list(range(10))})
    assert calls == []
    assert DEFAULT_MAX_FRAMES == 64
    # the limit is adjustable
    assert len(static_widget(render, {"a": list(range(10)), "b": list(range(10))}, max_frames=100).frames) == 100


def test_too_many_bytes_fails():
    big = '<svg xmlns="http://www.w3.org/2000/svg">' + "<!--" + "x" * 10_000 + "--></svg>"
    with pytest.raises(WidgetBudgetError, match="max_bytes=25000"):
        static_widget(lambda a: big, {"a": [1, 2, 3]}, max_bytes=25_000)
    assert static_widget(lambda a: big, {"a": [1, 2]}, max_bytes=25_000).nbytes > 20_000


# --- what the notebook stores and the page embeds -------------------------------------


def test_text_repr_is_short_and_deterministic():
    w1 = static_widget(svg_render, {"norm": ["batch", "layer"], "eps": [1e-5, 1e-3, 1e-1]})
    w2 = static_widget(svg_render, {"norm": ["batch", "layer"], "eps": [1e-5, 1e-3, 1e-1]})
    text = w1._repr_mimebundle_()["text/plain"]
    assert text == repr(w2) == "StaticWidget(norm=2, eps=3; 6 svg frames)"
    assert len(text) <= 110  # ipywidgets cuts text/plain at 110 characters


def test_embedded_state_holds_frames_and_links():
    """The state myst-nb embeds in the page must hold every frame and every jslink, so the
    page's widget manager can switch frames with no kernel."""
    w = static_widget(svg_render, {"a": [1, 2, 3], "b": ["x", "y"]}, caption="cap")
    data = embed_data(views=[w])
    state = data["manager_state"]["state"]
    by_id = dict(state)
    control_ids = {c.model_id for c in w.controls.values()}
    # (the state holds every widget of this process; keep the links of this widget)
    links = [
        v["state"]
        for v in by_id.values()
        if v["model_name"] == "LinkModel"
        and v["state"]["source"][0].removeprefix("IPY_MODEL_") in control_ids
    ]
    assert len(links) == len(w.links) == 1 + 3
    stack_ids = {s.model_id for level in w.stacks for s in level}
    for link in links:
        src_id, src_attr = link["source"]
        dst_id, dst_attr = link["target"]
        assert src_id.removeprefix("IPY_MODEL_") in control_ids and src_attr == "index"
        assert dst_id.removeprefix("IPY_MODEL_") in stack_ids and dst_attr == "selected_index"
    frame_ids = {f.model_id for f in w.frames.values()}
    assert frame_ids <= set(by_id)
    assert all("<svg" in by_id[i]["state"]["value"] for i in frame_ids)
    assert data["view_specs"][0]["model_id"] == w.model_id
    json.dumps(data)  # serializable as the page embeds it


# --- text alternatives ------------------------------------------------------------------


def titled_fig(slope):
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [0, slope])
    ax.set_title(r"line of slope $\gamma$")
    ax.set_xlabel("step $t$")
    return fig


def test_png_frames_say_what_they_show():
    """A figure's own words (its titles and axis labels, via the PNG's Description text) and
    the control settings that select the frame become the <img>'s alt text."""
    w = static_widget(titled_fig, {"slope": Control([0.5, 2.0], description="slope s")})
    assert frame_alt(w.frames[(0,)]) == "line of slope gamma (plot over step t). Shown for slope s: 0.5."
    assert frame_alt(w.frames[(1,)]).endswith("Shown for slope s: 2.")
    # a figure with no words: the settings alone
    w = static_widget(lambda slope, mode: fig_render(slope), {"slope": [0.5, 2.0], "mode": ["a", "b"]})
    assert frame_alt(w.frames[(1, 0)]) == "Picture for slope: 2; mode: a."


def test_alt_argument_names_every_frame():
    w = static_widget(fig_render, {"slope": [0.5, 2.0]}, alt=lambda slope: f"A line rising {slope} per unit.")
    assert [frame_alt(f) for f in w.frames.values()] == ["A line rising 0.5 per unit.", "A line rising 2.0 per unit."]
    w = static_widget(svg_render, {"a": [1, 2]}, alt=lambda a: f"Frame {a} <of 2>")
    assert '<svg role="img" aria-label="Frame 2 &lt;of 2&gt;"' in w.frames[(1,)].value
    with pytest.raises(TypeError, match="non-empty str"):
        static_widget(svg_render, {"a": [1]}, alt=lambda a: "  ")


def test_svg_frames_are_images_named_by_their_title():
    titled = ('<svg xmlns="http://www.w3.org/2000/svg" role="img" width="9" height="9">'
              "<title>{a} things</title></svg>")
    w = static_widget(lambda a: titled.format(a=a), {"a": [1, 2]})
    assert w.frames[(1,)].value == titled.format(a=2)  # already named: unchanged
    w = static_widget(svg_render, {"a": [1, 2], "b": ["x"]})
    assert w.frames[(1, 0)].value.startswith('<svg role="img" aria-label="Picture for a: 2; b: x"')


def test_figure_to_png_keeps_the_figure_words():
    from normcore.widgets import png_description

    for colors in (256, None):
        assert (png_description(figure_to_png(titled_fig(1.0), colors=colors))
                == "line of slope gamma (plot over step t)")
    assert png_description(figure_to_png(fig_render(1.0))) == ""


# --- a layout for phones (narrow=...) ----------------------------------------------------------

def test_narrow_svg_frames_hold_both_layouts_and_a_style_picks_one():
    narrow = lambda **v: svg_render(**v).replace('width="160"', 'width="80"')
    w = static_widget(svg_render, {"a": [1, 2]}, narrow=narrow)
    assert repr(w) == "StaticWidget(a=2; 2 svg frames, each also narrow)"
    for key, f in w.frames.items():
        wide, small = re.findall(r'<div class="normcore-(wide|narrow)">(<svg.*?</svg>)</div>', f.value)
        assert [wide[0], small[0]] == ["wide", "narrow"]
        assert 'width="160"' in wide[1] and 'width="80"' in small[1]
        assert f"a={w.specs['a'].items[key[0]]}" in small[1]       # the same values, drawn narrow
        assert wide[1].count('role="img"') == small[1].count('role="img"') == 1
    # the style that shows one of the two ships with the widget (JupyterLab has no book CSS)
    style = [c for c in w.children if "normcore-narrow-style" in c._dom_classes]
    assert len(style) == 1 and "@media (max-width:600px)" in style[0].value
    # the budget counts both layouts
    plain = static_widget(svg_render, {"a": [1, 2]})
    assert w.nbytes > plain.nbytes + sum(len(narrow(a=a)) for a in (1, 2)) - 10


def test_narrow_raster_frames_are_a_picture_with_a_source_for_phones():
    def render(slope, width=4.0):
        fig = Figure(figsize=(width, 2))
        ax = fig.subplots()
        ax.plot([0, 1], [0, slope])
        # the smallest text: 9 pt = 10 px at 80 dpi wide, 8.55 pt = 9.5 px narrow
        ax.tick_params(labelsize=9 if width > 3 else 8.55)
        return fig

    w = static_widget(render, {"slope": [1.0, 2.0]}, narrow=lambda slope: render(slope, 2.5))
    assert repr(w) == "StaticWidget(slope=2; 2 webp frames, each also narrow)"
    f = w.frames[(0,)]
    m = re.match(r'<picture><source media="\(max-width: 600px\)" srcset="data:image/webp;base64,'
                 r'([A-Za-z0-9+/=]+)"><img src="data:image/webp;base64,([A-Za-z0-9+/=]+)" (.*)>'
                 r'</picture>$', f.value)
    assert m, f.value[:200]
    small, wide = (Image.open(io.BytesIO(base64.b64decode(m.group(i)))) for i in (1, 2))
    assert (wide.width, small.width) == (2 * 320, 2 * 200)       # drawn at 2 x 80 dpi
    # the smallest text of either layout, and the density it was drawn at
    assert 'data-text-px="9.5" data-density="2"' in m.group(3)
    assert 'style="max-width:100%;height:auto;width:320px"' in m.group(3)


def test_frames_say_how_large_their_text_is():
    w = static_widget(fig_render, {"slope": [1.0]}, dpi=72, hidpi=False)
    size = plt.rcParams["xtick.labelsize"]
    size = matplotlib.font_manager.FontProperties(size=size).get_size_in_points()
    assert f'data-text-px="{size:.1f}" data-density="1"' in w.frames[(0,)].value
    assert "data-text-px" not in static_widget(svg_render, {"a": [1]}).frames[(0,)].value


def test_narrow_must_draw_the_same_kind_of_frame():
    with pytest.raises(TypeError, match=r"narrow\(0,\) returned a svg frame for a webp frame"):
        static_widget(fig_render, {"slope": [1.0]}, narrow=lambda slope: svg_render(s=slope))
