"""normcore.fold: Conv/Linear followed by an eval BN equals one folded layer."""
import pytest
import torch

import normcore.nn as nn
from normcore.fold import fold_bn


def _trained_bn(bn, layer, x):
    bn.train()
    with torch.no_grad():
        for s in range(5):
            bn(layer(x + s))
        if bn.weight is not None:
            bn.weight.uniform_(0.5, 2)
            bn.bias.uniform_(-1, 1)
    return bn.eval()


@pytest.mark.parametrize("make_layer, make_bn, shape", [
    (lambda: torch.nn.Conv2d(3, 8, 3, padding=1), lambda: nn.BatchNorm2d(8), (4, 3, 7, 7)),
    (lambda: torch.nn.Conv2d(3, 8, 3, bias=False), lambda: torch.nn.BatchNorm2d(8), (4, 3, 7, 7)),
    (lambda: torch.nn.Conv2d(4, 8, 3, groups=2, stride=2), lambda: nn.BatchNorm2d(8, affine=False), (4, 4, 9, 9)),
    (lambda: torch.nn.Conv1d(3, 5, 3), lambda: nn.BatchNorm1d(5), (4, 3, 10)),
    (lambda: torch.nn.Linear(6, 5), lambda: nn.BatchNorm1d(5, momentum=None), (9, 6)),
])
def test_fold_bn_equals_layer_then_bn(make_layer, make_bn, shape):
    torch.manual_seed(0)
    layer, x = make_layer(), torch.randn(shape)
    bn = _trained_bn(make_bn(), layer, x)
    fused = fold_bn(layer, bn)
    assert type(fused) is type(layer) and fused is not layer
    with torch.no_grad():
        torch.testing.assert_close(fused(x + 10), bn(layer(x + 10)), rtol=1e-5, atol=1e-5)
    assert fused.bias is not None
    # the originals are untouched
    if layer.bias is None:
        assert layer.bias is None
