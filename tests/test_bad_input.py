"""Every bad input gives a clear error that names the problem (and never a silent number)."""
import pytest
import torch

import normcore.functional as F
import normcore.nn as nn
from normcore import axes, stats
from normcore.fold import fold_bn

x4 = torch.randn(2, 6, 3, 3)


@pytest.mark.parametrize("call, exc, words", [
    # a wrong ndim or shape
    (lambda: F.batch_norm(torch.randn(5), None, None, training=True), ValueError, "(N, C, *)"),
    (lambda: F.instance_norm(torch.randn(2, 3)), ValueError, "spatial"),
    (lambda: F.group_norm(torch.randn(4), 2), ValueError, "(N, C, *)"),
    (lambda: nn.BatchNorm2d(6)(torch.randn(2, 6, 3)), ValueError, "expected 4D input (got 3D input)"),
    (lambda: nn.BatchNorm1d(6)(x4), ValueError, "expected 2D or 3D input (got 4D input)"),
    (lambda: nn.BatchNorm2d(5)(x4), ValueError, "6 channels"),
    (lambda: nn.InstanceNorm2d(6)(torch.randn(2, 2, 6, 3, 3)), ValueError, "expected 3D or 4D input"),
    (lambda: nn.InstanceNorm2d(5, affine=True)(x4), ValueError, "num_features (5)"),
    (lambda: F.batch_norm(x4, torch.zeros(5), torch.ones(5)), ValueError, "running_mean has shape (5,)"),
    (lambda: F.batch_norm(x4, None, None, torch.ones(5), None, True), ValueError, "weight has shape (5,)"),
    (lambda: F.batch_norm(x4, None, None, training=False), ValueError, "running_mean and running_var"),
    (lambda: F.instance_norm(x4, use_input_stats=False), ValueError, "running_mean and running_var"),
    (lambda: F.weight_standardize(torch.randn(6)), ValueError, "(C_out, C_in, *kernel)"),
    (lambda: F.dyt(torch.randn(5), torch.ones(1), channels_last=False), ValueError, "(N, C, *)"),
    (lambda: F.dyt(x4, torch.ones(6)), ValueError, "alpha has shape (6,), expected one scalar"),
    # normalized_shape not matching the trailing dims
    (lambda: F.layer_norm(x4, (4, 3)), ValueError, "expected input with shape [*, 4, 3]"),
    (lambda: F.layer_norm(x4, (3,), torch.ones(4)), ValueError, "weight has shape (4,)"),
    (lambda: nn.LayerNorm(4)(x4), ValueError, "normalized_shape"),
    (lambda: nn.DyT(4)(x4), ValueError, "expected input with shape [*, 4]"),
    (lambda: F.dyt(x4, torch.ones(1), torch.ones(6)), ValueError, "needs channels_last=False"),
    (lambda: nn.DyT(4, channels_last=False)(x4), ValueError, "expected (6,)"),
    # num_groups not dividing the channels
    (lambda: F.group_norm(x4, 4), ValueError, "divisible by num_groups"),
    (lambda: nn.GroupNorm(4, 6), ValueError, "num_channels (6) must be divisible by num_groups (4)"),
    (lambda: axes.layout("group", (2, 6, 3), 4), ValueError, "[1, 2, 3, 6]"),
    (lambda: F.group_norm(x4, 2.0), TypeError, "num_groups must be an int"),
    # batch size 1 in BN training, with torch's message
    (lambda: F.batch_norm(torch.randn(1, 3), None, None, training=True), ValueError,
     "Expected more than 1 value per channel when training, got input size torch.Size([1, 3])"),
    (lambda: nn.BatchNorm2d(3)(torch.randn(1, 3, 1, 1)), ValueError, "more than 1 value per channel"),
    # a spatial size of 1 in IN training
    (lambda: F.instance_norm(torch.randn(4, 3, 1)), ValueError,
     "Expected more than 1 spatial element when training"),
    (lambda: nn.InstanceNorm2d(3)(torch.randn(2, 3, 1, 1)), ValueError, "more than 1 spatial element"),
    # integer dtype
    (lambda: F.batch_norm(torch.ones(4, 3, dtype=torch.long), None, None, training=True), TypeError,
     "floating-point"),
    (lambda: F.layer_norm(torch.ones(4, 3, dtype=torch.int32), (3,)), TypeError, "int32"),
    (lambda: nn.GroupNorm(1, 3)(torch.ones(2, 3, dtype=torch.uint8)), TypeError, "floating-point"),
    (lambda: nn.BatchNorm1d(3)(torch.ones(2, 3, dtype=torch.bool)), TypeError, ".float()"),
    (lambda: F.weight_standardize(torch.ones(3, 3, dtype=torch.int64)), TypeError, "floating-point"),
    (lambda: nn.DyT(3)(torch.ones(2, 3, dtype=torch.long)), TypeError, "floating-point"),
    (lambda: F.dyt(x4, torch.ones(1, dtype=torch.long)), TypeError, "alpha has dtype torch.int64"),
    (lambda: F.group_norm([[1.0, 2.0]], 1), TypeError, "torch.Tensor"),
    # eps <= 0
    (lambda: F.batch_norm(x4, None, None, training=True, eps=0.0), ValueError, "eps must be positive, got eps=0.0"),
    (lambda: F.layer_norm(x4, (3,), eps=-1e-5), ValueError, "eps must be positive"),
    (lambda: F.group_norm(x4, 2, eps=0), ValueError, "eps must be positive"),
    (lambda: F.instance_norm(x4, eps=0), ValueError, "eps must be positive"),
    (lambda: F.weight_standardize(torch.randn(3, 3), eps=0), ValueError, "eps must be positive"),
    (lambda: nn.BatchNorm2d(3, eps=0), ValueError, "eps must be positive"),
    (lambda: nn.LayerNorm(3, eps=-1), ValueError, "eps must be positive"),
    (lambda: F.layer_norm(x4, (3,), eps=float("nan")), ValueError, "eps must be positive"),
    (lambda: F.rms_norm(x4, (3,), eps=float("-inf")), ValueError, "eps must be positive"),
    (lambda: nn.GroupNorm(1, 3, eps=0), ValueError, "eps must be positive"),
    (lambda: nn.WSConv2d(3, 3, 1, ws_eps=0), ValueError, "eps must be positive"),
    (lambda: F.layer_norm(x4, (3,), eps="1e-5"), TypeError, "eps must be a positive number"),
    # momentum outside [0, 1]
    (lambda: F.batch_norm(x4, torch.zeros(6), torch.ones(6), training=True, momentum=1.5),
     ValueError, "outside [0, 1]"),
    (lambda: F.batch_norm(x4, torch.zeros(6), torch.ones(6), training=True, momentum=-0.1),
     ValueError, "outside [0, 1]"),
    (lambda: F.batch_norm(x4, torch.zeros(6), torch.ones(6), training=True, momentum=None),
     TypeError, "cumulative average"),
    (lambda: nn.BatchNorm2d(3, momentum=2), ValueError, "outside [0, 1]"),
    (lambda: nn.InstanceNorm2d(3, momentum=-1), ValueError, "outside [0, 1]"),
    (lambda: stats.RunningStats(3, momentum=1.01), ValueError, "outside [0, 1]"),
    # others
    (lambda: nn.BatchNorm2d(0), ValueError, "num_features must be a positive int"),
    (lambda: F.weight_standardize(torch.randn(3, 3), convention="bitt"), ValueError, "unknown convention"),
    (lambda: axes.layout("batchnorm", (2, 3)), ValueError, "unknown norm"),
    (lambda: stats.unbiased_from_biased(torch.ones(3), 1), ValueError, "at least 2 values"),
    (lambda: fold_bn(torch.nn.Linear(3, 4), nn.BatchNorm1d(5)), ValueError, "num_features=5"),
    (lambda: fold_bn(torch.nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False)),
     ValueError, "no running statistics"),
    (lambda: fold_bn(torch.nn.ReLU(), nn.BatchNorm1d(4)), TypeError, "Conv1d/Conv2d/Conv3d or Linear"),
])
def test_bad_input_gives_a_clear_error(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value), str(info.value)


def test_batch_of_one_is_fine_in_eval():
    bn = nn.BatchNorm2d(3).eval()
    y = bn(torch.randn(1, 3, 1, 1))
    assert torch.isfinite(y).all()
