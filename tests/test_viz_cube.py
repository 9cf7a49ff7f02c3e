"""normcore.viz.cube: the shaded cells of the SVG are exactly the sets of normcore.axes.

The SVG is parsed as XML. Each element of S_i is a <path> with data-c/data-s inside a
<g data-n> (class "in-set", or "element" for the element itself); the top and right faces of the slabs
repeat the shading of the elements (n, c, 0) and (n, C-1, s). The expected sets come from
normcore.axes.stat_groups directly, and independently from torch's own normalizations.
"""
from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn.functional as TF

from normcore import axes
from normcore.viz import cube_panels_svg, cube_svg, set_statistics
from normcore.viz.cube import set_mask

SVG = "{http://www.w3.org/2000/svg}"
SHAPE = (4, 6, 4)                       # the chapter's N, C, H·W
SIZE_BUDGET = 8 * 1024                  # bytes per frame: every frame ships with the page
CASES = [("batch", None), ("layer", None), ("instance", None)] + [
    ("group", G) for G in axes.divisors(SHAPE[1])]


def sample(shape=SHAPE, seed=0):
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def parse(svg: str):
    """(root, front, top, right): the shaded faces as {(n, c, s): class}."""
    root = ET.fromstring(svg)
    front, top, right = {}, {}, {}
    for g in root.iter(f"{SVG}g"):
        if "data-n" not in g.attrib:
            continue
        n = int(g.get("data-n"))
        for p in g.iter(f"{SVG}path"):
            cls = set(p.get("class", "").split())
            state = cls & {"in-set", "element"}
            if not state:
                continue
            assert len(state) == 1, p.attrib
            state = state.pop()
            if "top" in cls:                     # top face of the element (n, c, 0)
                key = (n, int(p.get("data-c")), 0)
                assert key not in top
                top[key] = state
            elif "side" in cls:                  # right face of the element (n, C-1, s)
                key = (n, None, int(p.get("data-s")))
                assert key not in right
                right[key] = state
            else:
                key = (n, int(p.get("data-c")), int(p.get("data-s")))
                assert key not in front
                front[key] = state
    return root, front, top, right


def expected(norm, G, element, shape=SHAPE):
    """S_i from the label array of normcore.axes, as {(n, c, s): class}."""
    N, C = shape[:2]
    labels = axes.stat_groups(norm, shape, G).reshape(N, C, -1)
    n, c, s = element
    members = (labels == labels[n, c, s]).nonzero().tolist()
    return {tuple(k): ("element" if tuple(k) == tuple(element) else "in-set") for k in members}


@pytest.mark.parametrize("norm, G", CASES)
def test_shaded_cells_are_the_set_of_stat_groups(norm, G):
    N, C, S = SHAPE
    x = sample()
    for element in itertools.product(range(N), range(C), range(S)):
        svg = cube_svg(norm, element, G, x=x)
        root, front, top, right = parse(svg)
        want = expected(norm, G, element)
        assert front == want, (norm, G, element)
        assert list(front.values()).count("element") == 1
        # the slabs' top and right faces show the same elements, seen from above / the side
        assert top == {k: v for k, v in want.items() if k[2] == 0}
        assert right == {(n, None, s): v for (n, c, s), v in want.items() if c == C - 1}
        assert root.get("data-size") == str(len(want))
        assert root.get("data-element") == ",".join(map(str, element))
        assert root.get("data-norm") == norm
        assert root.get("data-groups") == (None if G is None else str(G))


@pytest.mark.parametrize("norm, G, torch_fn", [
    ("batch", None, lambda x: TF.batch_norm(x, None, None, training=True)),
    ("layer", None, lambda x: TF.layer_norm(x, x.shape[1:])),
    ("instance", None, TF.instance_norm),
    ("group", 2, lambda x: TF.group_norm(x, 2)),
    ("group", 3, lambda x: TF.group_norm(x, 3)),
])
def test_shaded_set_has_torchs_statistics(norm, G, torch_fn):
    """Independently of normcore.axes: normalizing x_i with the mean and biased variance of
    the shaded cells gives torch's output, and the SVG carries that mean and variance."""
    x = sample(seed=1)
    y = torch_fn(x)
    for element in [(0, 0, 0), (1, 2, 3), (3, 5, 1), (2, 4, 2)]:
        svg = cube_svg(norm, element, G, x=x)
        root, front, _, _ = parse(svg)
        cells = x[tuple(torch.tensor(sorted(front)).T)]
        mean, var = cells.mean(), cells.var(correction=0)
        assert float(root.get("data-mean")) == pytest.approx(float(mean), rel=1e-8, abs=1e-12)
        assert float(root.get("data-var")) == pytest.approx(float(var), rel=1e-8)
        torch.testing.assert_close((x[element] - mean) / torch.sqrt(var + 1e-5), y[element])
        st = set_statistics(x, norm, element, G)
        assert st.y == pytest.approx(float(y[element]), rel=1e-9, abs=1e-12)
        assert st.size == len(front) == int(st.mask.sum())


def test_group_extremes_draw_layer_and_instance():
    x = sample()
    for element in [(0, 0, 0), (2, 3, 1), (3, 5, 3)]:
        assert parse(cube_svg("group", element, 1, x=x))[1] == parse(cube_svg("layer", element, x=x))[1]
        assert parse(cube_svg("group", element, 6, x=x))[1] == parse(cube_svg("instance", element, x=x))[1]


