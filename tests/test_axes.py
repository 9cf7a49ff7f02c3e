"""normcore.axes: the label arrays and layouts give exactly torch's statistics."""
import pytest
import torch
import torch.nn.functional as TF

from normcore import axes

SHAPE = (3, 6, 4, 5)


def _normalize_by_labels(x, labels, eps=1e-5):
    """Normalize with one mean/variance per label: the definition of the sets S_i."""
    out = torch.empty_like(x)
    for lab in labels.unique():
        m = labels == lab
        v = x[m]
        out[m] = (v - v.mean()) / torch.sqrt(v.var(unbiased=False) + eps)
    return out


@pytest.mark.parametrize("norm, groups, torch_fn, set_size, num_sets", [
    ("batch", None, lambda x: TF.batch_norm(x, None, None, training=True), 3 * 4 * 5, 6),
    ("layer", None, lambda x: TF.layer_norm(x, x.shape[1:]), 6 * 4 * 5, 3),
    ("instance", None, lambda x: TF.instance_norm(x), 4 * 5, 18),
    ("group", 2, lambda x: TF.group_norm(x, 2), 3 * 4 * 5, 6),
    ("group", 3, lambda x: TF.group_norm(x, 3), 2 * 4 * 5, 9),
])
def test_label_arrays_give_torch_statistics(norm, groups, torch_fn, set_size, num_sets):
    x = torch.randn(SHAPE, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = axes.stat_groups(norm, SHAPE, groups)
    assert labels.shape == SHAPE
    assert labels.unique().numel() == num_sets
    assert (labels.flatten().bincount() == set_size).all()
    lay = axes.layout(norm, SHAPE, groups)
    assert (lay.set_size, lay.num_sets) == (set_size, num_sets)
    torch.testing.assert_close(_normalize_by_labels(x, labels), torch_fn(x))


def test_group_extremes_are_layer_and_instance():
    assert torch.equal(axes.stat_groups("group", SHAPE, 1), axes.stat_groups("layer", SHAPE))
    assert torch.equal(axes.stat_groups("group", SHAPE, 6), axes.stat_groups("instance", SHAPE))


def test_groups_are_contiguous_channels():
    labels = axes.stat_groups("group", (1, 6, 2), 3)
    assert labels[0, :, 0].tolist() == [0, 0, 1, 1, 2, 2]


def test_reduce_dims_and_affine():
    assert axes.reduce_dims("batch", SHAPE) == (0, 2, 3)
    assert axes.reduce_dims("instance", SHAPE) == (2, 3)
    assert axes.reduce_dims("layer", SHAPE) == (1, 2, 3)
    assert axes.layout("group", SHAPE, 3).view_shape == (3, 3, 2, 4, 5)
    assert axes.layout("layer", SHAPE, normalized_ndim=2).affine_shape == (4, 5)
    assert axes.layout("group", SHAPE, 3).affine_shape == (6,)
    assert axes.divisors(12) == [1, 2, 3, 4, 6, 12]
    assert "|S_i| = 60" in axes.describe("batch", SHAPE)


# --- the table, against torch, for every norm -------------------------------------------------
_TORCH = {
    "batch": lambda x, G: TF.batch_norm(x, None, None, training=True),
    "layer": lambda x, G: TF.layer_norm(x, x.shape[1:]),
    "instance": lambda x, G: TF.instance_norm(x),
    "group": lambda x, G: TF.group_norm(x, G),
    "rms": lambda x, G: TF.rms_norm(x, x.shape[1:], eps=1e-5),
}


def _by_labels(x, labels, centered, eps=1e-5):
    out = torch.empty_like(x)
    for lab in labels.unique():
        m = labels == lab
        v = x[m]
        if centered:
            out[m] = (v - v.mean()) / torch.sqrt(v.var(correction=0) + eps)
        else:
            out[m] = v / torch.sqrt((v * v).mean() + eps)
    return out


@pytest.mark.parametrize("norm, shape", [
    (norm, shape) for norm in sorted(axes.TABLE)
    for shape in [(3, 6), (3, 6, 5), (2, 6, 3, 4), (2, 6, 2, 3, 2)]
    if not (norm == "instance" and len(shape) < 3)])         # IN needs a spatial dim
def test_table_rows_give_torch_outputs(norm, shape):
    """Every row of the table, read through stat_groups, is exactly torch's op."""
    G = 3 if norm == "group" else None
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 2
    labels = axes.stat_groups(norm, shape, G)
    row = axes.TABLE[norm]
    torch.testing.assert_close(_by_labels(x, labels, row.centered), _TORCH[norm](x, G))
    assert axes.layout(norm, shape, G).centered == row.centered


def test_layer_over_trailing_dims_folds_leading_dims_into_n():
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    for k in (1, 2, 3, 4):
        lay = axes.layout("layer", x.shape, normalized_ndim=k)
        assert lay.affine_shape == x.shape[4 - k:]
        labels = axes.layout_labels(lay)
        torch.testing.assert_close(_by_labels(x, labels, True), TF.layer_norm(x, x.shape[4 - k:]))


def test_roles_layout_builds_any_set_and_says_it_in_words():
    shape = (2, 6, 4)
    assert axes.roles_layout(shape, ("N",)).reduce_dims == (0,)
    assert axes.roles_layout(shape, ("N", "C", "S")).set_size == 48
    assert axes.roles_layout(shape, ("last",)).reduce_dims == (2,)
    assert axes.roles_layout((4, 3), ("last",)).reduce_dims == (1,)
    assert axes.roles_layout(shape, ("G",), 2).reduce_dims == (2,)
    assert axes.roles_words(("N", "S")) == "all samples and positions of one channel"
    assert axes.roles_words(("G", "S"), 3) == (
        "all positions of the 3 channels of one group of one sample")
    assert axes.roles_words(("N",)) == "all samples of one channel at one position"
    with pytest.raises(ValueError, match="needs num_groups"):
        axes.roles_layout(shape, ("G",))
    with pytest.raises(ValueError, match="unknown roles"):
        axes.roles_layout(shape, ("X",))


def test_num_groups_is_checked_in_one_place_with_the_legal_values():
    with pytest.raises(ValueError, match=r"num_channels \(6\) must be divisible by num_groups \(4\).*\[1, 2, 3, 6\]"):
        axes.check_num_groups(4, 6)
    with pytest.raises(TypeError, match="must be an int"):
        axes.check_num_groups(2.0, 6)
    with pytest.raises(ValueError, match="divisible by num_groups"):
        axes.layout("group", (2, 6, 3), 4)
    with pytest.raises(ValueError, match="GroupNorm only"):
        axes.layout("batch", (2, 6, 3), 2)
    with pytest.raises(ValueError, match="unknown norm"):
        axes.layout("weight", (2, 6, 3))
