"""float32 accuracy: normcore's error against a float64 run is no worse than torch's.

Each case runs the op in float32 and, from the same values, in float64 (normcore's op for
normcore, torch's for torch) and compares ``max |t32 - t64| / max |t64|`` for the output and
every gradient (:func:`benchmarks.accuracy`-style, written out here so the test does not
import the benchmark).  The hard inputs are where the two differed before the fix: sets whose
mean is large beside their spread (the rounded mean shifted every normalized value), long
sets (LayerNorm over (C, H, W): the sum of squares by ``vector_norm``), and a
zero-initialised weight under Weight Standardization (the gradient's three roundings).
On well-conditioned inputs both errors are one or two roundings of the largest value, and
which of the two is smaller depends on the kernels: there the bound is 4 roundings.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as TF

import normcore.functional as F

U = torch.finfo(torch.float32).eps / 2       # one rounding, relative


def _run(fn, x, w, b, dy):
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    y = fn(*leaves)
    live = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(y, live, dy.to(y.dtype), allow_unused=True))
    return [y.detach()] + [None if t is None else next(grads) for t in leaves]


def errors(fn, x, w=None, b=None, seed=0):
    """``[err(y), err(dx), err(dgamma), err(dbeta)]`` of ``fn`` in float32 against ``fn`` in
    float64, each ``max |t32 - t64| / max |t64|`` (None where absent)."""
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 2))
    r32 = _run(fn, x, w, b, dy)
    r64 = _run(fn, *[None if t is None else t.double() for t in (x, w, b)], dy.double())
    out = []
    for a, e in zip(r32, r64):
        if a is None:
            out.append(None)
            continue
        scale = e.abs().max().item()
        err = (a.double() - e).abs().max().item()
        out.append(err / scale if scale else err)
    return out


def _x(shape, kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if kind == "channels":   # benchmarks/accuracy.py's "normal": N(mu_c, s_c), per channel
        view = (1, shape[1]) + (1,) * (len(shape) - 2)
        return x * (torch.rand(shape[1], generator=g) * 3 + 0.5).reshape(view) \
            + torch.randn(shape[1], generator=g).reshape(view)
    return {"big_mean": 300.0 + x, "near_const": 5.0 + 1e-3 * x, "normal": x}[kind]


def _affine(c, seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)


OPS = {
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                   lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True)),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
                      lambda x, w, b: TF.instance_norm(x, weight=w, bias=b)),
    "group_norm": (lambda x, w, b: F.group_norm(x, 4, w, b),
                   lambda x, w, b: TF.group_norm(x, 4, w, b)),
}


def assert_no_worse(ours, theirs, margin=1.25, floor=4 * U):
    """Each of our errors <= margin * torch's, or within ``floor`` (four roundings of the
    largest value: where both are that small, which is smaller depends on the CPU's kernels;
    under ATEN_CPU_CAPABILITY=default a LayerNorm's dgamma is 1.6 roundings to torch's 1)."""
    for name, a, t in zip(("y", "dx", "dgamma", "dbeta"), ours, theirs):
        assert (a is None) == (t is None), name
        if a is not None:
            assert a <= max(margin * t, floor), (name, a, t)


OPS["layer_norm"] = (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w.repeat(x.shape[-1] // 16),
                                                  b.repeat(x.shape[-1] // 16)),
                    lambda x, w, b: TF.layer_norm(x, x.shape[-1:], w.repeat(x.shape[-1] // 16),
                                                  b.repeat(x.shape[-1] // 16)))
# two sizes, each by both paths (the kernels and the reference)
SHAPES = {"small": (8, 16, 16, 16), "large": (16, 16, 64, 64)}


@pytest.mark.parametrize("size", sorted(SHAPES))
@pytest.mark.parametrize("kind", ["big_mean", "near_const"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_no_worse_than_torch_when_the_mean_dominates(op, kind, size, both_paths):
    # before: 2-5x torch's error on y, dx and dgamma (the rounded mean shifted x_hat)
    ours, theirs = OPS[op]
    x = _x(SHAPES[size], kind)
    w, b = _affine(16)
    assert_no_worse(errors(ours, x, w, b), errors(theirs, x, w, b))


@pytest.mark.parametrize("batch", [4, 16])
@pytest.mark.parametrize("kind", ["normal", "big_mean"])
def test_layer_norm_over_long_sets_no_worse_than_torch(kind, batch, both_paths):
    # before: 4x torch's error on y and dx with one set of 32 * 32 * 64 values
    # (vector_norm's float32 sum of squares); both batch sizes by both paths
    x = _x((batch, 64, 32, 32), kind)
    w, b = _affine(64 * 32 * 32)
    w, b = w.reshape(64, 32, 32), b.reshape(64, 32, 32)
    ours = errors(lambda x, w, b: F.layer_norm(x, x.shape[1:], w, b), x, w, b)
    theirs = errors(lambda x, w, b: TF.layer_norm(x, x.shape[1:], w, b), x, w, b)
    assert_no_worse(ours, theirs)


def _ws_timm(w, _a=None, _b=None):
    return TF.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                         momentum=0.0, eps=1e-6).reshape_as(w)


# A zero weight (timm's ResNetV2 zero-initialises a block's last StdConv): w_hat = 0 and the
# gradient is r (d - mean d) with r = 1 / sqrt(eps) large; it was 2.3x timm's error.  Since the
# backward keeps w_hat in float32 and adds d r last, fused (core.ws_grad_input), 0.53-0.89x
# with AVX-512; under the generic kernels it runs in float64, 0.67-0.85x.
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("convention", ["timm", "bit", "original"])
def test_zero_initialised_weight_first_gradient(convention, seed):
    w = torch.zeros(256, 128, 3, 3)
    ours = errors(lambda w, _a, _b: F.weight_standardize(w, convention=convention), w, seed=seed)
    theirs = errors(_ws_timm, w, seed=seed)   # the same gradient in timm's form (any
    assert ours[0] == 0.0                      # convention: mean(d) is all that is left)
    assert ours[1] <= theirs[1], (ours[1] / U, theirs[1] / U)


def test_weight_standardize_large_mean_no_worse_than_timm():
    w = _x((64, 32, 3, 3), "big_mean") * 1e-2
    ours = errors(lambda w, _a, _b: F.weight_standardize(w, convention="timm"), w)
    assert_no_worse(ours, errors(_ws_timm, w))


def test_instance_norm_hypothesis_case_under_generic_kernels():
    # tests/test_grad.py's example: sets of two values 0.0014 apart at -6.69 (condition 9520),
    # where torch's generic kernels gave 3.7e-6 and normcore 7.4e-5; the case itself
    from strategies import make_input
    x = make_input((2, 30, 2), torch.float32, 4689)
    ours = errors(lambda x, _w, _b: F.instance_norm(x), x)
    theirs = errors(lambda x, _w, _b: TF.instance_norm(x), x)
    # absolute: the errors are relative to max |t64| ~ 1 here; torch's (any kernel) <= 4e-6
    assert ours[0] <= max(1.25 * theirs[0], 4 * U), (ours, theirs)
    assert ours[1] <= max(1.25 * theirs[1], 4 * U), (ours, theirs)


@pytest.mark.parametrize("size", sorted(SHAPES))
@pytest.mark.parametrize("op", sorted(OPS))
def test_well_conditioned_within_four_roundings(op, size, both_paths):
    ours, _ = OPS[op]
    x = _x(SHAPES[size], "normal")
    w, b = _affine(16)
    for name, e in zip(("y", "dx", "dgamma", "dbeta"), errors(ours, x, w, b)):
        assert e <= 4 * U, (name, e)


# float32 weights are standardized through float64, as everything the reference computes (the
# float32 pass was 1.4-1.9x the error of torch's forms of each convention on an ordinary conv
# weight), and the backward too.
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("convention", ["timm", "bit", "original"])
def test_weight_standardize_no_worse_than_torch(convention, seed):
    from test_grad import ws_reference
    eps = F.WS_CONVENTIONS[convention]["eps"]
    theirs = lambda w, _a, _b: ws_reference(w, eps, convention)
    w = _x((256, 128, 3, 3), "normal", seed)
    ours = errors(lambda w, _a, _b: F.weight_standardize(w, convention=convention), w, seed=seed)
    assert_no_worse(ours, errors(theirs, w, seed=seed), margin=1.0, floor=0.0)


def test_weight_standardize_computes_a_float32_weight_in_float64():
    from normcore.grad import WeightStandardize
    kept = WeightStandardize.apply(torch.randn(8, 4, 3, 3), 1e-5, 0, "inside")[1]
    assert kept.dtype == torch.float64


# benchmarks/accuracy.py's size and inputs, where torch's float32 error was the smaller on
# well-conditioned inputs for the torch-op paths this package once had (y 1.15-1.61x torch's
# for BN, IN, GN).  The reference computes in float64 and rounds each result once; the
# kernels sum in float64 and round each output once: the bound is 1.0, with no margin.
REALISTIC = (32, 64, 32, 32)


@pytest.mark.parametrize("op", ["batch_norm", "instance_norm", "group_norm"])
def test_no_worse_than_torch_at_a_realistic_size(op, both_paths):
    ours, theirs = OPS[op] if op != "group_norm" else (
        lambda x, w, b: F.group_norm(x, 8, w, b), lambda x, w, b: TF.group_norm(x, 8, w, b))
    x = _x(REALISTIC, "channels")
    w, b = _affine(REALISTIC[1])
    assert_no_worse(errors(ours, x, w, b), errors(theirs, x, w, b), margin=1.0, floor=0.0)


# The same size on seeds 0-4 (seed 0 alone hid it): BN's dx was 1.27x torch's error on seed 1
# under ATEN_CPU_CAPABILITY=default and 1.15x on seed 4 with AVX-512 (2.6 and 2.1 roundings of
# the largest gradient): gamma r, sum(g) / n and the slope were each rounded 3-4 times, and the
# largest term g gamma r was added first (then rounded twice more).  Now 0.3-0.9x torch's.
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kind", ["channels", "big_mean"])
def test_batch_norm_train_no_worse_than_torch_on_five_seeds(kind, seed):
    ours, theirs = OPS["batch_norm"]
    x = _x(REALISTIC, kind, seed)
    w, b = _affine(REALISTIC[1], seed)
    assert_no_worse(errors(ours, x, w, b, seed), errors(theirs, x, w, b, seed), margin=1.0,
                    floor=0.0)


# InstanceNorm and GroupNorm on seeds 0-4 (seed 0 alone once hid a 1.09x dgamma and a 1.10x
# dx under the generic kernels).  Every case: 1.0.
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("op", ["instance_norm", "group_norm"])
def test_instance_and_group_norm_no_worse_than_torch_on_five_seeds(op, seed, both_paths):
    ours, theirs = OPS[op] if op != "group_norm" else (
        lambda x, w, b: F.group_norm(x, 8, w, b), lambda x, w, b: TF.group_norm(x, 8, w, b))
    x = _x(REALISTIC, "channels", seed)
    w, b = _affine(REALISTIC[1], seed)
    mine, torchs = errors(ours, x, w, b, seed), errors(theirs, x, w, b, seed)
    for name, a, t in zip(("y", "dx", "dgamma", "dbeta"), mine, torchs):
        assert a <= t, (name, a, t)


# LayerNorm over the last dim at benchmarks/accuracy.py's size, seeds 0-4, by both paths
# (float32 sums once gave y 1.19x torch's error under the generic kernels).  Every case: 1.0.
LN_LAST = (32, 256, 512)


@pytest.mark.parametrize("seed", range(5))
def test_layer_norm_over_the_last_dim_no_worse_than_torch_on_five_seeds(seed, both_paths):
    generic = os.environ.get("ATEN_CPU_CAPABILITY") == "default"
    x = _x(LN_LAST, "channels", seed)
    w, b = _affine(LN_LAST[-1], seed)
    mine = errors(lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), x, w, b, seed)
    torchs = errors(lambda x, w, b: TF.layer_norm(x, x.shape[-1:], w, b), x, w, b, seed)
    for name, a, t in zip(("y", "dx", "dgamma", "dbeta"), mine, torchs):
        assert a <= t, (name, generic, a / U, t / U)


def _bn_eval(fn):
    def f(x, w, b):     # benchmarks/accuracy.py's running statistics
        C = x.shape[1]
        return fn(x, torch.linspace(-1, 1, C, dtype=x.dtype),
                  torch.linspace(0.5, 2, C, dtype=x.dtype), w, b, training=False)
    return f


# BN in eval mode (normcore.frozen.FixedStatistics, computed as the reference is): float32
# steps once gave the output up to 1.20x torch's error and dgamma 1.42x on these seeds.  The
# bound: 1.0, no margin.
@pytest.mark.parametrize("seed", range(5))
def test_batch_norm_eval_no_worse_than_torch_on_five_seeds(seed):
    x = _x(REALISTIC, "channels", seed)
    w, b = _affine(REALISTIC[1], seed)
    assert_no_worse(errors(_bn_eval(F.batch_norm), x, w, b, seed),
                    errors(_bn_eval(TF.batch_norm), x, w, b, seed), margin=1.0, floor=0.0)


def test_rms_norm_no_worse_than_torch_at_a_realistic_size(both_paths):
    # eps given (by default it is the dtype's epsilon: float64 would be another function).
    # dx: 0.89x torch's with AVX-512; under the generic kernels both are 2.0 roundings (equal
    # to 3 digits): there, within 2.5 roundings, which is the smaller is the kernels' choice
    eps = torch.finfo(torch.float32).eps
    x = _x((32, 256, 512), "normal")
    w, _ = _affine(512)
    ours = errors(lambda x, w, _b: F.rms_norm(x, (512,), w, eps=eps), x, w)
    theirs = errors(lambda x, w, _b: TF.rms_norm(x, (512,), w, eps=eps), x, w)
    assert_no_worse(ours, theirs, margin=1.0, floor=2.5 * U)


@pytest.mark.skipif(os.environ.get("ATEN_CPU_CAPABILITY") == "default",
                    reason="this is the run under the generic kernels")
def test_every_case_here_holds_under_the_generic_kernels_too():
    """The cases above again, in a process with torch's generic CPU kernels (no vector
    lanes, no fused multiply-add): the roundings differ, and a learner's CPU may take them.
    Under them GN's y was 1.28x torch's error while every case passed with AVX-512."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "no:nbval", "-o", "addopts=", __file__],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
