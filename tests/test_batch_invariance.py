"""A sample's output and input gradient are bitwise independent of its batch-mates and of the
batch size, on both paths (the reference and the compiled kernels), for every per-sample norm
(LayerNorm, RMSNorm, GroupNorm, InstanceNorm; BatchNorm and InstanceNorm with the running
statistics), every dtype and memory format: torch's own kernels are, and chapter 4 teaches
that LayerNorm does not look at the batch.  (BatchNorm in training mode is excepted: its sets
are the batch.)  Also: the reference runs on ``meta`` tensors (no value is read back to the
host) and under ``torch.compile(fullgraph=True)``."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import normcore
import normcore.functional as F
import normcore.nn as nnc
from normcore import axes, dispatch

NORMS = ["layer", "rms", "group", "instance", "batch eval", "instance eval"]


@st.composite
def cases(draw):
    norm = draw(st.sampled_from(NORMS))
    dims = draw(st.integers(2 if norm in ("layer", "rms") else 3, 5))
    channels_last = dims in (4, 5) and draw(st.booleans())
    N = draw(st.integers(2, 6))
    C = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    rest = [draw(st.integers(1, 9)) for _ in range(dims - 2)]
    if norm in ("instance", "group") and math.prod(rest) == 1 and (norm == "instance" or C == 1):
        rest[0] = 2                               # a set of one value: torch refuses it too
    shape = (N, C, *rest)
    k = draw(st.integers(1, dims - 1)) if norm in ("layer", "rms") else None
    G = draw(st.sampled_from([g for g in (1, 2, 3, C) if C % g == 0])) if norm == "group" else None
    return dict(norm=norm, shape=shape, k=k, G=G, channels_last=channels_last,
                dtype=draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16])),
                kernels=draw(st.booleans()), poison=draw(st.sampled_from(["big", "nan", "inf"])),
                seed=draw(st.integers(0, 2**16)))


def _op(case):
    """``(op(x) -> y, lay)``, the op with its parameters closed over."""
    norm, shape, dtype = case["norm"], case["shape"], case["dtype"]
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    C = shape[1]
    if norm in ("layer", "rms"):
        ns = shape[len(shape) - case["k"]:]
        w = (torch.rand(ns, generator=gen) + 0.5).to(dtype)
        b = torch.randn(ns, generator=gen).to(dtype)
        if norm == "layer":
            return lambda x: F.layer_norm(x, ns, w, b)
        return lambda x: F.rms_norm(x, ns, w)
    w = (torch.rand(C, generator=gen) + 0.5).to(dtype)
    b = torch.randn(C, generator=gen).to(dtype)
    if norm == "group":
        return lambda x: F.group_norm(x, case["G"], w, b)
    if norm == "instance":
        return lambda x: F.instance_norm(x, weight=w, bias=b)
    rm, rv = torch.randn(C, generator=gen).to(dtype), (torch.rand(C, generator=gen) + 0.5).to(dtype)
    if norm == "batch eval":
        return lambda x: F.batch_norm(x, rm, rv, w, b, training=False)
    return lambda x: F.instance_norm(x, rm, rv, w, b, use_input_stats=False)


def _sample0(op, x, g):
    """Sample 0's output and input gradient, as bytes."""
    x = x.detach().clone(memory_format=torch.preserve_format).requires_grad_(True)
    y = op(x)
    dx, = torch.autograd.grad(y, x, g)
    return y[0].detach().contiguous(), dx[0].contiguous()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_sample_does_not_see_its_batch_mates(case):
    op = _op(case)
    gen = torch.Generator().manual_seed(case["seed"])
    shape, dtype = case["shape"], case["dtype"]
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape))
    x = (torch.randn(shape, generator=gen) * 3 + 2).to(dtype)
    g = torch.randn(shape, generator=gen).to(dtype)
    if case["channels_last"]:
        x, g = x.contiguous(memory_format=fmt), g.contiguous(memory_format=fmt)
    other = x.clone(memory_format=torch.preserve_format)
    other[-1] = {"big": 1e4, "nan": math.nan, "inf": math.inf}[case["poison"]]
    other[1:-1] *= 1000
    with normcore.use_kernels(case["kernels"]):
        y0, dx0 = _sample0(op, x, g)
        for xb, gb in ((other, g), (x[:1], g[:1]), (x[:2], g[:2])):
            if case["channels_last"]:
                xb, gb = xb.contiguous(memory_format=fmt), gb.contiguous(memory_format=fmt)
            y1, dx1 = _sample0(op, xb, gb)
            assert y0.isfinite().all() and dx0.isfinite().all()
            assert torch.equal(y0, y1), case
            assert torch.equal(dx0, dx1), case


def test_the_property_can_see_a_coupled_batch(monkeypatch):
    """The test above fails on a sum that couples the samples: a LayerNorm whose mean is taken
    over the batch's rows at once, as the torch-op blocks did when they chose one algorithm
    for the whole batch."""
    from normcore import core
    real = core.set_sum

    def coupled(t, dims):
        s = real(t, dims)
        return s + 1e-3 * s.mean() if s.dim() and s.shape[0] > 1 else s
    monkeypatch.setattr(core, "set_sum", coupled)
    case = dict(norm="layer", shape=(4, 3, 5), k=1, G=None, channels_last=False,
                dtype=torch.float64, kernels=False, poison="big", seed=0)
    with pytest.raises(AssertionError):
        test_a_sample_does_not_see_its_batch_mates.hypothesis.inner_test(case)


# ---------------------------------------------------------------------------------------
# the reference reads nothing back to the host, and compiles whole
# ---------------------------------------------------------------------------------------
MODULES = {
    "BatchNorm2d train": lambda: nnc.BatchNorm2d(4),
    "BatchNorm2d eval": lambda: nnc.BatchNorm2d(4).eval(),
    "InstanceNorm2d": lambda: nnc.InstanceNorm2d(4, affine=True),
    "GroupNorm": lambda: nnc.GroupNorm(2, 4),
    "LayerNorm": lambda: nnc.LayerNorm([5, 6]),
    "RMSNorm": lambda: nnc.RMSNorm(6),
    "WSConv2d": lambda: nnc.WSConv2d(4, 3, 3),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_reference_runs_on_meta_tensors(name):
    """Forward and backward on the ``meta`` device, where ``bool(t)``, ``t.item()`` or
    ``t.tolist()`` of a value raises: no value of the data decides a branch."""
    m = MODULES[name]().to("meta")
    x = torch.empty(3, 4, 5, 6, device="meta", requires_grad=True)
    assert dispatch.family(axes.layout("group", x.shape, 2), x) is None
    y = m(x)
    assert y.device.type == "meta"
    grads = torch.autograd.grad(y.sum(), [x, *m.parameters()])
    assert all(t.device.type == "meta" for t in grads)


@pytest.mark.parametrize("name", ["BatchNorm2d train", "GroupNorm", "LayerNorm", "RMSNorm",
                                  "WSConv2d", "BatchNorm2d eval"])
def test_the_reference_compiles_with_fullgraph(name):
    """``torch.compile(fullgraph=True)``: no graph break (a host read would be one), and the
    compiled module gives the eager one's output and gradients."""
    torch.manual_seed(0)
    m = MODULES[name]()
    x = torch.randn(3, 4, 5, 6, requires_grad=True)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    y, yc = m(x), compiled(x)
    torch.testing.assert_close(yc, y)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(yc, x, g), torch.autograd.grad(y, x, g))
