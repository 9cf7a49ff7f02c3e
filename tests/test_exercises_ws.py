"""The checker ops of the Weight Standardization chapter beyond the forward pass:
weight_standardize_backward and fold_ws.  Correct functions pass under every convention;
each student-style mistake (plain torch, as a learner would write it) is listed in
WS_DIAGNOSES, which tests/test_exercises.py checks is diagnosed as itself; bad input gets
the usual reports."""
import pytest
import torch

from normcore import exercises
from normcore.exercises import check

CONVENTIONS = ("original", "bit", "timm")


def _flat(text):
    return " ".join(text.split())


# ---- the backward pass ----------------------------------------------------------------------
def _filter_dims(w):
    return tuple(range(1, w.dim()))


def _count(w, dims):
    n = 1
    for i in dims:
        n *= w.shape[i]
    return n


def bwd_biased(d, w, eps, dims=None, correction=0, mean_term=True, std_term=True):
    """The boxed formula: r (d - mean(d) - W_hat mean(d W_hat)), r = 1/sqrt(var + eps)."""
    dims = _filter_dims(w) if dims is None else dims
    K = _count(w, dims)
    mean = w.mean(dims, keepdim=True)
    var = ((w - mean) ** 2).sum(dims, keepdim=True) / (K - correction)
    r = 1 / torch.sqrt(var + eps)
    w_hat = (w - mean) * r
    g = d.clone()
    if mean_term:
        g = g - d.mean(dims, keepdim=True)
    if std_term:
        g = g - w_hat * (d * w_hat).sum(dims, keepdim=True) / (K - correction)
    return r * g


def bwd_original(d, w, eps, dims=None, correction=1, mean_term=True, std_term=True):
    """(d - mean(d)) / (s + eps) - W_hat sum(d W_hat) / ((F - 1) s), s the unbiased std."""
    dims = _filter_dims(w) if dims is None else dims
    K = _count(w, dims)
    mean = w.mean(dims, keepdim=True)
    s = torch.sqrt(((w - mean) ** 2).sum(dims, keepdim=True) / (K - correction))
    w_hat = (w - mean) / (s + eps)
    g = d - d.mean(dims, keepdim=True) if mean_term else d
    g = g / (s + eps)
    if std_term:
        g = g - w_hat * (d * w_hat).sum(dims, keepdim=True) / ((K - correction) * s)
    return g


def bwd_stats_constant(d, w, eps):
    return bwd_original(d, w, eps, mean_term=False, std_term=False)


def bwd_no_mean_term(d, w, eps):
    return bwd_original(d, w, eps, mean_term=False)


def bwd_no_std_term(d, w, eps):
    return bwd_biased(d, w, eps, std_term=False)


def bwd_biased_std(d, w, eps):
    return bwd_original(d, w, eps, correction=0)


def bwd_eps_inside(d, w, eps):
    return bwd_biased(d, w, eps, correction=1)


def bwd_unbiased(d, w, eps):
    return bwd_biased(d, w, eps, correction=1)


def bwd_std_plus_eps(d, w, eps):
    return bwd_original(d, w, eps, correction=0)


def bwd_no_eps(d, w, eps):
    return bwd_original(d, w, 0.0)


def bwd_over_out_channels(d, w, eps):
    return bwd_biased(d, w, eps, dims=(0,))


def bwd_per_input_channel(d, w, eps):
    return bwd_original(d, w, eps, dims=(0, 2, 3))


def bwd_whole_tensor(d, w, eps):
    return bwd_biased(d, w, eps, dims=tuple(range(w.dim())))


def bwd_autograd(d, w, eps):
    """A student may also use autograd through their own forward: that passes too."""
    w = w.detach().requires_grad_(True)
    dims = _filter_dims(w)
    var, mean = torch.var_mean(w, dim=dims, correction=0, keepdim=True)
    return torch.autograd.grad((w - mean) / torch.sqrt(var + eps), w, d)[0]


# ---- WS conv + eval-mode BatchNorm folded into one conv -------------------------------------
def _ws(w, eps, correction, inside):
    dims = _filter_dims(w)
    mean = w.mean(dims, keepdim=True)
    var = w.var(dims, keepdim=True, correction=correction)
    return (w - mean) / (torch.sqrt(var + eps) if inside else var.sqrt() + eps)


