"""The checker op of the GroupNorm chapter: group_norm_backward.  A hand-derived correct
function passes; each student-style mistake (plain torch, the way a learner would write it)
is diagnosed as itself; bad returns give the usual reports."""
import pytest
import torch

from normcore import exercises
from normcore.exercises import check

OP = "group_norm_backward"


# ---- student-style helpers (plain torch) ----------------------------------------------------
def rows(t, G):
    """(N, C, *) -> (N, G, C/G * positions): one row per set of GroupNorm."""
    return t.reshape(t.shape[0], G, -1)


def per_channel(t, x):
    return t.view([1, -1] + [1] * (x.dim() - 2))


def channel_sums(dy, x_hat):
    dims = (0, *range(2, dy.dim()))
    return (dy * x_hat).sum(dims), dy.sum(dims)


def normalized(x, G, eps):
    v = rows(x, G)
    mean = v.mean(-1, keepdim=True)
    r = 1 / torch.sqrt(((v - mean) ** 2).mean(-1, keepdim=True) + eps)
    return ((v - mean) * r).reshape(x.shape), r


def grad_x(dy, x, G, gamma, eps, mean_term=True, var_term=True, with_gamma=True):
    """dx = r (d - mean(d) - x_hat mean(d x_hat)), the means over each row, with terms left
    out on request; and x_hat."""
    x_hat, r = normalized(x, G, eps)
    d = rows(dy * per_channel(gamma, x) if with_gamma else dy, G)
    xh = rows(x_hat, G)
    out = d
    if mean_term:
        out = out - d.mean(-1, keepdim=True)
    if var_term:
        out = out - xh * (d * xh).mean(-1, keepdim=True)
    return (r * out).reshape(x.shape), x_hat


# ---- correct ------------------------------------------------------------------------------
def gn_bwd_correct(dy, x, num_groups, gamma, eps):
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps)
    return (dx, *channel_sums(dy, x_hat))


# ---- the mistakes ---------------------------------------------------------------------------
def gn_bwd_stats_constant(dy, x, num_groups, gamma, eps):
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps, mean_term=False, var_term=False)
    return (dx, *channel_sums(dy, x_hat))


def gn_bwd_no_var_term(dy, x, num_groups, gamma, eps):
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps, var_term=False)
    return (dx, *channel_sums(dy, x_hat))


def gn_bwd_no_mean_term(dy, x, num_groups, gamma, eps):
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps, mean_term=False)
    return (dx, *channel_sums(dy, x_hat))


def gn_bwd_without_gamma(dy, x, num_groups, gamma, eps):
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps, with_gamma=False)
    return (dx, *channel_sums(dy, x_hat))


def gn_bwd_gamma_outside(dy, x, num_groups, gamma, eps):      # BatchNorm's form
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps, with_gamma=False)
    return (dx * per_channel(gamma, x), *channel_sums(dy, x_hat))


def gn_bwd_dgamma_from_x(dy, x, num_groups, gamma, eps):
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps)
    return dx, channel_sums(dy, x)[0], dy.sum((0, *range(2, dy.dim())))


