"""The checker ops of the LayerNorm / RMSNorm chapter: layer_norm_shape, layer_norm_backward,
rms_norm.  Correct functions pass; each student-style mistake is diagnosed as itself."""
import pytest
import torch

from normcore import exercises
from normcore.exercises import CATALOGUE, check


def _dims(x, ns):
    return tuple(range(x.dim() - len(ns), x.dim()))


# ---- LayerNorm forward over any normalized_shape ------------------------------------------
def ln_correct(x, ns, gamma, beta, eps):
    d = _dims(x, ns)
    m = x.mean(d, keepdim=True)
    v = ((x - m) ** 2).mean(d, keepdim=True)
    return gamma * (x - m) / torch.sqrt(v + eps) + beta


def ln_over_batch(x, ns, gamma, beta, eps):
    m = x.mean(0, keepdim=True)
    v = ((x - m) ** 2).mean(0, keepdim=True)
    return gamma * (x - m) / torch.sqrt(v + eps) + beta


def ln_last_dim_only(x, ns, gamma, beta, eps):
    m = x.mean(-1, keepdim=True)
    v = x.var(-1, unbiased=False, keepdim=True)
    return gamma * (x - m) / torch.sqrt(v + eps) + beta


def ln_gamma_per_channel(x, ns, gamma, beta, eps):
    k = len(ns)
    pick = (slice(None),) + (slice(0, 1),) * (k - 1)     # gamma[c, 0, 0] for channel c
    return ln_correct(x, ns, gamma[pick], beta[pick], eps)


def ln_naive(x, ns, gamma, beta, eps):
    d = _dims(x, ns)
    m = x.mean(d, keepdim=True)
    v = (x * x).mean(d, keepdim=True) - m * m
    return gamma * (x - m) / torch.sqrt(v + eps) + beta


def ln_eps_outside(x, ns, gamma, beta, eps):
    d = _dims(x, ns)
    m = x.mean(d, keepdim=True)
    return gamma * (x - m) / (x.std(d, unbiased=False, keepdim=True) + eps) + beta


def ln_unbiased(x, ns, gamma, beta, eps):
    d = _dims(x, ns)
    m = x.mean(d, keepdim=True)
    return gamma * (x - m) / torch.sqrt(x.var(d, keepdim=True) + eps) + beta


# ---- LayerNorm backward ----------------------------------------------------------------------
def _parts(x, ns, eps):
    d = _dims(x, ns)
    m = x.mean(d, keepdim=True)
    r = 1 / torch.sqrt(((x - m) ** 2).mean(d, keepdim=True) + eps)
    return d, tuple(range(x.dim() - len(ns))), (x - m) * r, r


def bwd_correct(dy, x, ns, gamma, eps):
    d, lead, xh, r = _parts(x, ns, eps)
    g = gamma * dy
    dx = r * (g - g.mean(d, keepdim=True) - xh * (g * xh).mean(d, keepdim=True))
    return dx, (dy * xh).sum(lead), dy.sum(lead)


def bwd_no_mean(dy, x, ns, gamma, eps):
    d, lead, xh, r = _parts(x, ns, eps)
    g = gamma * dy
    return r * (g - xh * (g * xh).mean(d, keepdim=True)), (dy * xh).sum(lead), dy.sum(lead)


def bwd_no_var(dy, x, ns, gamma, eps):
    d, lead, xh, r = _parts(x, ns, eps)
    g = gamma * dy
    return r * (g - g.mean(d, keepdim=True)), (dy * xh).sum(lead), dy.sum(lead)


def bwd_stats_constant(dy, x, ns, gamma, eps):
    d, lead, xh, r = _parts(x, ns, eps)
    return r * gamma * dy, (dy * xh).sum(lead), dy.sum(lead)


def bwd_gamma_outside(dy, x, ns, gamma, eps):       # BatchNorm's form
    d, lead, xh, r = _parts(x, ns, eps)
    dx = gamma * r * (dy - dy.mean(d, keepdim=True) - xh * (dy * xh).mean(d, keepdim=True))
    return dx, (dy * xh).sum(lead), dy.sum(lead)


def bwd_over_batch(dy, x, ns, gamma, eps):          # BatchNorm's sets
    m = x.mean(0, keepdim=True)
    r = 1 / torch.sqrt(((x - m) ** 2).mean(0, keepdim=True) + eps)
    xh = (x - m) * r
    g = gamma * dy
    dx = r * (g - g.mean(0, keepdim=True) - xh * (g * xh).mean(0, keepdim=True))
    lead = tuple(range(x.dim() - len(ns)))
    return dx, (dy * xh).sum(lead), dy.sum(lead)


def bwd_dgamma_from_x(dy, x, ns, gamma, eps):
    dx, _, dbeta = bwd_correct(dy, x, ns, gamma, eps)
    return dx, (dy * x).sum(tuple(range(x.dim() - len(ns)))), dbeta


