"""Every literal float32 answer passes, and the tolerances come from torch's own rounding.

For each registered checker: torch's own op, called as a statement allows, and a
straightforward float32 implementation of the formula, in the input's dtype, pass at several
seeds (:mod:`normcore.exercises.tolerance`).  The catalogued mistakes still fail and are
named as themselves: ``tests/test_exercises*.py`` hold those tests, on the same tolerances.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from torch.nn.utils import fusion

import test_exercises as se
import test_exercises_dyt as sd
import test_exercises_group as sg
import test_exercises_layer as sl
import test_exercises_ws as sw
import test_instance_norm as si
from normcore import exercises
from normcore.exercises import tolerance
from normcore.exercises.ops import REGISTRY
from normcore.exercises.variants import TOLERANCE


def per_channel(t, x):
    return t.view([1, -1] + [1] * (x.dim() - 2))


def grads(forward, dy, x, gamma):
    """(dx, dgamma, dbeta) by autograd through ``forward(x, gamma, beta)``, beta = 0."""
    x = x.detach().clone().requires_grad_(True)
    gamma = gamma.detach().clone().requires_grad_(True)
    beta = torch.zeros_like(gamma, requires_grad=True)
    return torch.autograd.grad(forward(x, gamma, beta), (x, gamma, beta), dy)


# ---- torch's own ops, called as the statements allow -----------------------------------
def bn_torch(x, gamma, beta, eps):
    return TF.batch_norm(x, None, None, gamma, beta, training=True, eps=eps)


def bn_var_mean(x, gamma, beta, eps):
    dims = se.bn_dims(x)
    var, mean = torch.var_mean(x, dim=dims, correction=0, keepdim=True)
    return per_channel(gamma, x) * (x - mean) * torch.rsqrt(var + eps) + per_channel(beta, x)


def ln_torch(x, gamma, beta, eps):
    return TF.layer_norm(x, x.shape[1:], gamma, beta, eps)


def in_torch(x, gamma, beta, eps):
    return TF.instance_norm(x, weight=gamma, bias=beta, eps=eps)


def gn_torch(x, num_groups, gamma, beta, eps):
    return TF.group_norm(x, num_groups, gamma, beta, eps)


def gn_via_layer_norm(x, num_groups, gamma, beta, eps):
    """ex-gn-via-ln read literally: one call of layer_norm on a view, in x's dtype."""
    rows = x.reshape(x.shape[0], num_groups, -1)
    xhat = TF.layer_norm(rows, (rows.shape[-1],), eps=eps).reshape(x.shape)
    return xhat * per_channel(gamma, x) + per_channel(beta, x)


def gn_loop(x, num_groups, gamma, beta, eps):
    """ex-gn-forward read literally: a loop over the groups' channel slices."""
    per = x.shape[1] // num_groups
    out = torch.empty_like(x)
    dims = tuple(range(1, x.dim()))
    for g in range(num_groups):
        part = x[:, g * per:(g + 1) * per]
        mean = part.mean(dim=dims, keepdim=True)
        var = ((part - mean) ** 2).mean(dim=dims, keepdim=True)
        out[:, g * per:(g + 1) * per] = (part - mean) / torch.sqrt(var + eps)
    return out * per_channel(gamma, x) + per_channel(beta, x)


def running_torch(running_mean, running_var, x, momentum):
    TF.batch_norm(x, running_mean, running_var, training=True, momentum=momentum)
    return running_mean, running_var


def bn_bwd_torch(dy, x, gamma, eps):
    return grads(lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True, eps=eps),
                 dy, x, gamma)


def gn_bwd_torch(dy, x, num_groups, gamma, eps):
    return grads(lambda x, w, b: TF.group_norm(x, num_groups, w, b, eps), dy, x, gamma)


def ws_timm(w, eps):
    """timm's StdConv2d: batch_norm over each filter (the 'bit' and 'timm' conventions)."""
    return TF.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                         momentum=0.0, eps=eps).reshape_as(w)


def ws_bwd_timm(dw_hat, w, eps):
    w = w.detach().clone().requires_grad_(True)
    return torch.autograd.grad(ws_timm(w, eps), w, dw_hat)[0]


def ws_bwd_original_autograd(dw_hat, w, eps):
    w = w.detach().clone().requires_grad_(True)
    return torch.autograd.grad(se.ws_original(w, eps), w, dw_hat)[0]