def _group_totals(t, x, G):
    """The per-group sum of a per-element tensor, repeated for each channel of the group."""
    N, C = x.shape[:2]
    return t.reshape(N, G, C // G, -1).sum((0, 2, 3)).repeat_interleave(C // G)


def gn_bwd_affine_per_group(dy, x, num_groups, gamma, eps):
    dx, x_hat = grad_x(dy, x, num_groups, gamma, eps)
    return dx, _group_totals(dy * x_hat, x, num_groups), _group_totals(dy, x, num_groups)


def gn_bwd_dbeta_per_group(dy, x, num_groups, gamma, eps):
    dx, dgamma, _ = gn_bwd_correct(dy, x, num_groups, gamma, eps)
    return dx, dgamma, _group_totals(dy, x, num_groups)


def gn_bwd_strided(dy, x, num_groups, gamma, eps):
    N, C = x.shape[:2]

    def strided(t):        # channel c -> group c % G
        return t.reshape(N, C // num_groups, num_groups, -1)
    xv = strided(x)
    mean = xv.mean((1, 3), keepdim=True)
    r = 1 / torch.sqrt(((xv - mean) ** 2).mean((1, 3), keepdim=True) + eps)
    xh = (xv - mean) * r
    d = strided(dy * per_channel(gamma, x))
    dx = r * (d - d.mean((1, 3), keepdim=True) - xh * (d * xh).mean((1, 3), keepdim=True))
    return (dx.reshape(x.shape), *channel_sums(dy, xh.reshape(x.shape)))


def gn_bwd_ignores_groups(dy, x, num_groups, gamma, eps):     # one group: LayerNorm's set
    return gn_bwd_correct(dy, x, 1, gamma, eps)


def gn_bwd_per_channel(dy, x, num_groups, gamma, eps):        # InstanceNorm's set
    return gn_bwd_correct(dy, x, x.shape[1], gamma, eps)


def gn_bwd_like_batch_norm(dy, x, num_groups, gamma, eps):    # BatchNorm's set
    dims = (0, *range(2, x.dim()))
    mean = x.mean(dims, keepdim=True)
    r = 1 / torch.sqrt(((x - mean) ** 2).mean(dims, keepdim=True) + eps)
    x_hat = (x - mean) * r
    d = dy * per_channel(gamma, x)
    dx = r * (d - d.mean(dims, keepdim=True) - x_hat * (d * x_hat).mean(dims, keepdim=True))
    return (dx, *channel_sums(dy, x_hat))


def gn_bwd_unbiased(dy, x, num_groups, gamma, eps):
    # the gradient of a forward pass that divided by n - 1 (what autograd gives for it)
    x = x.detach().requires_grad_(True)
    gamma = gamma.detach().requires_grad_(True)
    beta = torch.zeros_like(gamma, requires_grad=True)
    v = rows(x, num_groups)
    x_hat = ((v - v.mean(-1, keepdim=True)) / torch.sqrt(v.var(-1, keepdim=True) + eps))
    y = x_hat.reshape(x.shape) * per_channel(gamma, x) + per_channel(beta, x)
    return torch.autograd.grad(y, (x, gamma, beta), dy)


#: (op, student function, options, expected keys, words the message must hold); added to
#: tests/test_exercises.py's DIAGNOSES, whose test_student_mistake_is_named checks each
GROUP_DIAGNOSES = [
    (OP, gn_bwd_stats_constant, {}, ("backward_stats_constant",),
     ["mean and variance of each group as constants"]),
    (OP, gn_bwd_no_var_term, {}, ("backward_no_var_grad",), ["x_hat * mean(d * x_hat)"]),
    (OP, gn_bwd_no_mean_term, {}, ("backward_no_mean_grad",), ["`-mean(d)`"]),
    (OP, gn_bwd_without_gamma, {}, ("dx_without_gamma",), ["the gamma of its own channel"]),
    (OP, gn_bwd_gamma_outside, {}, ("ln_backward_gamma_outside",),
     ["In GroupNorm gamma has one entry per channel"]),
    (OP, gn_bwd_dgamma_from_x, {}, ("dgamma_uses_x",), ["dy * x", "over (N, H, W)"]),
    (OP, gn_bwd_affine_per_group, {}, ("affine_grad_per_group",),
     ["dgamma[c] = sum of dy * x_hat and dbeta[c] = sum of dy"]),
    (OP, gn_bwd_dbeta_per_group, {}, ("affine_grad_per_group",),
     ["group's total: dbeta[c] = sum of dy,"]),
    (OP, gn_bwd_strided, {}, ("strided_groups",), ["c % num_groups"]),
    (OP, gn_bwd_ignores_groups, {}, ("wrong_axes",), ["(C, H, W), which is how LayerNorm"]),
    (OP, gn_bwd_per_channel, {"ndims": (3, 4)}, ("wrong_axes",),
     ["over (H, W), which is how InstanceNorm"]),
    (OP, gn_bwd_like_batch_norm, {}, ("wrong_axes",), ["(N, H, W), which is how BatchNorm"]),
    (OP, gn_bwd_unbiased, {}, ("unbiased_var",), ["1/(n - 1)"]),
]


def _flat(text):
    return " ".join(text.split())


@pytest.mark.parametrize("options", [{}, {"seed": 3}, {"ndims": (2,)}, {"ndims": (3, 4)}],
                         ids=str)
def test_correct_function_passes(options):
    report = check(OP, gn_bwd_correct, **options)
    assert report.passed, str(report)
    assert report.max_abs_error < 1e-4


def test_every_entry_of_the_op_is_covered():
    named = {k for o, _, _, keys, _ in GROUP_DIAGNOSES if o == OP for k in keys}
    assert named == {m.key for m in exercises.catalogue(OP)}


def test_the_test_sets_separate_the_mistakes():
    # at least two groups of at least two channels, and gamma not constant in a group
    spec = exercises._OPS[OP]
    cases = spec.cases(spec.parse_options({}))
    assert any(c.dtype == torch.float32 for c in cases)
    for c in cases:
        C, G = c.shape[1], c.groups
        assert G >= 2 and C // G >= 2
        spread = c.args["gamma"].view(G, -1).aminmax(dim=1)
        assert bool((spread.max - spread.min > 0.01).all())


def test_reference_is_torch():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    gamma = torch.rand(6, generator=gen, dtype=torch.float64).requires_grad_(True)
    beta = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 6, 3, 2, generator=gen, dtype=torch.float64)
    theirs = torch.autograd.grad(torch.nn.functional.group_norm(x, 3, gamma, beta, 1e-5),
                                 (x, gamma, beta), dy)
    ours = exercises.reference(OP)(dy, x.detach(), 3, gamma.detach(), 1e-5)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)
    assert exercises.signature(OP) == "f(dy, x, num_groups, gamma, eps)"