def _fold(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn, *,
          correction=1, inside=False, order="ws first", std=None, conv_bias=True,
          subtract_mean=True, scale_bias=True):
    """Fold with the original convention unless told otherwise; the knobs make mistakes."""
    s = gamma / (torch.sqrt(running_var + eps_bn) if std is None else std(running_var, eps_bn))
    per_out = s.view(-1, 1, 1, 1)
    if order == "ws first":
        w = per_out * _ws(weight, eps_ws, correction, inside)
    elif order == "raw":
        w = per_out * weight
    else:
        w = _ws(per_out * weight, eps_ws, correction, inside)
    b = bias if conv_bias else torch.zeros_like(bias)
    b = (s * b if scale_bias else b) - (s * running_mean if subtract_mean else 0) + beta
    return w, b


def fold_original(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn):
    return _fold(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn)


def fold_bit(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn):
    return _fold(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn,
                 correction=0, inside=True)


def _folder(**knobs):
    def fn(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn):
        return _fold(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn,
                     **knobs)
    return fn


fold_raw_weight = _folder(order="raw")
fold_bn_first = _folder(order="bn first")
fold_no_conv_bias = _folder(conv_bias=False)
fold_no_running_mean = _folder(subtract_mean=False)
fold_bias_unscaled = _folder(scale_bias=False)
fold_var_not_std = _folder(std=lambda v, e: v + e)
fold_bn_std_plus_eps = _folder(std=lambda v, e: v.sqrt() + e)
fold_bn_without_eps = _folder(std=lambda v, e: v.sqrt())
fold_ws_biased = _folder(correction=0)
fold_ws_eps_inside = _folder(inside=True)
fold_ws_unbiased_bit = _folder(correction=1, inside=True)
fold_ws_std_plus_eps_bit = _folder(correction=0, inside=False)
fold_bn_std_plus_eps_bit = _folder(correction=0, inside=True, std=lambda v, e: v.sqrt() + e)
fold_raw_weight_no_bias = _folder(order="raw", conv_bias=False)


def fold_ws_without_eps(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn):
    return _fold(weight, bias, 0.0, gamma, beta, running_mean, running_var, eps_bn)


for _name, _fn in list(globals().items()):
    if _name.startswith("fold_") and _fn.__name__ == "fn":
        _fn.__name__ = _fn.__qualname__ = _name


