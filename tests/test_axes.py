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
