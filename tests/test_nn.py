"""normcore.nn modules against torch.nn: outputs, buffers over steps, state_dict both ways."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

import normcore.nn as nn
import copy

from strategies import TOL, assert_matches, dtypes, make_input, nchw_shapes

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True)

BN = {2: (nn.BatchNorm1d, torch.nn.BatchNorm1d), 3: (nn.BatchNorm1d, torch.nn.BatchNorm1d),
      4: (nn.BatchNorm2d, torch.nn.BatchNorm2d), 5: (nn.BatchNorm3d, torch.nn.BatchNorm3d)}
IN = {3: (nn.InstanceNorm1d, torch.nn.InstanceNorm1d), 4: (nn.InstanceNorm2d, torch.nn.InstanceNorm2d),
      5: (nn.InstanceNorm3d, torch.nn.InstanceNorm3d)}


def _pair(ours_cls, torch_cls, *args, dtype=torch.float32, seed=0, **kw):
    """The same module in normcore and torch, with the same random parameters."""
    theirs = torch_cls(*args, dtype=dtype, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5 + 1)
    ours = ours_cls(*args, dtype=dtype, **kw)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _step(ours, theirs, x, dtype):
    """One forward/backward of both; outputs, gradients and state must agree.  In float32
    a float64 copy of torch's module is the arbiter where the inputs are ill-conditioned."""
    twin = copy.deepcopy(theirs).double() if dtype == torch.float32 else None
    dy = make_input(x.shape, dtype, 99, loc_scale=False)
    runs = []
    for mod, inp in ((ours, x), (theirs, x), (twin, x.double())):
        if mod is None:
            runs.append([None] * 10)
            continue
        xi = inp.clone().requires_grad_(True)
        y = mod(xi)
        y.backward(dy.to(inp.dtype))
        runs.append([y, xi.grad] + [p.grad for p in mod.parameters()])
    (ya, *ga), (yb, *gb), (yc, *gc) = runs
    assert_matches(ya, yb, dtype, exact=yc)
    for a, b, c in zip(ga, gb, gc):
        assert_matches(a, b, dtype, grad=True, exact=c)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    sa, sb = ours.state_dict(), theirs.state_dict()
    assert list(sa) == list(sb)
    for k in sb:
        torch.testing.assert_close(sa[k], sb[k], **TOL[dtype])


@SETTINGS
@given(shape=nchw_shapes(max_spatial=3), dtype=dtypes, affine=st.booleans(), bias=st.booleans(),
       track=st.booleans(), momentum=st.sampled_from([0.1, 0.5, None]), seed=st.integers(0, 999))
def test_batchnorm_modules_train_and_eval_over_steps(shape, dtype, affine, bias, track, momentum, seed):
    ours, theirs = _pair(*BN[len(shape)], shape[1], momentum=momentum, affine=affine,
                         track_running_stats=track, dtype=dtype, seed=seed, bias=bias)
    for step in range(4):
        _step(ours, theirs, make_input(shape, dtype, seed + step), dtype)
    ours.eval(), theirs.eval()
    for step in range(2):
        _step(ours, theirs, make_input(shape, dtype, seed + 10 + step), dtype)


@SETTINGS
@given(shape=nchw_shapes(min_spatial=1), dtype=dtypes, affine=st.booleans(), track=st.booleans(),
       momentum=st.sampled_from([0.1, None]), unbatched=st.booleans(), seed=st.integers(0, 999))
def test_instancenorm_modules(shape, dtype, affine, track, momentum, unbatched, seed):
    if all(s == 1 for s in shape[2:]):
        shape = shape[:2] + (3,) + shape[3:]
    ours, theirs = _pair(*IN[len(shape)], shape[1], momentum=momentum, affine=affine,
                         track_running_stats=track, dtype=dtype, seed=seed)
    for step in range(3):
        x = make_input(shape, dtype, seed + step)
        _step(ours, theirs, x[0] if unbatched else x, dtype)
    ours.eval(), theirs.eval()
    _step(ours, theirs, make_input(shape, dtype, seed + 5), dtype)


@SETTINGS
@given(shape=nchw_shapes(min_batch=1), dtype=dtypes, data=st.data(), seed=st.integers(0, 999))
def test_layernorm_and_groupnorm_modules(shape, dtype, data, seed):
    k = data.draw(st.integers(1, len(shape) - 1))
    affine, bias = data.draw(st.booleans()), data.draw(st.booleans())
    ours, theirs = _pair(nn.LayerNorm, torch.nn.LayerNorm, shape[len(shape) - k:],
                         elementwise_affine=affine, bias=bias, dtype=dtype, seed=seed)
    _step(ours, theirs, make_input(shape, dtype, seed), dtype)
    G = data.draw(st.sampled_from([d for d in range(1, shape[1] + 1) if shape[1] % d == 0]))
    if all(s == 1 for s in shape[2:]) and G == shape[1]:
        shape = shape[:2] + (2,)
    ours, theirs = _pair(nn.GroupNorm, torch.nn.GroupNorm, G, shape[1], affine=affine,
                         bias=bias, dtype=dtype, seed=seed)
    _step(ours, theirs, make_input(shape, dtype, seed), dtype)