def fold_torch(weight, bias, gamma, beta, running_mean, running_var, eps):
    fuse = fusion.fuse_linear_bn_weights if weight.dim() == 2 else fusion.fuse_conv_bn_weights
    w, b = fuse(weight, bias, running_mean, running_var, eps, gamma, beta)
    return w.detach(), b.detach()


def fold_ws_timm(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn):
    return fold_torch(ws_timm(weight, eps_ws), bias, gamma, beta, running_mean, running_var,
                      eps_bn)


def ln_shape_torch(x, normalized_shape, gamma, beta, eps):
    return TF.layer_norm(x, normalized_shape, gamma, beta, eps)


def ln_bwd_torch(dy, x, normalized_shape, gamma, eps):
    return grads(lambda x, w, b: TF.layer_norm(x, normalized_shape, w, b, eps), dy, x, gamma)


def rms_torch(x, normalized_shape, gamma, eps):
    return TF.rms_norm(x, normalized_shape, gamma, eps)


def adain_torch(content, style, eps):
    dims = tuple(range(2, style.dim()))
    var, mean = torch.var_mean(style, dim=dims, correction=0, keepdim=True)
    return TF.instance_norm(content, eps=eps) * torch.sqrt(var + eps) + mean


_ORIGINAL, _BIASED = {}, ({"convention": "bit"}, {"convention": "timm"})
#: op -> (function, options) of every literal reading: torch's op where the statement
#: permits it, and the formula in plain float32 torch.  A new checker op adds its own.
LITERAL = {
    "batch_norm": [(bn_torch, {}), (se.bn_correct, {}), (bn_var_mean, {})],
    "layer_norm": [(ln_torch, {}), (se.ln_correct, {})],
    "instance_norm": [(in_torch, {}), (se.in_correct, {})],
    "group_norm": [(gn_torch, {}), (gn_via_layer_norm, {}), (gn_loop, {}),
                   (se.gn_correct, {})],
    "running_update": [(running_torch, {}), (se.running_correct, {})],
    "batch_norm_backward": [(bn_bwd_torch, {}), (se.bwd_correct, {})],
    "group_norm_backward": [(gn_bwd_torch, {}), (sg.gn_bwd_correct, {})],
    "weight_standardize": [(se.ws_original, _ORIGINAL)]
    + [(fn, o) for o in _BIASED for fn in (ws_timm, se.ws_bit)],
    "weight_standardize_backward": [(sw.bwd_original, _ORIGINAL),
                                    (ws_bwd_original_autograd, _ORIGINAL)]
    + [(fn, o) for o in _BIASED for fn in (ws_bwd_timm, sw.bwd_biased)],
    "fold_bn": [(fold_torch, {}), (se.fold_correct, {})],
    "fold_ws": [(sw.fold_original, _ORIGINAL)]
    + [(fn, o) for o in _BIASED for fn in (fold_ws_timm, sw.fold_bit)],
    "chan_merge": [(se.chan_correct, {})],
    "adaptive_instance_norm": [(adain_torch, {}), (si.adain_correct, {})],
    "layer_norm_shape": [(ln_shape_torch, {}), (sl.ln_correct, {})],
    "layer_norm_backward": [(ln_bwd_torch, {}), (sl.bwd_correct, {})],
    "rms_norm": [(rms_torch, {}), (sl.rms_correct, {})],
    "dyt": [(sd.dyt_correct, {})],                   # torch has no DyT op
}
RUNS = [(op, fn, o) for op, answers in LITERAL.items() for fn, o in answers]
SEEDS = (0, 1, 2)


def test_every_registered_op_has_literal_answers():
    missing = sorted(set(REGISTRY) - set(LITERAL))
    assert not missing, (f"add the literal float32 answers of {missing} to LITERAL (torch's "
                         f"own op if there is one, and the formula in plain torch)")


@pytest.mark.parametrize("op, fn, options", RUNS,
                         ids=[f"{op}-{fn.__name__}-{o.get('convention', '')}"
                              for op, fn, o in RUNS])
def test_a_literal_float32_answer_passes(op, fn, options):
    for seed in SEEDS:
        report = exercises.check(op, fn, seed=seed, **options)
        assert report.passed, f"seed {seed}: {report}"


