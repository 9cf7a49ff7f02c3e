"""Bad calls raise what torch raises, with normcore's message; edge cases behave as torch's.

The table: for each bad call, torch's twin raises ``T`` (the test checks that it does, on the
installed torch), and normcore raises an instance of ``T`` (its classes in
:mod:`normcore.errors` are ``ValueError`` / ``TypeError`` *and* torch's type) whose message
names the problem and the fix.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as TF

import normcore.functional as F
import normcore.nn as nn
from normcore import errors

f64 = torch.float64
x = torch.randn(4, 3, 5)
x4 = torch.randn(2, 4, 3)
ints = torch.ones(4, 3, dtype=torch.long)
z3, o3 = torch.zeros(3), torch.ones(3)
d3 = torch.ones(3, dtype=f64)

# (id, torch's call, normcore's call, words naming the problem, words naming the fix)
TABLE = [
    # shapes: torch raises RuntimeError (IndexError for a 1-D BatchNorm input)
    ("bn weight shape", lambda: TF.batch_norm(x, None, None, torch.ones(4), None, True),
     lambda: F.batch_norm(x, None, None, torch.ones(4), None, True),
     "weight has shape (4,), expected (3,)", "give weight that shape"),
    ("bn bias shape", lambda: TF.batch_norm(x, None, None, None, torch.ones(4), True),
     lambda: F.batch_norm(x, None, None, None, torch.ones(4), True), "bias has shape (4,)",
     "give bias that shape"),
    ("bn running_mean shape", lambda: TF.batch_norm(x, torch.zeros(4), torch.ones(4), training=True),
     lambda: F.batch_norm(x, torch.zeros(4), torch.ones(4), training=True),
     "running_mean has shape (4,)", "give running_mean that shape"),
    ("BatchNorm1d channels", lambda: tnn.BatchNorm1d(3)(torch.randn(4, 5, 2)),
     lambda: nn.BatchNorm1d(3)(torch.randn(4, 5, 2)), "got an input with 5 channels",
     "num_features must be the input's channel count"),
    ("bn 1-D input", lambda: TF.batch_norm(torch.randn(3), None, None, training=True),
     lambda: F.batch_norm(torch.randn(3), None, None, training=True), "got shape (3,)",
     "(N, C, *)"),
    ("bn eval without buffers", lambda: TF.batch_norm(x, None, None, training=False),
     lambda: F.batch_norm(x, None, None, training=False), "needs both running_mean and running_var",
     "running_mean and running_var"),
    ("in eval without buffers", lambda: TF.instance_norm(x, use_input_stats=False),
     lambda: F.instance_norm(x, use_input_stats=False), "use_input_stats=False",
     "needs both running_mean and running_var"),
    ("in weight shape", lambda: TF.instance_norm(x, weight=torch.ones(4)),
     lambda: F.instance_norm(x, weight=torch.ones(4)), "weight has shape (4,)",
     "give weight that shape"),
    ("ln normalized_shape", lambda: TF.layer_norm(x, (4,)), lambda: F.layer_norm(x, (4,)),
     "Given normalized_shape=[4]", "must equal the input's last dims"),
    ("ln empty normalized_shape", lambda: TF.layer_norm(x, ()), lambda: F.layer_norm(x, ()),
     "normalized_shape=[]", "must equal the input's last dims"),
    ("ln weight shape", lambda: TF.layer_norm(x, (5,), torch.ones(4)),
     lambda: F.layer_norm(x, (5,), torch.ones(4)), "weight has shape (4,)", "give weight that shape"),
    ("LayerNorm(-1)", lambda: tnn.LayerNorm(-1), lambda: nn.LayerNorm(-1), "normalized_shape",
     "positive"),
    ("BatchNorm2d(-1)", lambda: tnn.BatchNorm2d(-1), lambda: nn.BatchNorm2d(-1), "num_features",
     "positive int"),
    ("rms normalized_shape", lambda: TF.rms_norm(x, (4,)), lambda: F.rms_norm(x, (4,)),
     "Given normalized_shape=[4]", "must equal the input's last dims"),
    ("rms weight shape", lambda: TF.rms_norm(x, (5,), torch.ones(4)),
     lambda: F.rms_norm(x, (5,), torch.ones(4)), "weight has shape (4,)", "give weight that shape"),
    ("gn not divisible", lambda: TF.group_norm(x4, 3), lambda: F.group_norm(x4, 3),
     "divisible by num_groups", "divisors of 4"),
    ("GroupNorm not divisible", lambda: tnn.GroupNorm(3, 4), lambda: nn.GroupNorm(3, 4),
     "num_channels (4) must be divisible by num_groups (3)", "divisors of 4"),
    ("gn num_groups 0", lambda: TF.group_norm(x4, 0), lambda: F.group_norm(x4, 0),
     "num_groups=0", "divisors of 4"),
    ("GroupNorm(0, 4)", lambda: tnn.GroupNorm(0, 4), lambda: nn.GroupNorm(0, 4),
     "num_groups (0)", "divisors of 4"),
    ("gn num_groups -2", lambda: TF.group_norm(x4, -2), lambda: F.group_norm(x4, -2),
     "num_groups=-2", "divisors of 4"),
    ("gn weight shape", lambda: TF.group_norm(x4, 2, torch.ones(3)),
     lambda: F.group_norm(x4, 2, torch.ones(3)), "weight has shape (3,)", "give weight that shape"),
    ("GroupNorm channels", lambda: tnn.GroupNorm(2, 4)(torch.randn(2, 6, 3)),
     lambda: nn.GroupNorm(2, 4)(torch.randn(2, 6, 3)), "weight has shape (4,), expected (6,)",
     "an input that matches it"),
    ("gn 1-D input", lambda: TF.group_norm(torch.randn(4), 2), lambda: F.group_norm(torch.randn(4), 2),
     "got shape (4,)", "(N, C, *)"),
    # dtypes: torch raises RuntimeError ("mixed dtype"), NotImplementedError for integers
    ("bn float64 weight", lambda: TF.batch_norm(x, None, None, d3, None, True),
     lambda: F.batch_norm(x, None, None, d3, None, True), "mixed dtype: weight has dtype torch.float64",
     "input.to(torch.float64), or module.to(torch.float32)"),
    ("bn float64 buffers", lambda: TF.batch_norm(x, d3 * 0, d3, training=True),
     lambda: F.batch_norm(x, d3 * 0, d3, training=True), "running_mean has dtype torch.float64",
     "module.to(torch.float32)"),
    ("bn float16 weight", lambda: TF.batch_norm(x, None, None, o3.half(), None, True),
     lambda: F.batch_norm(x, None, None, o3.half(), None, True), "weight has dtype torch.float16",
     "module.to(torch.float32)"),
    ("BatchNorm1d float64 train", lambda: tnn.BatchNorm1d(3).double()(x),
     lambda: nn.BatchNorm1d(3).double()(x), "mixed dtype", "module.to(torch.float32)"),
    ("BatchNorm1d float64 eval", lambda: tnn.BatchNorm1d(3).double().eval()(x),
     lambda: nn.BatchNorm1d(3).double().eval()(x), "mixed dtype", "module.to(torch.float32)"),
    ("in float64 weight", lambda: TF.instance_norm(x, weight=d3, bias=d3),
     lambda: F.instance_norm(x, weight=d3, bias=d3), "weight has dtype torch.float64",
     "input.to(torch.float64)"),
    ("InstanceNorm1d float64", lambda: tnn.InstanceNorm1d(3, affine=True).double()(x),
     lambda: nn.InstanceNorm1d(3, affine=True).double()(x), "mixed dtype", "module.to(torch.float32)"),
    ("LayerNorm float64", lambda: tnn.LayerNorm(5).double()(x), lambda: nn.LayerNorm(5).double()(x),
     "mixed dtype", "module.to(torch.float32)"),
    ("LayerNorm float16, float32 input", lambda: tnn.LayerNorm(5).half()(x),
     lambda: nn.LayerNorm(5).half()(x), "weight has dtype torch.float16", "module.to(torch.float32)"),
    ("GroupNorm float64", lambda: tnn.GroupNorm(2, 4).double()(x4),
     lambda: nn.GroupNorm(2, 4).double()(x4), "mixed dtype", "module.to(torch.float32)"),
    ("bn integer input", lambda: TF.batch_norm(ints, None, None, training=True),
     lambda: F.batch_norm(ints, None, None, training=True), "dtype torch.int64", ".float()"),
    ("ln integer input", lambda: TF.layer_norm(ints, (3,)), lambda: F.layer_norm(ints, (3,)),
     "dtype torch.int64", ".float()"),
    # values torch checks in Python: ValueError / TypeError
    ("bn batch of one", lambda: TF.batch_norm(torch.randn(1, 3), None, None, training=True),
     lambda: F.batch_norm(torch.randn(1, 3), None, None, training=True),
     "Expected more than 1 value per channel", "use a batch of at least 2, or eval mode"),
    ("in one position", lambda: TF.instance_norm(torch.randn(2, 3, 1)),
     lambda: F.instance_norm(torch.randn(2, 3, 1)), "Expected more than 1 spatial element",
     "over one value"),
    ("bn eps 0", lambda: TF.batch_norm(x, None, None, training=True, eps=0),
     lambda: F.batch_norm(x, None, None, training=True, eps=0), "eps must be positive",
     "pass eps > 0"),
    ("bn one buffer", lambda: TF.batch_norm(x, z3, None, training=True),
     lambda: F.batch_norm(x, z3, None, training=True), "running_mean and running_var",
     "give both"),
    ("bn momentum None", lambda: TF.batch_norm(x, z3.clone(), o3.clone(), training=True, momentum=None),
     lambda: F.batch_norm(x, z3.clone(), o3.clone(), training=True, momentum=None),
     "momentum=None", "pass momentum=1/num_batches_tracked"),
    ("gn num_groups float", lambda: TF.group_norm(x4, 2.0), lambda: F.group_norm(x4, 2.0),
     "num_groups must be an int", "2.0"),
    ("BatchNorm2d(2.0)", lambda: tnn.BatchNorm2d(2.0), lambda: nn.BatchNorm2d(2.0),
     "num_features must be a positive int", "2.0"),
    ("LayerNorm(2.0)", lambda: tnn.LayerNorm(2.0), lambda: nn.LayerNorm(2.0),
     "normalized_shape must be an int or a sequence of ints", "2.0"),
    # an empty batch whose statistics would be written into running buffers
    ("InstanceNorm1d affine, running stats, N = 0",
     lambda: tnn.InstanceNorm1d(3, affine=True, track_running_stats=True)(torch.randn(0, 3, 4)),
     lambda: nn.InstanceNorm1d(3, affine=True, track_running_stats=True)(torch.randn(0, 3, 4)),
     "has no instance", "Skip empty batches"),
]


@pytest.mark.parametrize("theirs, ours, problem, fix", [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_the_error_is_torchs_type_with_normcores_message(theirs, ours, problem, fix):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as t:
            theirs()
        with pytest.raises(t.type) as o:
            ours()
    assert type(o.value).__module__ in ("normcore.errors", "builtins"), type(o.value)
    assert isinstance(o.value, (ValueError, TypeError)), type(o.value)
    message = str(o.value)
    assert problem in message, message
    assert fix in message, message


def test_the_error_classes_are_both_types():
    assert issubclass(errors.ShapeError, ValueError) and issubclass(errors.ShapeError, RuntimeError)
    assert issubclass(errors.DtypeError, TypeError) and issubclass(errors.DtypeError, RuntimeError)
    assert issubclass(errors.NotFloatError, NotImplementedError)
    assert issubclass(errors.NumGroupsError, ZeroDivisionError)
    assert issubclass(errors.DimsError, IndexError)
    assert issubclass(errors.EmptyBatchError, IndexError)


def test_one_type_per_mistake():
    # the example: a float num_groups, in the module and in the function
    for call in (lambda: nn.GroupNorm(2.0, 4), lambda: F.group_norm(x4, 2.0)):
        with pytest.raises(TypeError, match="num_groups must be"):
            call()
    for call in (lambda: nn.GroupNorm(3, 4), lambda: F.group_norm(x4, 3)):
        with pytest.raises(errors.NumGroupsError):
            call()


# ---------------------------------------------------------------------------------------
# edge behaviour
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_on_an_empty_batch_is_torchs(momentum, affine):
    ref = tnn.BatchNorm2d(3, momentum=momentum, affine=affine)
    ours = nn.BatchNorm2d(3, momentum=momentum, affine=affine)
    ours.load_state_dict(ref.state_dict())
    outs = []
    for m in (ref, ours):
        xe = torch.randn(0, 3, 4, 4, requires_grad=True)
        y = m(xe)
        y.sum().backward()
        outs.append((y, xe.grad, [p.grad for p in m.parameters()]))
    (y1, g1, p1), (y2, g2, p2) = outs
    assert y2.shape == y1.shape == (0, 3, 4, 4) and y2.dtype == y1.dtype
    assert g2.shape == g1.shape
    for a, b in zip(p1, p2):
        torch.testing.assert_close(a, b)       # zeros
    # the buffers: untouched, the step still counted, as torch
    for (n1, b1), (n2, b2) in zip(ref.named_buffers(), ours.named_buffers()):
        assert n1 == n2
        torch.testing.assert_close(b1, b2)
    torch.testing.assert_close(ours.running_mean, torch.zeros(3))
    torch.testing.assert_close(ours.running_var, torch.ones(3))
    # the functional op, with buffers: an empty output, buffers as they were
    rm, rv = torch.full((3,), 0.5), torch.full((3,), 2.0)
    assert F.batch_norm(torch.randn(0, 3), rm, rv, training=True).shape == (0, 3)
    assert torch.equal(rm, torch.full((3,), 0.5)) and torch.equal(rv, torch.full((3,), 2.0))


@pytest.mark.parametrize("affine", [True, False])
def test_instance_norm_with_running_stats_refuses_an_empty_batch(affine):
    m = nn.InstanceNorm2d(3, affine=affine, track_running_stats=True)
    with pytest.raises(errors.EmptyBatchError, match="has no instance"):
        m(torch.randn(0, 3, 4, 4))
    # nothing written: no NaN in the buffers (torch writes NaN without affine)
    assert torch.equal(m.running_mean, torch.zeros(3))
    assert torch.equal(m.running_var, torch.ones(3))
    with pytest.raises(IndexError):            # what torch raises with affine=True
        m(torch.randn(0, 3, 4, 4))
    # in eval mode, and without buffers, an empty batch gives an empty output
    assert m.eval()(torch.randn(0, 3, 4, 4)).shape == (0, 3, 4, 4)
    assert nn.InstanceNorm2d(3)(torch.randn(0, 3, 4, 4)).shape == (0, 3, 4, 4)
    assert TF.instance_norm(torch.randn(0, 3, 4, 4)).shape == (0, 3, 4, 4)


def test_reduced_precision_input_with_float32_parameters_is_allowed_as_in_torch():
    xh = torch.randn(4, 3, 5).half()
    for ours, theirs in ((lambda: F.batch_norm(xh, torch.zeros(3), torch.ones(3), o3, z3, True),
                          lambda: TF.batch_norm(xh, torch.zeros(3), torch.ones(3), o3, z3, True)),
                         (lambda: F.layer_norm(xh.bfloat16(), (5,), torch.ones(5)),
                          lambda: TF.layer_norm(xh.bfloat16(), (5,), torch.ones(5))),
                         (lambda: F.group_norm(xh[:, :2], 2, torch.ones(2)),
                          lambda: TF.group_norm(xh[:, :2], 2, torch.ones(2)))):
        y, ref = ours(), theirs()
        assert y.dtype == ref.dtype
        torch.testing.assert_close(y.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_rms_norm_takes_a_weight_of_another_dtype_as_torch_does():
    w = torch.rand(5, dtype=f64) + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # torch: "Mismatch dtype ... fused implementation"
        ref = TF.rms_norm(x, (5,), w)
    y = F.rms_norm(x, (5,), w)
    assert y.dtype == ref.dtype
    torch.testing.assert_close(y, ref)