@pytest.mark.parametrize("make", [
    lambda m: m.BatchNorm2d(5), lambda m: m.BatchNorm1d(5, affine=False),
    lambda m: m.BatchNorm3d(5, momentum=None), lambda m: m.BatchNorm1d(5, track_running_stats=False),
    lambda m: m.BatchNorm2d(5, bias=False), lambda m: m.InstanceNorm2d(5),
    lambda m: m.InstanceNorm1d(5, affine=True, track_running_stats=True),
    lambda m: m.LayerNorm((5, 3)), lambda m: m.LayerNorm(5, bias=False),
    lambda m: m.LayerNorm(5, elementwise_affine=False), lambda m: m.GroupNorm(5, 5),
    lambda m: m.GroupNorm(1, 5, affine=False),
])
def test_state_dict_round_trip_and_repr(make):
    ours, theirs = make(nn), make(torch.nn)
    assert repr(ours) == repr(theirs)
    # torch -> normcore -> torch, with non-default values everywhere
    with torch.no_grad():
        for i, t in enumerate(theirs.state_dict().values()):
            t.copy_(torch.arange(t.numel()).reshape(t.shape) + i + 1)
    ours.load_state_dict(theirs.state_dict())
    fresh = make(torch.nn)
    fresh.load_state_dict(ours.state_dict())
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
        assert torch.equal(fresh.state_dict()[k], v), k
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]


def test_old_state_dict_without_num_batches_tracked_loads():
    theirs = torch.nn.BatchNorm2d(3)
    sd = theirs.state_dict()
    del sd["num_batches_tracked"]
    sd._metadata[""]["version"] = 1
    ours = nn.BatchNorm2d(3)
    ours.load_state_dict(sd)
    assert int(ours.num_batches_tracked) == 0


def test_momentum_none_is_cumulative_average():
    bn = nn.BatchNorm1d(2, momentum=None)
    batches = [make_input((8, 2), torch.float64, s).float() for s in range(5)]
    for b in batches:
        bn(b)
    means = torch.stack([b.mean(0) for b in batches])
    torch.testing.assert_close(bn.running_mean, means.mean(0))  # plain average, not an EMA
    vars_ = torch.stack([b.var(0, unbiased=True) for b in batches])
    torch.testing.assert_close(bn.running_var, vars_.mean(0))
    assert int(bn.num_batches_tracked) == 5


def test_eval_uses_running_stats_and_no_tracking_uses_batch_stats():
    x = make_input((6, 3), torch.float32, 0)
    bn = nn.BatchNorm1d(3, affine=False).eval()
    torch.testing.assert_close(bn(x), x / (1 + 1e-5) ** 0.5)  # fresh buffers: mean 0, var 1
    untracked = nn.BatchNorm1d(3, affine=False, track_running_stats=False).eval()
    y = untracked(x)
    torch.testing.assert_close(y.mean(0), torch.zeros(3), atol=1e-6, rtol=0)


def test_train_mode_comes_from_module_training_not_grad_mode():
    bn = nn.BatchNorm1d(3)
    x = make_input((6, 3), torch.float32, 1)
    with torch.no_grad():
        bn(x)  # still train mode: updates the buffers
    assert int(bn.num_batches_tracked) == 1
    assert not torch.equal(bn.running_mean, torch.zeros(3))


@pytest.mark.parametrize("convention", ["original", "bit", "timm"])
def test_wsconv2d_equals_conv_with_standardized_weight(convention):
    torch.manual_seed(0)
    conv = nn.WSConv2d(3, 4, 3, padding=1, convention=convention)
    x = torch.randn(2, 3, 6, 6)
    w = conv.weight.detach()
    flat = w.reshape(4, -1)
    m = flat.mean(1, keepdim=True)
    if convention == "original":
        what = (flat - m) / (flat.std(1, keepdim=True) + 1e-5)
    else:
        eps = {"bit": 1e-10, "timm": 1e-6}[convention]
        what = (flat - m) / torch.sqrt(flat.var(1, unbiased=False, keepdim=True) + eps)
    expect = torch.nn.functional.conv2d(x, what.reshape_as(w), conv.bias, padding=1)
    torch.testing.assert_close(conv(x), expect)
    conv(x).sum().backward()
    assert conv.weight.grad is not None and torch.isfinite(conv.weight.grad).all()
    # standardization makes the output invariant to scaling the raw weight
    with torch.no_grad():
        conv.weight.mul_(7.0)
    torch.testing.assert_close(conv(x), expect, rtol=1e-4, atol=1e-4)