# ---- bad returns and bad signatures --------------------------------------------------------
def test_dgamma_per_group_of_shape_g_is_a_shape_error():
    def per_group(dy, x, num_groups, gamma, eps):
        dx, x_hat = grad_x(dy, x, num_groups, gamma, eps)
        dgamma = rows(dy * x_hat, num_groups).sum((0, 2))             # (G,)
        return dx, dgamma, dy.sum((0, *range(2, dy.dim())))
    report = check(OP, per_group)
    text = _flat(report.message)
    assert report.kind == "shape", text
    assert "dgamma of shape (3,)" in text and "must have shape (6,)" in text
    assert "one value per channel" in text


def test_batch_norm_signature_is_reported_with_the_call():
    def bn_signature(dy, x, gamma, eps):
        return gn_bwd_correct(dy, x, 2, gamma, eps)
    report = check(OP, bn_signature)
    text = _flat(report.message)
    assert report.kind == "exception" and "TypeError" in text, text
    assert "f(dy, x, num_groups, gamma, eps)" in text and "num_groups a divisor of C" in text


def test_hardcoded_rank_is_reported():
    def four_d_only(dy, x, num_groups, gamma, eps):
        N, C, H, W = x.shape
        return gn_bwd_correct(dy, x, num_groups, gamma, eps)
    report = check(OP, four_d_only)
    assert report.kind == "exception" and "Compute dims from x.dim()" in _flat(report.message)
    assert check(OP, four_d_only, ndims=(4,)).passed


def test_returning_dx_only_or_the_wrong_dtype():
    report = check(OP, lambda dy, x, G, gamma, eps: gn_bwd_correct(dy, x, G, gamma, eps)[0])
    assert report.kind == "type" and "(dx, dgamma, dbeta)" in _flat(report.message)
    report = check(OP, lambda dy, x, G, gamma, eps: tuple(
        t.float() for t in gn_bwd_correct(dy, x, G, gamma, eps)))
    assert report.kind == "dtype" and "float32 for a float64 input" in _flat(report.message)


def test_unknown_mistake_says_which_output_is_wrong():
    def dx_scaled(dy, x, num_groups, gamma, eps):
        dx, dgamma, dbeta = gn_bwd_correct(dy, x, num_groups, gamma, eps)
        return 1.5 * dx, dgamma, dbeta
    report = check(OP, dx_scaled)
    assert report.kind == "unknown"
    assert "Wrong: dx. Right: dgamma, dbeta." in _flat(report.message)
