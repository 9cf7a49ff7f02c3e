"""The GroupNorm chapter's group explorer (normcore.viz.group) and the identities it names."""
import xml.etree.ElementTree as ET

import pytest
import torch

import normcore.functional as F
from normcore import axes
from normcore.viz import group as vg

SVG = "{http://www.w3.org/2000/svg}"


def _x(shape=(3, 8, 2, 2), seed=5):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_identity_of():
    assert vg.identity_of(1, 8) == "layer"
    assert vg.identity_of(8, 8) == "instance"
    assert vg.identity_of(2, 8) == ""
    with pytest.raises(ValueError, match="divisible"):
        vg.identity_of(3, 8)


@pytest.mark.parametrize("G", axes.divisors(8))
@pytest.mark.parametrize("element", [(0, 1, 0), (2, 6, 3)])
def test_group_values_are_the_set_normalized(G, element):
    x = _x()
    values = vg.group_values(x, G, element)
    n, c, s = element
    per = 8 // G
    g = c // per
    expected = F.group_norm(x, G)[n, g * per:(g + 1) * per].reshape(-1)
    assert len(values) == per * 4
    assert torch.allclose(torch.sort(values).values, torch.sort(expected).values, atol=1e-12)


@pytest.mark.parametrize("G", axes.divisors(8))
def test_frame_structure(G):
    x = _x()
    frame = vg.group_explorer_svg(x, G, (2, 6, 3))
    root = ET.fromstring(frame)
    assert root.get("data-groups") == str(G)
    assert root.get("data-size") == str(8 // G * 4)
    assert root.get("data-identity") == {1: "layer", 8: "instance"}.get(G, "")
    assert root.find(f"{SVG}title") is not None and "GroupNorm" in root.find(f"{SVG}title").text
    bars = [e for e in root.iter(f"{SVG}rect") if e.get("class") == "bar"]
    assert len(bars) == len(vg.HIST_EDGES) - 1
    assert sum(int(b.get("data-count")) for b in bars) == 8 // G * 4
    # the nested cube is GroupNorm's, with the same G
    inner = root.find(f"{SVG}svg")
    assert inner.get("data-norm") == "group" and inner.get("data-groups") == str(G)
    if G in (1, 8):
        assert ("LayerNorm" if G == 1 else "InstanceNorm") in frame


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(3, 4, 5), (3, 4, 2, 3), (2, 4, 2, 2, 2)])
def test_gn_identities_with_affine(shape, dtype, affine):
    """G = C is InstanceNorm and G = 1 is LayerNorm with gamma constant over positions."""
    gen = torch.Generator().manual_seed(0)
    x = (2.0 + torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    C = shape[1]
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    gamma = torch.randn(C, generator=gen, dtype=torch.float64).to(dtype) if affine else None
    beta = torch.randn(C, generator=gen, dtype=torch.float64).to(dtype) if affine else None
    gn_C = F.group_norm(x, C, gamma, beta)
    assert torch.allclose(gn_C, F.instance_norm(x, weight=gamma, bias=beta), atol=tol)
    assert torch.allclose(gn_C, torch.nn.functional.instance_norm(x, weight=gamma, bias=beta),
                          atol=tol)
    view = (C,) + (1,) * (len(shape) - 2)
    g_ln = gamma.reshape(view).expand(shape[1:]) if affine else None
    b_ln = beta.reshape(view).expand(shape[1:]) if affine else None
    gn_1 = F.group_norm(x, 1, gamma, beta)
    assert torch.allclose(gn_1, F.layer_norm(x, shape[1:], g_ln, b_ln), atol=tol)
    assert torch.allclose(gn_1, torch.nn.functional.layer_norm(x, shape[1:], g_ln, b_ln),
                          atol=tol)
    if affine:   # LN's gamma varying over the positions of a channel: GN cannot follow
        g_var = g_ln.clone()
        g_var.reshape(C, -1)[0, 0] += 1.0
        ln = F.layer_norm(x, shape[1:], g_var, b_ln)
        assert not torch.allclose(ln, gn_1, atol=1e-3)
        others = (slice(None), slice(1, None))
        assert torch.allclose(ln[others], gn_1[others], atol=tol)
    assert torch.equal(axes.stat_groups("group", shape, 1), axes.stat_groups("layer", shape))
    assert torch.equal(axes.stat_groups("group", shape, C), axes.stat_groups("instance", shape))
    assert not torch.equal(axes.stat_groups("group", shape, 1), axes.stat_groups("batch", shape))


@pytest.mark.parametrize("narrow", [False, True])
def test_layernorm_note_fits_the_viewbox(narrow):
    """G = 1's note "LayerNorm over (C, H, W)" was clipped at "(C, H, W": it must end inside the
    viewBox of the frame (estimated width: 7 px a character of the 12 px note)."""
    import re

    svg = vg.group_explorer_svg(_x(), 1, (1, 2, 1), narrow=narrow)
    root = ET.fromstring(svg)
    _, _, vb_width, _ = map(float, root.get("viewBox").split())
    notes = re.findall(r'<text class="note" x="([0-9.]+)"[^>]*>([^<]*)</text>', svg)
    assert any("LayerNorm over (C, H, W)" in text for _, text in notes)
    for x0, text in notes:
        assert float(x0) + 7 * len(text) <= vb_width, (text, x0, vb_width)