# =======================================================================================
# what each student function must be diagnosed as
# =======================================================================================
BWD, FOLD = "weight_standardize_backward", "fold_ws"
BIT = {"convention": "bit"}
#: (op, student function, options, expected keys, words the message must hold); run by
#: tests/test_exercises.py (test_student_mistake_is_named), whose DIAGNOSES they join
WS_DIAGNOSES = [
    (BWD, bwd_stats_constant, {}, ("ws_backward_stats_constant",),
     ["as constants", "`d / (s + eps)`"]),
    (BWD, bwd_no_mean_term, {}, ("ws_backward_no_mean_grad",), ["does not sum to 0"]),
    (BWD, bwd_no_std_term, BIT, ("ws_backward_no_std_grad",),
     ["not orthogonal to W_hat", "`r * W_hat * mean(d * W_hat)`"]),
    (BWD, bwd_biased_std, {}, ("biased_var",), ["biased std"]),
    (BWD, bwd_eps_inside, {}, ("eps_inside_sqrt",), ["inside the square root"]),
    (BWD, bwd_biased, {}, ("other_convention",), ["BiT / timm"]),
    (BWD, bwd_original, BIT, ("other_convention",), ["original convention"]),
    (BWD, bwd_unbiased, {"convention": "timm"}, ("unbiased_var",), ["biased variance"]),
    (BWD, bwd_std_plus_eps, BIT, ("eps_outside_sqrt",), ["std + eps"]),
    (BWD, bwd_no_eps, {}, ("no_eps",), ["left eps out", "Set D"]),
    (BWD, bwd_over_out_channels, BIT, ("wrong_axes",),
     ["over (C_out), but", "(C_in, kH, kW)", "The sums in the gradient"]),
    (BWD, bwd_per_input_channel, {}, ("wrong_axes",), ["over (C_out, kH, kW), but"]),
    (BWD, bwd_whole_tensor, BIT, ("wrong_axes",), ["over (C_out, C_in, kH, kW), but"]),
    (FOLD, fold_raw_weight, {}, ("fold_ws_raw_weight",), ["`s * W`"]),
    (FOLD, fold_bn_first, {}, ("fold_ws_bn_before_ws",), ["standardization of `s * W`"]),
    (FOLD, fold_no_conv_bias, {}, ("fold_bias_dropped",), ["own bias is missing"]),
    (FOLD, fold_no_running_mean, {}, ("fold_no_mean",), ["not subtracted"]),
    (FOLD, fold_bias_unscaled, {}, ("fold_bias_unscaled",), ["unscaled"]),
    (FOLD, fold_var_not_std, {}, ("fold_no_sqrt",), ["without the square root"]),
    (FOLD, fold_bn_std_plus_eps, {}, ("eps_outside_sqrt",), ["BatchNorm divides"]),
    (FOLD, fold_bn_without_eps, {}, ("no_eps",), ["left eps out", "eps_bn"]),
    (FOLD, fold_ws_without_eps, {}, ("no_eps",), ["left eps out", "eps = eps_ws"]),
    (FOLD, fold_bit, {}, ("other_convention",), ["BiT / timm"]),
    (FOLD, fold_original, BIT, ("other_convention",), ["original convention"]),
    (FOLD, fold_ws_biased, {}, ("biased_var",), ["biased std"]),
    (FOLD, fold_ws_eps_inside, {}, ("eps_inside_sqrt",), ["inside the square root"]),
    (FOLD, fold_ws_unbiased_bit, BIT, ("unbiased_var",), ["biased variance"]),
    (FOLD, fold_ws_std_plus_eps_bit, BIT, ("eps_outside_sqrt",),
     ["Weight Standardization ('bit' convention) divides"]),
    (FOLD, fold_bn_std_plus_eps_bit, BIT, ("eps_outside_sqrt",), ["BatchNorm divides"]),
    (FOLD, fold_raw_weight_no_bias, {}, ("fold_ws_raw_weight", "fold_bias_dropped"),
     ["two mistakes"]),
]

CORRECT = [(BWD, bwd_original, "original"), (BWD, bwd_biased, "bit"),
           (BWD, bwd_biased, "timm"), (BWD, bwd_autograd, "bit"),
           (FOLD, fold_original, "original"), (FOLD, fold_bit, "bit"), (FOLD, fold_bit, "timm")]


@pytest.mark.parametrize("op, fn, convention", CORRECT,
                         ids=[f"{c[0]}-{c[1].__name__}-{c[2]}" for c in CORRECT])
@pytest.mark.parametrize("seed", [0, 3])
def test_correct_functions_pass(op, fn, convention, seed):
    report = check(op, fn, convention=convention, seed=seed)
    assert report.passed, str(report)


@pytest.mark.parametrize("op", [BWD, FOLD])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_reference_passes_every_convention(op, convention):
    report = check(op, exercises.reference(op, convention), convention=convention)
    assert report.passed and report.kind == "pass", str(report)


def test_backward_ranks():
    # 2-D and 3-D weights too, as the forward op
    assert check(BWD, bwd_biased, convention="bit", ndims=(2, 3, 4)).passed
    assert check(BWD, bwd_over_out_channels, convention="bit",
                 ndims=(2, 3)).misconception == "wrong_axes"


def test_every_entry_of_the_new_ops_is_covered():
    for op in (BWD, FOLD):
        named = {k for o, _, _, keys, _ in WS_DIAGNOSES if o == op for k in keys}
        assert named == {m.key for m in exercises.catalogue(op)}, op


def test_the_orthogonality_the_messages_promise():
    # the reference's gradient sums to 0 over each filter and (biased conventions, eps -> 0)
    # is orthogonal to W_hat; the two "dropped" mistakes each break one of them
    spec = exercises._OPS[BWD]
    case = spec.cases(spec.parse_options({"convention": "bit"}))[0]
    d, w, eps = case.args["dw_hat"], case.args["w"], case.eps
    dims = _filter_dims(w)
    w_hat = exercises.reference("weight_standardize", "bit")(w, eps)
    right = exercises.reference(BWD, "bit")(d, w, eps)
    assert right.sum(dims).abs().max() < 1e-12
    assert (right * w_hat).sum(dims).abs().max() < 1e-8
    assert bwd_no_mean_term(d, w, eps).sum(dims).abs().min() > 1e-3
    assert (bwd_no_std_term(d, w, eps) * w_hat).sum(dims).abs().min() > 1e-3