def test_ex_gn_via_ln_in_float32_passes():
    """The exercise as stated (one layer_norm on a view, in x's dtype) passes, although on
    the large-mean set torch's rounding puts it off the exact answer."""
    impl = REGISTRY["group_norm"]
    worst = 0.0
    for seed in SEEDS:
        assert exercises.check("group_norm", gn_via_layer_norm, seed=seed).passed
        cases, refs = tolerance.prepare(impl, impl.cases(impl.parse_options({"seed": seed})))
        for case, ref in zip(cases, refs):
            if case.kind == "largemean":
                got = impl.call(gn_via_layer_norm, case)
                worst = max(worst, float((got.double() - ref[0]).abs().max()))
    assert worst > 1e-6, "torch's float32 layer_norm is exact here: no rounding to allow"


@pytest.mark.parametrize("op", list(REGISTRY))
def test_each_tolerance_is_derived_from_the_kernels_error(op):
    impl = REGISTRY[op]
    options = impl.parse_options({})
    cases, refs = tolerance.prepare(impl, impl.cases(options))
    for case, ref in zip(cases, refs):
        assert all(r.dtype == torch.float64 for r in ref)    # the reference in float64
        if case.dtype == torch.float64:
            assert case.tolerance == (TOLERANCE[torch.float64],) * len(ref)
            continue
        errs = tolerance.kernel_errors(impl, case, ref)
        worst = [max(col) for col in zip(*errs.values())]
        assert case.tolerance == tuple(
            (tolerance.RTOL, max(tolerance.ATOL, tolerance.FACTOR * e)) for e in worst)
        # the reference in the set's dtype is within its own tolerance, and so is torch's
        for kernel in [impl.reference(case), *impl.torch_kernels(case)]:
            for i, (k, r) in enumerate(zip(kernel, ref)):
                rtol, atol = case.tolerance[i]
                assert torch.allclose(k.double(), r, rtol=rtol, atol=atol)


def test_the_large_mean_tolerance_follows_torch_and_still_fails_a_wrong_answer():
    impl = REGISTRY["group_norm"]
    cases, refs = tolerance.prepare(impl, impl.cases(impl.parse_options({})))
    k = next(i for i, c in enumerate(cases) if c.kind == "largemean")
    case, ref = cases[k], refs[k][0]
    rtol, atol = case.tolerance[0]
    torch_error = tolerance.kernel_errors(impl, case, refs[k])["torch"][0]
    assert atol == max(tolerance.ATOL, tolerance.FACTOR * torch_error)
    # the naive variance, the mistake this set is for, is off by far more than that
    x = case.args["x"].reshape(case.shape[0], case.groups, -1)
    naive = (x * x).mean(-1) - x.mean(-1) ** 2
    assert torch.equal(naive, torch.zeros_like(naive))
    assert exercises.check("group_norm", se.gn_correct).passed

    first = (0,) * ref.dim()

    def off_by(amount):
        def fn(x, num_groups, gamma, beta, eps):
            y = gn_torch(x, num_groups, gamma, beta, eps)
            if torch.equal(x, case.args["x"]):     # only on the large-mean set
                y = y.clone()
                y[first] = ref[first].float() + amount
            return y
        return fn
    assert exercises.check("group_norm", off_by(0.5 * atol)).passed
    report = exercises.check("group_norm", off_by(2 * atol + rtol * float(ref[first].abs())))
    assert not report.passed and report.kind == "unknown", str(report)


def test_measure_lists_the_float32_sets():
    rows = tolerance.measure("group_norm")
    assert [r["kind"] for r in rows] == ["float32", "largemean"]
    big = rows[1]
    assert big["atol"][0] == max(tolerance.ATOL, tolerance.FACTOR * max(big["torch"][0],
                                                                         big["solution"][0]))
    assert tolerance.measure("chan_merge")[0]["torch"] is None    # torch has no such op
    with pytest.raises(ValueError, match="unknown op"):
        tolerance.measure("no_such_op")


def test_as_float64_casts_only_floating_tensors():
    impl = REGISTRY["running_update"]
    case = next(c for c in impl.cases(impl.parse_options({})) if c.dtype == torch.float32)
    wide = tolerance.as_float64(case)
    assert wide.dtype == torch.float64 and wide.args["x"].dtype == torch.float64
    assert wide.args["momentum"] == case.args["momentum"]
    assert case.args["x"].dtype == torch.float32             # the set itself is unchanged
    assert torch.equal(wide.args["x"], case.args["x"].double())
