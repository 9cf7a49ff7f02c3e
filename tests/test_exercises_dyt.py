"""The checker op of the chapter without normalization: dyt (Dynamic Tanh).  A correct
function in plain torch passes; each student-style mistake (tanh without alpha, alpha outside
the tanh, gamma and beta on the wrong axis) is diagnosed as itself; bad returns and a wrong
signature give the usual reports."""
import pytest
import torch

from normcore import exercises
from normcore.exercises import check

OP = "dyt"


# ---- student-style functions (plain torch) --------------------------------------------------
def affine_shape(x, channels_last):
    """gamma's view: (C,) over the last dim, or (1, C, 1, ...) over dim 1."""
    return (-1,) if channels_last else (1, -1) + (1,) * (x.dim() - 2)


def dyt_correct(x, alpha, gamma, beta, channels_last):
    shape = affine_shape(x, channels_last)
    return gamma.view(shape) * torch.tanh(alpha * x) + beta.view(shape)


def dyt_no_alpha(x, alpha, gamma, beta, channels_last):
    shape = affine_shape(x, channels_last)
    return gamma.view(shape) * torch.tanh(x) + beta.view(shape)


def dyt_alpha_outside(x, alpha, gamma, beta, channels_last):
    shape = affine_shape(x, channels_last)
    return gamma.view(shape) * alpha * torch.tanh(x) + beta.view(shape)


def dyt_transformer_form(x, alpha, gamma, beta, channels_last):
    return gamma * torch.tanh(alpha * x) + beta            # always the last dim


def dyt_always_channel_dim(x, alpha, gamma, beta, channels_last):
    shape = affine_shape(x, False)                          # always dim 1
    return gamma.view(shape) * torch.tanh(alpha * x) + beta.view(shape)


def dyt_no_alpha_transformer_form(x, alpha, gamma, beta, channels_last):
    return gamma * torch.tanh(x) + beta


#: (op, student function, options, expected keys, words the message must hold); added to
#: tests/test_exercises.py's DIAGNOSES, whose test_student_mistake_is_named checks each
DYT_DIAGNOSES = [
    (OP, dyt_no_alpha, {}, ("dyt_no_alpha",), ["`tanh(x)`", "inside the tanh"]),
    (OP, dyt_alpha_outside, {}, ("dyt_alpha_outside",), ["`alpha * tanh(x)`"]),
    (OP, dyt_transformer_form, {}, ("dyt_affine_wrong_axis",),
     ["along the last dim of x whatever channels_last says", "channels_last=False"]),
    (OP, dyt_always_channel_dim, {}, ("dyt_affine_wrong_axis",),
     ["per entry of dim 1 whatever channels_last says", "multiply tokens"]),
    (OP, dyt_no_alpha_transformer_form, {}, ("dyt_no_alpha", "dyt_affine_wrong_axis"),
     ["two mistakes"]),
]
DYT_CORRECT = [(OP, dyt_correct, {}), (OP, dyt_correct, {"seed": 5, "ndims": (4,)})]


def _flat(text):
    return " ".join(text.split())


@pytest.mark.parametrize("options", [{}, {"seed": 3}, {"ndims": (2,)}, {"ndims": (3, 4)}],
                         ids=str)
def test_correct_function_passes(options):
    report = check(OP, dyt_correct, **options)
    assert report.passed, str(report)
    assert report.max_abs_error < 1e-4


def test_every_entry_of_the_op_is_covered():
    named = {k for o, _, _, keys, _ in DYT_DIAGNOSES if o == OP for k in keys}
    assert named == {m.key for m in exercises.catalogue(OP)}


def test_the_test_sets_separate_the_mistakes():
    """Both layouts, two dtypes; dim 1 as long as the last dim (so that gamma broadcasts
    along either); some inputs in the saturated part of the tanh and some in its middle."""
    spec = exercises._OPS[OP]
    cases = spec.cases(spec.parse_options({}))
    assert {c.args["channels_last"] for c in cases} == {True, False}
    assert {c.dtype for c in cases} == {torch.float32, torch.float64}
    for c in cases:
        assert c.shape[1] == c.shape[-1], c.title
        u = (c.args["alpha"] * c.args["x"]).abs()
        assert bool((u > 2).any()) and bool((u < 0.5).any()), c.title
        assert float(c.args["alpha"]) != 1.0
        assert c.args["gamma"].unique().numel() == c.args["gamma"].numel()


def test_reference_is_the_papers_formula():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, 4, generator=gen, dtype=torch.float64)   # C = 4 on both ends
    alpha = torch.tensor([0.7], dtype=torch.float64)
    gamma = torch.rand(4, generator=gen, dtype=torch.float64)
    beta = torch.randn(4, generator=gen, dtype=torch.float64)
    ref = exercises.reference(OP)
    # DynamicTanh of the paper's code, channels last and ConvNeXt's channels first
    torch.testing.assert_close(ref(x, alpha, gamma, beta, True),
                               torch.tanh(alpha * x) * gamma + beta)
    torch.testing.assert_close(ref(x, alpha, gamma, beta, False),
                               torch.tanh(alpha * x) * gamma[:, None, None]
                               + beta[:, None, None])
    assert exercises.signature(OP) == "f(x, alpha, gamma, beta, channels_last)"


# ---- bad returns and bad signatures --------------------------------------------------------
def test_signature_without_channels_last_is_reported_with_the_call():
    def four_args(x, alpha, gamma, beta):
        return dyt_correct(x, alpha, gamma, beta, True)
    report = check(OP, four_args)
    text = _flat(report.message)
    assert report.kind == "exception" and "TypeError" in text, text
    assert "f(x, alpha, gamma, beta, channels_last)" in text
    assert "alpha of shape (1,)" in text and "(N, C, H, W) (channels_last=False)" in text


def test_returning_the_wrong_dtype_or_shape():
    report = check(OP, lambda *a: dyt_correct(*a).double())
    assert report.kind == "dtype" and "float64 for a float32 input" in _flat(report.message)
    report = check(OP, lambda *a: dyt_correct(*a).flatten())
    assert report.kind == "shape" and "must have shape (4, 3)" in _flat(report.message)


def test_unknown_mistake_is_no_misconception():
    def sigmoid(x, alpha, gamma, beta, channels_last):    # another S-curve
        shape = affine_shape(x, channels_last)
        return gamma.view(shape) * torch.sigmoid(alpha * x) + beta.view(shape)
    report = check(OP, sigmoid)
    assert report.kind == "unknown" and report.misconception is None
    assert "does not match any known misconception" in _flat(report.message)
    assert "index (" in _flat(report.message) and "channel(s)" not in report.message