def test_four_dimensional_shape_is_drawn_flattened():
    shape = (2, 4, 2, 3)                         # H·W = 6, s = h * W + w
    for norm, G in [("batch", None), ("layer", None), ("instance", None), ("group", 2)]:
        for element in [(0, 0, 0), (1, 3, 5), (1, 1, 4)]:
            front = parse(cube_svg(norm, element, G, shape=shape))[1]
            assert front == expected(norm, G, element, shape)
    assert set_mask("group", shape, (1, 1, 4), 2).shape == (2, 4, 6)


def test_size_budget_and_accessibility():
    x = sample()
    sizes = []
    for (norm, G), element in itertools.product(CASES, [(0, 0, 0), (1, 2, 3), (2, 3, 1), (3, 5, 2)]):
        svg = cube_svg(norm, element, G, x=x, note="the G slider applies to GroupNorm only")
        sizes.append(len(svg.encode("utf-8")))
        root = ET.fromstring(svg)
        # a <title> first, for screen readers; it names the set in words
        assert root[0].tag == f"{SVG}title"
        assert f"|S_i| = {root.get('data-size')} elements" in root[0].text
        assert root.get("role") == "img"
        # many frames share a page: no ids (they would clash), no url(#...) references, and
        # every CSS rule scoped to the picture
        assert " id=" not in svg and "url(#" not in svg
        css = root.find(f"{SVG}style").text
        assert all(rule.strip().startswith(".nc-cube") for rule in re.findall(r"([^{}]+)\{", css))
    assert max(sizes) <= SIZE_BUDGET, max(sizes)
    row = cube_panels_svg(element=(1, 2, 3), columns=2)
    assert len(row.encode("utf-8")) <= 2.5 * SIZE_BUDGET
    assert ET.fromstring(row)[0].tag == f"{SVG}title"


@pytest.mark.parametrize("columns", [None, 1, 2, 3])
def test_panels_show_each_norms_set(columns):
    panels = [("batch", None), ("layer", None), ("instance", None), ("group", 3)]
    root = ET.fromstring(cube_panels_svg(panels, element=(1, 2, 3), columns=columns))
    # rows of `columns` cubes, 14 px apart
    one_row = int(ET.fromstring(cube_panels_svg(panels[:1], element=(1, 2, 3))).get("height"))
    rows = -(-len(panels) // (columns or len(panels)))
    assert int(root.get("height")) == rows * (one_row + 14) - 14
    cubes = []
    # the row draws one cube per panel, in order; each cube's slabs are <g data-n> groups,
    # the front-most (n = 0) last
    groups = [g for g in root.iter(f"{SVG}g") if "data-n" in g.attrib]
    assert len(groups) == len(panels) * SHAPE[0]
    for k in range(len(panels)):
        one = ET.Element(f"{SVG}svg")
        one.extend(groups[k * SHAPE[0]:(k + 1) * SHAPE[0]])
        cubes.append(parse(ET.tostring(one, encoding="unicode"))[1])
    for (norm, G), front in zip(panels, cubes):
        assert front == expected(norm, G, (1, 2, 3))


def test_deterministic():
    x = sample()
    assert cube_svg("group", (1, 2, 3), 3, x=x) == cube_svg("group", (1, 2, 3), 3, x=x.clone())


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(norm="batchnorm"), ValueError, "unknown norm"),
    (dict(norm="group"), ValueError, "needs num_groups"),
    (dict(norm="group", num_groups=4), ValueError, "divisor"),
    (dict(norm="group", num_groups=2.0), TypeError, "must be an int"),
    (dict(norm="batch", num_groups=2), ValueError, "GroupNorm only"),
    (dict(norm="layer", element=(0, 6, 0)), ValueError, "c=6 must be in 0..5"),
    (dict(norm="layer", element=(-1, 0, 0)), ValueError, "n=-1"),
    (dict(norm="layer", element=(0, 0)), TypeError, "three ints"),
    (dict(norm="layer", element="000"), TypeError, "three ints"),
    (dict(norm="layer", element=(0, 0, 1.0)), TypeError, "three ints"),
    (dict(norm="layer", shape=(4, 6)), ValueError, "at least one spatial dim"),
    (dict(norm="layer", shape=(4, 0, 4)), ValueError, ">= 1"),
    (dict(norm="layer", shape=(64, 6, 4)), ValueError, "too large"),
    (dict(norm="layer", shape="4x6x4"), TypeError, "sequence of ints"),
    (dict(norm="layer", shape=(4, 6, 4.5)), TypeError, "sequence of ints"),
    (dict(norm="layer", shape=None), TypeError, "sequence of ints"),
    (dict(norm="layer", x=torch.zeros(4, 6, 4, dtype=torch.int64)), TypeError, "floating-point"),
])
def test_bad_arguments_raise_clear_errors(kwargs, error, message):
    args = dict(element=(0, 0, 0))
    args.update(kwargs)
    norm = args.pop("norm")
    with pytest.raises(error, match=message):
        cube_svg(norm, **args)


def test_bad_panels_arguments():
    with pytest.raises(TypeError, match="non-empty sequence"):
        cube_panels_svg([])
    with pytest.raises(ValueError, match="GroupNorm only"):
        cube_panels_svg([("layer", 2)])
    with pytest.raises(ValueError, match="columns must be a positive int"):
        cube_panels_svg(columns=0)