# ---- RMSNorm ---------------------------------------------------------------------------------
def rms_correct(x, ns, gamma, eps):
    return gamma * x / torch.sqrt((x * x).mean(_dims(x, ns), keepdim=True) + eps)


def rms_centered(x, ns, gamma, eps):
    xc = x - x.mean(_dims(x, ns), keepdim=True)
    return rms_correct(xc, ns, gamma, eps)


def rms_eps_outside(x, ns, gamma, eps):
    rms = (x * x).mean(_dims(x, ns), keepdim=True).sqrt()
    return gamma * x / (rms + eps)


def rms_last_dim_only(x, ns, gamma, eps):
    return gamma * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


#: (op, student function, options, expected keys, words the message must hold); also added
#: to tests/test_exercises.py's DIAGNOSES, which requires every catalogue entry be tested
LAYER_DIAGNOSES = [
    ("layer_norm_shape", ln_over_batch, {}, ("wrong_axes",), ["which is how BatchNorm"]),
    ("layer_norm_shape", ln_last_dim_only, {}, ("wrong_axes",), ["the last dim only"]),
    ("layer_norm_shape", ln_gamma_per_channel, {}, ("affine_per_channel",),
     ["one gamma and one beta per channel"]),
    ("layer_norm_shape", ln_naive, {}, ("naive_var",), ["E[x^2] - E[x]^2"]),
    ("layer_norm_shape", ln_eps_outside, {}, ("eps_outside_sqrt",), ["std + eps"]),
    ("layer_norm_shape", ln_unbiased, {}, ("unbiased_var",), ["LayerNorm normalizes"]),
    ("layer_norm_backward", bwd_no_mean, {}, ("ln_backward_no_mean_grad",), ["mean(d)"]),
    ("layer_norm_backward", bwd_no_var, {}, ("ln_backward_no_var_grad",), ["variance"]),
    ("layer_norm_backward", bwd_stats_constant, {},
     ("ln_backward_no_var_grad", "ln_backward_no_mean_grad"), ["two mistakes"]),
    ("layer_norm_backward", bwd_gamma_outside, {}, ("ln_backward_gamma_outside",),
     ["as BatchNorm"]),
    ("layer_norm_backward", bwd_dgamma_from_x, {}, ("dgamma_uses_x",), ["dy * x"]),
    ("layer_norm_backward", bwd_over_batch, {}, ("wrong_axes",), ["which is how BatchNorm"]),
    ("rms_norm", rms_centered, {}, ("rms_centered",), ["LayerNorm without beta"]),
    ("rms_norm", rms_eps_outside, {}, ("rms_eps_outside",), ["inside the square root"]),
    ("rms_norm", rms_last_dim_only, {}, ("wrong_axes",), ["the last dim only"]),
]


def _flat(text):
    return " ".join(text.split())


@pytest.mark.parametrize("op, fn", [("layer_norm_shape", ln_correct),
                                    ("layer_norm_backward", bwd_correct),
                                    ("rms_norm", rms_correct)])
@pytest.mark.parametrize("options", [{}, {"seed": 3}, {"ndims": (2,)}], ids=str)
def test_correct_functions_pass(op, fn, options):
    report = check(op, fn, **options)
    assert report.passed, str(report)


@pytest.mark.parametrize("op, fn, options, keys, words", LAYER_DIAGNOSES,
                         ids=[f"{d[0]}-{d[1].__name__}" for d in LAYER_DIAGNOSES])
def test_mistake_is_diagnosed_as_itself(op, fn, options, keys, words):
    report = check(op, fn, **options)
    text = str(report)
    assert not report.passed and report.kind == "misconception", text
    assert report.misconceptions == keys, text
    for key in keys:
        assert f"[{key}]" in text and CATALOGUE[key].title in text, text
    for w in words:
        assert _flat(w) in _flat(report.message), text


def test_every_new_entry_and_op_is_covered():
    ops = {"layer_norm_shape", "layer_norm_backward", "rms_norm"}
    assert ops <= set(exercises.OPS)
    for op in ops:
        named = {k for o, _, _, keys, _ in LAYER_DIAGNOSES if o == op for k in keys}
        assert named == {m.key for m in exercises.catalogue(op)}, op


def test_reference_is_torch():
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    g = torch.rand(3, 4, dtype=torch.float64) + 0.5
    b = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(exercises.reference("layer_norm_shape")(x, (3, 4), g, b, 1e-5),
                               torch.nn.functional.layer_norm(x, (3, 4), g, b, 1e-5))
    torch.testing.assert_close(exercises.reference("rms_norm")(x, (3, 4), g, 1e-5),
                               torch.nn.functional.rms_norm(x, [3, 4], g, 1e-5))