def test_the_fold_reference_is_the_block():
    # the folded conv computes the WS conv followed by the eval-mode BN
    from normcore import nn as ncnn
    spec = exercises._OPS[FOLD]
    for convention in CONVENTIONS:
        for case in spec.cases(spec.parse_options({"convention": convention})):
            a = case.args
            C_out, C_in, kh, kw = case.shape
            conv = ncnn.WSConv2d(C_in, C_out, (kh, kw), ws_eps=a["eps_ws"],
                                 convention=convention, dtype=case.dtype)
            bn = torch.nn.BatchNorm2d(C_out, eps=a["eps_bn"], dtype=case.dtype).eval()
            with torch.no_grad():
                conv.weight.copy_(a["weight"])
                conv.bias.copy_(a["bias"])
                bn.weight.copy_(a["gamma"])
                bn.bias.copy_(a["beta"])
                bn.running_mean.copy_(a["running_mean"])
                bn.running_var.copy_(a["running_var"])
                x = torch.randn(2, C_in, 5, 5, generator=torch.Generator().manual_seed(1),
                                dtype=case.dtype)
                weight, bias = spec.reference(case)
                folded = torch.nn.functional.conv2d(x, weight, bias)
                tol = 1e-4 if case.dtype == torch.float32 else 1e-10
                torch.testing.assert_close(folded, bn(conv(x)), rtol=tol, atol=tol)


# =======================================================================================
# bad input and wrong outputs: the usual reports
# =======================================================================================
def test_bad_options():
    with pytest.raises(ValueError, match=r"check\('fold_ws', \.\.\.\): unknown convention"):
        check(FOLD, fold_original, convention="paper")
    with pytest.raises(ValueError, match="unknown convention"):
        check(BWD, bwd_original, convention="qiao")
    with pytest.raises(ValueError, match="ndims"):
        check(FOLD, fold_original, ndims=(2,))
    with pytest.raises(TypeError, match="unknown option"):
        check(BWD, bwd_original, groups=2)


def test_wrong_outputs_are_reported():
    r = check(BWD, lambda d, w, eps: bwd_original(d, w, eps).sum(0))
    assert r.kind == "shape" and "must have shape (4, 3, 3, 3)" in _flat(r.message)
    r = check(BWD, lambda d, w, eps: bwd_original(d, w, eps).float())
    assert r.kind == "dtype"
    r = check(BWD, lambda d, w, eps: None)
    assert r.kind == "type" and "forget the return" in _flat(r.message)
    r = check(FOLD, lambda *args: fold_original(*args)[0])
    assert r.kind == "type" and "(weight, bias)" in _flat(r.message)
    r = check(FOLD, lambda *args: (fold_original(*args)[0], fold_original(*args)[1][:, None]))
    assert r.kind == "shape" and "one value per output channel" in _flat(r.message)


def test_exceptions_say_how_the_function_is_called():
    def flattens(d, w, eps):
        C_out, C_in, kh, kw = w.shape
        return d
    r = check(BWD, flattens, ndims=(2, 4))
    assert r.kind == "exception" and "not enough values to unpack" in _flat(r.message)
    assert ("f(dw_hat, w, eps) with dw_hat and w of shape (C_out, C_in) and "
            "(C_out, C_in, kH, kW)") in _flat(r.message)
    r = check(FOLD, lambda *args: 1 / 0)
    assert r.kind == "exception" and "eps_bn) with weight of shape (C_out, C_in, kH, kW)" \
        in _flat(r.message)


def test_unknown_mistake_says_which_output_is_wrong():
    def bias_doubled(*args):
        w, b = fold_original(*args)
        return w, 2 * b
    r = check(FOLD, bias_doubled)
    assert r.kind == "unknown" and "Wrong: bias. Right: weight." in _flat(r.message)


def test_signatures():
    assert exercises.signature(BWD) == "f(dw_hat, w, eps)"
    assert exercises.signature(FOLD) == ("f(weight, bias, eps_ws, gamma, beta, running_mean, "
                                         "running_var, eps_bn)")
