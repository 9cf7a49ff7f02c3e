"""normcore.data: seeded, dtype-independent, and structured so that every set differs."""
import torch

from normcore import axes, data


def test_same_seed_same_numbers_in_every_dtype():
    a = data.structured(data.generator(3), (4, 3, 5))
    b = data.structured(data.generator(3), (4, 3, 5), torch.float32)
    assert torch.equal(a, data.structured(data.generator(3), (4, 3, 5)))
    assert torch.equal(a.float(), b)


def test_structured_inputs_give_every_norm_different_statistics():
    x = data.structured(data.generator(0), (4, 6, 5))
    means = {}
    for norm, G in (("batch", None), ("layer", None), ("instance", None), ("group", 2)):
        lay = axes.layout(norm, x.shape, G)
        means[norm] = x.reshape(lay.view_shape).mean(lay.reduce_dims, keepdim=True) \
            .expand(lay.view_shape).reshape(x.shape)
    names = sorted(means)
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            assert not torch.allclose(means[p], means[q]), (p, q)


def test_large_mean_cancels_to_zero_in_float32():
    x = data.large_mean(data.generator(1), (4, 8))
    naive = (x * x).mean(0) - x.mean(0) ** 2
    assert torch.equal(naive, torch.zeros(8))
    assert (x.double().var(0, correction=0) > 0).all()              # the true variance is not
