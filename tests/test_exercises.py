"""The exercise checkers: the reference passes, and every known mistake, written the way a
student would write it (plain torch, not the checker's own variants), is named.

Each student function below is independent of normcore: it is what a learner might type.
"""
from __future__ import annotations

import pytest
import torch

from normcore import exercises as ex
from normcore.exercises import CATALOGUE, check
from normcore.exercises.driver import _distinct_candidates, plan


def flat(message: str) -> str:
    """The message with its line wrapping undone (reports wrap at the page's width)."""
    return " ".join(message.split())


# =======================================================================================
# student-style helpers (plain torch)
# =======================================================================================
def bn_dims(x):
    return [0] + list(range(2, x.dim()))


def per_channel(t, x):
    return t.view([1, -1] + [1] * (x.dim() - 2))


def bn_stats(x, unbiased=False):
    dims = bn_dims(x)
    mean = x.mean(dim=dims, keepdim=True)
    var = ((x - mean) ** 2).sum(dim=dims, keepdim=True)
    n = x.numel() // x.shape[1]
    return mean, var / (n - 1 if unbiased else n)


# ---- batch norm ------------------------------------------------------------------------
def bn_correct(x, gamma, beta, eps):
    mean, var = bn_stats(x)
    x_hat = (x - mean) / torch.sqrt(var + eps)
    return per_channel(gamma, x) * x_hat + per_channel(beta, x)


def bn_unbiased(x, gamma, beta, eps):
    dims = bn_dims(x)
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True)  # unbiased by default
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def bn_eps_outside(x, gamma, beta, eps):
    mean, var = bn_stats(x)
    return per_channel(gamma, x) * (x - mean) / (var.sqrt() + eps) + per_channel(beta, x)


def bn_no_eps(x, gamma, beta, eps):
    mean, var = bn_stats(x)
    return per_channel(gamma, x) * (x - mean) / var.sqrt() + per_channel(beta, x)


def bn_fixed_eps(x, gamma, beta, eps):
    mean, var = bn_stats(x)
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + 1e-5) + per_channel(beta, x)


def bn_naive(x, gamma, beta, eps):
    dims = bn_dims(x)
    mean = x.mean(dim=dims, keepdim=True)
    var = (x * x).mean(dim=dims, keepdim=True) - mean ** 2
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def bn_naive_other_order(x, gamma, beta, eps):
    # E[x^2] - E[x]^2 again, with sums in another order: still diagnosed
    xs = x.transpose(0, 1).reshape(x.shape[1], -1)
    n = xs.shape[1]
    mean = xs.sum(1) / n
    var = (xs ** 2).sum(1) / n - mean * mean
    mean, var = per_channel(mean, x), per_channel(var, x)
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def bn_no_affine(x, gamma, beta, eps):
    mean, var = bn_stats(x)
    return (x - mean) / torch.sqrt(var + eps)


def bn_over_n_only(x, gamma, beta, eps):
    mean = x.mean(dim=0, keepdim=True)
    var = x.var(dim=0, keepdim=True, unbiased=False)
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def bn_over_everything(x, gamma, beta, eps):
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def bn_std_plus_eps(x, gamma, beta, eps):
    # the classic one-liner: unbiased std AND eps outside the square root
    dims = bn_dims(x)
    z = (x - x.mean(dim=dims, keepdim=True)) / (x.std(dim=dims, keepdim=True) + eps)
    return per_channel(gamma, x) * z + per_channel(beta, x)


# ---- layer norm ------------------------------------------------------------------------
def ln_correct(x, gamma, beta, eps):
    dims = tuple(range(1, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def ln_unbiased(x, gamma, beta, eps):
    dims = tuple(range(1, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def ln_like_instance_norm(x, gamma, beta, eps):
    dims = tuple(range(2, x.dim()))  # (H, W): per sample AND channel
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=False)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def ln_last_dim_only(x, gamma, beta, eps):
    mean = x.mean(-1, keepdim=True)  # the transformer habit, on an image
    var = x.var(-1, keepdim=True, unbiased=False)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def ln_naive(x, gamma, beta, eps):
    flat = x.reshape(x.shape[0], -1)
    mean = flat.mean(1)
    var = flat.pow(2).mean(1) - mean.pow(2)
    shape = [-1] + [1] * (x.dim() - 1)
    return gamma * (x - mean.view(shape)) / torch.sqrt(var.view(shape) + eps) + beta


# ---- instance norm ---------------------------------------------------------------------
def in_correct(x, gamma, beta, eps):
    dims = tuple(range(2, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=False)
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def in_like_layer_norm(x, gamma, beta, eps):
    dims = tuple(range(1, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=False)
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def in_like_batch_norm(x, gamma, beta, eps):
    dims = bn_dims(x)
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=False)
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def in_eps_outside(x, gamma, beta, eps):
    dims = tuple(range(2, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    std = x.var(dim=dims, keepdim=True, unbiased=False).sqrt()
    return per_channel(gamma, x) * (x - mean) / (std + eps) + per_channel(beta, x)


def in_no_eps(x, gamma, beta, eps):
    dims = tuple(range(2, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    std = x.std(dim=dims, keepdim=True, unbiased=False)
    return per_channel(gamma, x) * (x - mean) / std + per_channel(beta, x)


# ---- group norm ------------------------------------------------------------------------
def gn_correct(x, num_groups, gamma, beta, eps):
    N = x.shape[0]
    xg = x.reshape(N, num_groups, -1)
    mean = xg.mean(-1, keepdim=True)
    var = xg.var(-1, keepdim=True, unbiased=False)
    x_hat = ((xg - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    return per_channel(gamma, x) * x_hat + per_channel(beta, x)


def gn_strided(x, num_groups, gamma, beta, eps):
    N, C = x.shape[:2]
    xg = x.reshape(N, C // num_groups, num_groups, -1)  # channel c -> group c % G
    mean = xg.mean(dim=(1, 3), keepdim=True)
    var = xg.var(dim=(1, 3), keepdim=True, unbiased=False)
    x_hat = ((xg - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    return per_channel(gamma, x) * x_hat + per_channel(beta, x)


def gn_group_size_swapped(x, num_groups, gamma, beta, eps):
    N, C = x.shape[:2]
    xg = x.reshape(N, C // num_groups, -1)  # num_groups read as channels per group
    mean = xg.mean(-1, keepdim=True)
    var = xg.var(-1, keepdim=True, unbiased=False)
    x_hat = ((xg - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    return per_channel(gamma, x) * x_hat + per_channel(beta, x)


def gn_affine_per_group(x, num_groups, gamma, beta, eps):
    N = x.shape[0]
    xg = x.reshape(N, num_groups, -1)
    mean = xg.mean(-1, keepdim=True)
    var = xg.var(-1, keepdim=True, unbiased=False)
    y = (xg - mean) / torch.sqrt(var + eps)
    # "one gamma per group": the first num_groups entries, on the grouped view
    y = y * gamma[:num_groups].view(1, -1, 1) + beta[:num_groups].view(1, -1, 1)
    return y.reshape(x.shape)


def gn_like_instance_norm(x, num_groups, gamma, beta, eps):
    dims = tuple(range(2, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=False)
    return per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)


def gn_no_affine(x, num_groups, gamma, beta, eps):
    xg = x.reshape(x.shape[0], num_groups, -1)
    mean = xg.mean(-1, keepdim=True)
    var = xg.var(-1, keepdim=True, unbiased=False)
    return ((xg - mean) / torch.sqrt(var + eps)).reshape(x.shape)


def gn_unbiased(x, num_groups, gamma, beta, eps):
    xg = x.reshape(x.shape[0], num_groups, -1)
    mean = xg.mean(-1, keepdim=True)
    var = xg.var(-1, keepdim=True)
    x_hat = ((xg - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    return per_channel(gamma, x) * x_hat + per_channel(beta, x)


# ---- running statistics ----------------------------------------------------------------
def running_correct(running_mean, running_var, x, momentum):
    dims = bn_dims(x)
    mean = x.mean(dim=dims)
    var = x.var(dim=dims, unbiased=True)
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var)


def running_correct_in_place(running_mean, running_var, x, momentum):
    dims = bn_dims(x)
    running_mean.mul_(1 - momentum).add_(momentum * x.mean(dim=dims))
    running_var.mul_(1 - momentum).add_(momentum * x.var(dim=dims))
    return running_mean, running_var


def running_biased(running_mean, running_var, x, momentum):
    dims = bn_dims(x)
    mean = x.mean(dim=dims)
    var = x.var(dim=dims, unbiased=False)
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var)


def running_swapped(running_mean, running_var, x, momentum):
    dims = bn_dims(x)
    mean = x.mean(dim=dims)
    var = x.var(dim=dims)
    return (momentum * running_mean + (1 - momentum) * mean,
            momentum * running_var + (1 - momentum) * var)


def running_naive(running_mean, running_var, x, momentum):
    dims = bn_dims(x)
    n = x.numel() // x.shape[1]
    mean = x.mean(dim=dims)
    var = ((x * x).mean(dim=dims) - mean * mean) * n / (n - 1)
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var)


# ---- backward --------------------------------------------------------------------------
def _bwd_parts(dy, x, gamma, eps, unbiased=False, dims_fn=bn_dims):
    dims = dims_fn(x)
    mean = x.mean(dim=dims, keepdim=True)
    n = 1
    for d in dims:
        n *= x.shape[d]
    var = ((x - mean) ** 2).sum(dim=dims, keepdim=True) / (n - 1 if unbiased else n)
    inv_std = 1.0 / torch.sqrt(var + eps)
    x_hat = (x - mean) * inv_std
    g = per_channel(gamma, x)
    return dims, x_hat, inv_std, g


def bwd_correct(dy, x, gamma, eps):
    dims, x_hat, inv_std, g = _bwd_parts(dy, x, gamma, eps)
    dx = g * inv_std * (dy - dy.mean(dims, keepdim=True)
                        - x_hat * (dy * x_hat).mean(dims, keepdim=True))
    return dx, (dy * x_hat).sum(dims), dy.sum(dims)


def bwd_stats_constant(dy, x, gamma, eps):
    dims, x_hat, inv_std, g = _bwd_parts(dy, x, gamma, eps)
    return dy * g * inv_std, (dy * x_hat).sum(dims), dy.sum(dims)


def bwd_no_var_term(dy, x, gamma, eps):
    dims, x_hat, inv_std, g = _bwd_parts(dy, x, gamma, eps)
    dx = g * inv_std * (dy - dy.mean(dims, keepdim=True))
    return dx, (dy * x_hat).sum(dims), dy.sum(dims)


def bwd_no_mean_term(dy, x, gamma, eps):
    dims, x_hat, inv_std, g = _bwd_parts(dy, x, gamma, eps)
    dx = g * inv_std * (dy - x_hat * (dy * x_hat).mean(dims, keepdim=True))
    return dx, (dy * x_hat).sum(dims), dy.sum(dims)


def bwd_dgamma_from_x(dy, x, gamma, eps):
    dx, _, dbeta = bwd_correct(dy, x, gamma, eps)
    return dx, (dy * x).sum(bn_dims(x)), dbeta


def bwd_without_gamma(dy, x, gamma, eps):
    dims, x_hat, inv_std, g = _bwd_parts(dy, x, gamma, eps)
    dx = inv_std * (dy - dy.mean(dims, keepdim=True)
                    - x_hat * (dy * x_hat).mean(dims, keepdim=True))
    return dx, (dy * x_hat).sum(dims), dy.sum(dims)


def bwd_unbiased(dy, x, gamma, eps):
    # the gradient of a forward pass that divided by n - 1 (what autograd gives for it)
    x = x.detach().requires_grad_(True)
    gamma = gamma.detach().requires_grad_(True)
    beta = torch.zeros_like(gamma, requires_grad=True)
    dims = bn_dims(x)
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True)
    y = per_channel(gamma, x) * (x - mean) / torch.sqrt(var + eps) + per_channel(beta, x)
    return torch.autograd.grad(y, (x, gamma, beta), dy)


def bwd_over_n_only(dy, x, gamma, eps):
    dims = [0]
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, keepdim=True, unbiased=False)
    inv_std = 1.0 / torch.sqrt(var + eps)
    x_hat = (x - mean) * inv_std
    dx = per_channel(gamma, x) * inv_std * (dy - dy.mean(dims, keepdim=True)
                                            - x_hat * (dy * x_hat).mean(dims, keepdim=True))
    return dx, (dy * x_hat).sum(bn_dims(x)), dy.sum(bn_dims(x))


# ---- weight standardization ------------------------------------------------------------
def _ws_dims(w):
    return tuple(range(1, w.dim()))


def ws_original(w, eps):
    d = _ws_dims(w)
    return (w - w.mean(d, keepdim=True)) / (w.std(d, keepdim=True) + eps)


def ws_biased_std(w, eps):
    d = _ws_dims(w)
    return (w - w.mean(d, keepdim=True)) / (w.std(d, keepdim=True, unbiased=False) + eps)


def ws_eps_inside(w, eps):
    d = _ws_dims(w)
    return (w - w.mean(d, keepdim=True)) / torch.sqrt(w.var(d, keepdim=True) + eps)


def ws_bit(w, eps):
    d = _ws_dims(w)
    return (w - w.mean(d, keepdim=True)) / torch.sqrt(w.var(d, keepdim=True, unbiased=False) + eps)


def ws_no_eps(w, eps):
    d = _ws_dims(w)
    return (w - w.mean(d, keepdim=True)) / w.std(d, keepdim=True)


def ws_over_out_channels(w, eps):
    return (w - w.mean(0, keepdim=True)) / (w.std(0, keepdim=True) + eps)


def ws_bit_unbiased(w, eps):
    d = _ws_dims(w)
    return (w - w.mean(d, keepdim=True)) / torch.sqrt(w.var(d, keepdim=True) + eps)


def ws_bit_std_plus_eps(w, eps):
    d = _ws_dims(w)
    return (w - w.mean(d, keepdim=True)) / (w.std(d, keepdim=True, unbiased=False) + eps)


# ---- folding BN into the layer before it ------------------------------------------------
def _fold(weight, bias, gamma, beta, running_mean, running_var, eps, std=None, mean=True,
          scale_bias=True):
    if std is None:
        std = torch.sqrt(running_var + eps)
    s = gamma / std
    w = weight * s.view([-1] + [1] * (weight.dim() - 1))
    b = (bias * s if scale_bias else bias) - (s * running_mean if mean else 0) + beta
    return w, b


def fold_correct(weight, bias, gamma, beta, running_mean, running_var, eps):
    return _fold(weight, bias, gamma, beta, running_mean, running_var, eps)


def fold_forgot_mean(weight, bias, gamma, beta, running_mean, running_var, eps):
    return _fold(weight, bias, gamma, beta, running_mean, running_var, eps, mean=False)


def fold_bias_not_scaled(weight, bias, gamma, beta, running_mean, running_var, eps):
    return _fold(weight, bias, gamma, beta, running_mean, running_var, eps, scale_bias=False)


def fold_var_not_std(weight, bias, gamma, beta, running_mean, running_var, eps):
    return _fold(weight, bias, gamma, beta, running_mean, running_var, eps,
                 std=running_var + eps)


def fold_std_plus_eps(weight, bias, gamma, beta, running_mean, running_var, eps):
    return _fold(weight, bias, gamma, beta, running_mean, running_var, eps,
                 std=running_var.sqrt() + eps)


def fold_without_eps(weight, bias, gamma, beta, running_mean, running_var, eps):
    return _fold(weight, bias, gamma, beta, running_mean, running_var, eps,
                 std=running_var.sqrt())


# ---- Chan's merge ------------------------------------------------------------------------
def chan_correct(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
    n = count_a + count_b
    delta = mean_b - mean_a
    return mean_a + delta * count_b / n, m2_a + m2_b + delta ** 2 * count_a * count_b / n


def chan_plain_mean(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
    _, m2 = chan_correct(count_a, mean_a, m2_a, count_b, mean_b, m2_b)
    return (mean_a + mean_b) / 2, m2


def chan_just_add(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
    mean, _ = chan_correct(count_a, mean_a, m2_a, count_b, mean_b, m2_b)
    return mean, m2_a + m2_b


def chan_over_n_squared(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
    n = count_a + count_b
    mean, _ = chan_correct(count_a, mean_a, m2_a, count_b, mean_b, m2_b)
    return mean, m2_a + m2_b + (mean_b - mean_a) ** 2 * count_a * count_b / n ** 2


# =======================================================================================
# what each student function must be diagnosed as
# =======================================================================================
# (op, student function, options, expected misconception keys, words the message must hold)
DIAGNOSES = [
    ("batch_norm", bn_unbiased, {}, ("unbiased_var",), ["n - 1"]),
    ("batch_norm", bn_eps_outside, {}, ("eps_outside_sqrt",), ["std + eps"]),
    ("batch_norm", bn_no_eps, {}, ("no_eps",), ["left eps out"]),
    ("batch_norm", bn_fixed_eps, {}, ("fixed_eps",), ["1e-5"]),
    ("batch_norm", bn_naive, {}, ("naive_var",), ["E[x^2] - E[x]^2"]),
    ("batch_norm", bn_naive_other_order, {}, ("naive_var",), ["cancel"]),
    ("batch_norm", bn_no_affine, {}, ("no_affine",), ["gamma"]),
    ("batch_norm", bn_over_n_only, {}, ("wrong_axes",), ["over (N), but", "(N, H, W)"]),
    ("batch_norm", bn_over_everything, {}, ("wrong_axes",), ["over (N, C, H, W), but"]),
    ("batch_norm", bn_std_plus_eps, {}, ("unbiased_var", "eps_outside_sqrt"),
     ["two mistakes"]),
    ("layer_norm", ln_unbiased, {}, ("unbiased_var",), ["LayerNorm normalizes"]),
    ("layer_norm", ln_like_instance_norm, {"ndims": (3, 4)}, ("wrong_axes",),
     ["over (H, W), which is how InstanceNorm", "(C, H, W)"]),
    ("layer_norm", ln_last_dim_only, {}, ("wrong_axes",), ["over (W), but"]),
    ("layer_norm", ln_naive, {}, ("naive_var",), ["E[x^2] - E[x]^2"]),
    ("instance_norm", in_like_layer_norm, {}, ("wrong_axes",),
     ["(C, H, W), which is how LayerNorm", "over (H, W)."]),
    ("instance_norm", in_like_batch_norm, {}, ("wrong_axes",), ["which is how BatchNorm"]),
    ("instance_norm", in_eps_outside, {}, ("eps_outside_sqrt",), ["std + eps"]),
    ("instance_norm", in_no_eps, {}, ("no_eps",), ["left eps out"]),
    ("group_norm", gn_strided, {}, ("strided_groups",), ["c % num_groups"]),
    ("group_norm", gn_group_size_swapped, {}, ("group_size_as_num_groups",),
     ["groups of num_groups channels"]),
    ("group_norm", gn_affine_per_group, {}, ("affine_per_group",), ["gamma[g]"]),
    ("group_norm", gn_like_instance_norm, {"ndims": (3, 4)}, ("wrong_axes",),
     ["which is how InstanceNorm", "the channels of one group"]),
    ("group_norm", gn_no_affine, {}, ("no_affine",), ["gamma"]),
    ("group_norm", gn_unbiased, {}, ("unbiased_var",), ["GroupNorm normalizes"]),
    ("running_update", running_biased, {}, ("biased_running_var",), ["unbiased"]),
    ("running_update", running_swapped, {}, ("momentum_swapped",), ["wrong way round"]),
    ("running_update", running_naive, {}, ("naive_var",), ["E[x^2] - E[x]^2"]),
    ("batch_norm_backward", bwd_stats_constant, {}, ("backward_stats_constant",),
     ["as constants"]),
    ("batch_norm_backward", bwd_no_var_term, {}, ("backward_no_var_grad",), ["variance"]),
    ("batch_norm_backward", bwd_no_mean_term, {}, ("backward_no_mean_grad",), ["mean(dy)"]),
    ("batch_norm_backward", bwd_dgamma_from_x, {}, ("dgamma_uses_x",), ["dy * x"]),
    ("batch_norm_backward", bwd_without_gamma, {}, ("dx_without_gamma",), ["factor gamma"]),
    ("batch_norm_backward", bwd_unbiased, {}, ("unbiased_var",), ["1/(n - 1)"]),
    ("batch_norm_backward", bwd_over_n_only, {}, ("wrong_axes",), ["over (N), but"]),
    ("weight_standardize", ws_biased_std, {}, ("biased_var",), ["biased std"]),
    ("weight_standardize", ws_eps_inside, {}, ("eps_inside_sqrt",), ["inside the square"]),
    ("weight_standardize", ws_bit, {}, ("other_convention",), ["BiT / timm"]),
    ("weight_standardize", ws_no_eps, {}, ("no_eps",), ["left eps out"]),
    ("weight_standardize", ws_over_out_channels, {}, ("wrong_axes",),
     ["over (C_out), but", "(C_in, kH, kW)"]),
    ("weight_standardize", ws_original, {"convention": "bit"}, ("other_convention",),
     ["original convention"]),
    ("weight_standardize", ws_bit_unbiased, {"convention": "bit"}, ("unbiased_var",),
     ["biased variance"]),
    ("weight_standardize", ws_bit_std_plus_eps, {"convention": "timm"}, ("eps_outside_sqrt",),
     ["std + eps"]),
    ("fold_bn", fold_forgot_mean, {}, ("fold_no_mean",), ["not subtracted"]),
    ("fold_bn", fold_bias_not_scaled, {}, ("fold_bias_unscaled",), ["unscaled"]),
    ("fold_bn", fold_var_not_std, {}, ("fold_no_sqrt",), ["without the square root"]),
    ("fold_bn", fold_std_plus_eps, {}, ("eps_outside_sqrt",), ["std + eps"]),
    ("fold_bn", fold_without_eps, {}, ("no_eps",), ["left eps out", "set D"]),
    ("chan_merge", chan_plain_mean, {}, ("chan_mean_unweighted",), ["(mean_a + mean_b) / 2"]),
    ("chan_merge", chan_just_add, {}, ("chan_no_delta_term",), ["m2_a + m2_b"]),
    ("chan_merge", chan_over_n_squared, {}, ("chan_delta_weight",), ["count ** 2"]),
]
# the LayerNorm / RMSNorm chapter's ops (normcore/exercises/layer.py)
from test_exercises_layer import LAYER_DIAGNOSES  # noqa: E402 - each chapter's table, appended where it begins
DIAGNOSES += LAYER_DIAGNOSES

# --- AdaIN (the InstanceNorm chapter): its student functions live in test_instance_norm.py
from test_instance_norm import ADAIN_CORRECT, ADAIN_DIAGNOSES  # noqa: E402 - each chapter's table, appended where it begins

DIAGNOSES += ADAIN_DIAGNOSES

# --- the WS backward and WS folding ops (normcore/exercises/ws.py, ws_fold.py)
from test_exercises_ws import WS_DIAGNOSES  # noqa: E402 - each chapter's table, appended where it begins

DIAGNOSES += WS_DIAGNOSES

# --- the GroupNorm chapter's backward op (normcore/exercises/group.py)
from test_exercises_group import GROUP_DIAGNOSES, gn_bwd_correct  # noqa: E402 - each chapter's table, appended where it begins

DIAGNOSES += GROUP_DIAGNOSES

# --- Dynamic Tanh (the chapter without normalization, normcore/exercises/dyt.py)
from test_exercises_dyt import DYT_CORRECT, DYT_DIAGNOSES  # noqa: E402 - each chapter's table, appended where it begins

DIAGNOSES += DYT_DIAGNOSES


def _id(case):
    return f"{case[0]}-{case[1].__name__}"


@pytest.mark.parametrize("op, fn, options, keys, words", DIAGNOSES, ids=map(_id, DIAGNOSES))
def test_student_mistake_is_named(op, fn, options, keys, words):
    report = check(op, fn, **options)
    text = str(report)
    assert not report.passed, text
    assert report.kind == "misconception", text
    assert report.misconceptions == keys, text
    assert report.misconception == keys[0]
    for key in keys:
        assert f"[{key}]" in text and CATALOGUE[key].title in text, text
    for w in words:
        assert flat(w) in flat(report.message), text
    assert "What you did:" in text and "Why it is wrong:" in text and "What to change:" in text
    assert report.max_abs_error is not None and report.max_abs_error > 0
    assert "Largest error:" in flat(report.message)
    assert all(len(line) <= 80 for line in report.message.splitlines()), text


def test_every_catalogue_entry_has_a_student_test():
    covered = {k for _, _, _, keys, _ in DIAGNOSES for k in keys}
    assert covered == set(CATALOGUE)


def test_every_op_has_its_catalogue_entries_tested():
    covered = {(op, k) for op, _, _, keys, _ in DIAGNOSES for k in keys}
    for m in CATALOGUE.values():
        # every mistake is tested on at least one of its ops
        assert any((op, m.key) in covered for op in m.ops), m.key


# =======================================================================================
# correct functions pass
# =======================================================================================
CORRECT = [
    ("batch_norm", bn_correct, {}),
    ("layer_norm", ln_correct, {}),
    ("instance_norm", in_correct, {}),
    ("group_norm", gn_correct, {}),
    ("running_update", running_correct, {}),
    ("running_update", running_correct_in_place, {}),
    ("batch_norm_backward", bwd_correct, {}),
    ("weight_standardize", ws_original, {}),
    ("weight_standardize", ws_bit, {"convention": "bit"}),
    ("weight_standardize", ws_bit, {"convention": "timm"}),
    ("batch_norm", bn_correct, {"ndims": (4,), "seed": 3}),
    ("fold_bn", fold_correct, {}),
    ("fold_bn", fold_correct, {"ndims": (2, 3, 4)}),
    ("chan_merge", chan_correct, {}),
    ("group_norm_backward", gn_bwd_correct, {}),
] + ADAIN_CORRECT + DYT_CORRECT


@pytest.mark.parametrize("op", list(ex.OPS))
def test_reference_passes(op):
    report = check(op, ex.reference(op))
    assert report.passed and report.kind == "pass", str(report)
    assert report.misconception is None and report.misconceptions == ()
    assert str(report).startswith(f"{op}: correct.")


@pytest.mark.parametrize("convention", ["original", "bit", "timm"])
def test_reference_passes_every_ws_convention(convention):
    fn = ex.reference("weight_standardize", convention)
    assert check("weight_standardize", fn, convention=convention).passed


@pytest.mark.parametrize("op, fn, options", CORRECT, ids=[f"{c[0]}-{c[1].__name__}-{i}"
                                                          for i, c in enumerate(CORRECT)])
def test_student_correct_passes(op, fn, options):
    report = check(op, fn, **options)
    assert report.passed, str(report)
    assert report.max_abs_error < 1e-3


def test_the_same_mistake_passes_under_another_convention():
    # the BiT formula is right for "bit" and "timm", and a misconception for "original"
    assert check("weight_standardize", ws_bit, convention="bit").passed
    assert not check("weight_standardize", ws_bit).passed


# =======================================================================================
# the checker's own variants are told apart (self-consistency of the catalogue)
# =======================================================================================
def _variant_as_student(spec, cases, base, cand, refs):
    """A "student" whose function is the variant ``cand``: it finds the set it is called on
    by all its tensors (a hidden set can share ``dy`` with another and differ in ``x``)."""
    def fn(*args):
        given = [a for a in args if isinstance(a, torch.Tensor)]
        for c, ref in zip(cases, refs):
            mine = [v for v in c.args.values() if isinstance(v, torch.Tensor)]
            if len(mine) == len(given) and all(
                    a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
                    for a, b in zip(given, mine)):
                out = spec.evaluate(cand.spec(base), c) or ref
                return out[0] if len(out) == 1 else out
        raise AssertionError("unknown input")
    return fn


# the WS entries that only make sense for the other conventions
_NOT_FOR = {"original": {"unbiased_var", "eps_outside_sqrt"},
            "bit": {"biased_var", "eps_inside_sqrt"}}
_WS_OPS = ("weight_standardize", "weight_standardize_backward", "fold_ws")
VARIANT_RUNS = [(op, {}) for op in ex.OPS] + [(op, {"convention": "bit"}) for op in _WS_OPS]


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("op, options", VARIANT_RUNS,
                         ids=[f"{op}-{o.get('convention', '')}" for op, o in VARIANT_RUNS])
def test_every_variant_is_diagnosed_as_itself(op, options, hidden):
    spec = ex._OPS[op]
    p = plan(op, options, hidden=hidden)
    cases, base, refs, o = p.cases, p.base, p.refs, p.options
    cands = [c for c, _ in _distinct_candidates(spec, base, cases, refs, o)]
    keys = {k for c in cands for k in c.keys}
    expected = {m.key for m in ex.catalogue(op)}
    if op in _WS_OPS:
        expected -= _NOT_FOR[o["convention"]]
    if op == "fold_ws" and o["convention"] == "original":
        expected.add("eps_outside_sqrt")     # BatchNorm's eps, whatever the WS convention
    assert keys == expected, "every entry of the op is reachable on the test sets"
    for cand in cands:
        student = _variant_as_student(spec, cases, base, cand,
                                      [spec.reference(c) for c in cases])
        report = check(op, student, hidden=hidden, **options)
        assert report.misconceptions == cand.keys, (cand, str(report))


def test_large_mean_set_breaks_the_naive_variance_and_not_the_reference():
    spec = ex._OPS["batch_norm"]
    o = spec.parse_options({})
    big = next(c for c in spec.cases(o) if c.kind == "largemean")
    x = big.args["x"]
    assert x.dtype == torch.float32
    dims = bn_dims(x)
    naive = (x * x).mean(dims) - x.mean(dims) ** 2
    assert torch.equal(naive, torch.zeros_like(naive))  # every digit lost, deterministically
    true = x.double().var(dims, unbiased=False)
    assert bool((true > 0.05).all())
    assert torch.allclose(x.var(dims, unbiased=False).double(), true, rtol=1e-5)


# =======================================================================================
# everything else a student function can do wrong
# =======================================================================================
def garbage(x, gamma, beta, eps):
    return torch.tanh(x) * 2 + 1


def test_garbage_is_no_known_misconception():
    report = check("batch_norm", garbage)
    text = str(report)
    assert not report.passed and report.kind == "unknown" and report.misconception is None
    assert "does not match any known misconception" in flat(text)
    assert "Largest error:" in flat(text) and "sample" in flat(text) and "channel" in flat(text)
    assert "Test sets:" in flat(text)


def test_unknown_error_says_where():
    def one_channel_off(x, gamma, beta, eps):
        y = bn_correct(x, gamma, beta, eps)
        y[:, 1] += 0.5
        return y
    report = check("batch_norm", one_channel_off)
    assert report.kind == "unknown"
    assert "channel(s) 1 of" in flat(report.message)
    assert report.max_abs_error == pytest.approx(0.5, rel=1e-3)


def test_unknown_backward_says_which_output_is_wrong():
    def dx_scaled(dy, x, gamma, eps):
        dx, dg, db = bwd_correct(dy, x, gamma, eps)
        return 1.5 * dx, dg, db
    report = check("batch_norm_backward", dx_scaled)
    assert report.kind == "unknown"
    assert "Wrong: dx. Right: dgamma, dbeta." in flat(report.message)


def test_wrong_shape():
    report = check("batch_norm", lambda x, g, b, eps: bn_correct(x, g, b, eps).mean(0))
    assert report.kind == "shape" and not report.passed
    assert "shape (3,)" in flat(report.message) and "must have shape (4, 3)" in flat(report.message)


def test_wrong_shape_of_running_stats():
    def keepdim(rm, rv, x, m):
        new_m, new_v = running_correct(rm, rv, x, m)
        return new_m.view(1, -1), new_v
    report = check("running_update", keepdim)
    assert report.kind == "shape"
    assert "new_running_mean of shape (1, 3)" in flat(report.message)
    assert "one value per channel" in flat(report.message)


def test_wrong_dtype():
    report = check("batch_norm", lambda x, g, b, eps: bn_correct(x, g, b, eps).float())
    assert report.kind == "dtype"
    assert "float32 for a float64 input" in flat(report.message)


def test_exception_is_reported_with_type_and_message():
    def hardcoded_4d(x, gamma, beta, eps):
        N, C, H, W = x.shape
        return x
    report = check("batch_norm", hardcoded_4d)
    assert report.kind == "exception" and not report.passed
    assert "ValueError" in flat(report.message)
    assert "not enough values to unpack" in flat(report.message)
    assert "f(x, gamma, beta, eps)" in flat(report.message)
    assert "(4, 3)" in flat(report.message)  # which input it failed on
    # restricted to 4-D inputs the same function runs (and is then wrong, not crashing)
    assert check("batch_norm", hardcoded_4d, ndims=(4,)).kind == "unknown"


def test_nan_is_reported():
    def sqrt_of_negative(x, gamma, beta, eps):
        mean, var = bn_stats(x)
        return per_channel(gamma, x) * (x - mean) / torch.sqrt(var - 0.5) + per_channel(beta, x)
    report = check("batch_norm", sqrt_of_negative)
    assert report.kind == "nan"
    assert "NaN or inf" in flat(report.message) and "eps" in flat(report.message)


def test_returning_none_or_a_tuple():
    r = check("layer_norm", lambda x, g, b, eps: None)
    assert r.kind == "type" and "forget the return" in flat(r.message)
    r = check("layer_norm", lambda x, g, b, eps: (ln_correct(x, g, b, eps), 0))
    assert r.kind == "type" and "not a tuple" in flat(r.message)
    r = check("running_update", lambda rm, rv, x, m: rm)
    assert r.kind == "type" and "(new_running_mean, new_running_var)" in flat(r.message)


# =======================================================================================
# deterministic, plain text, no side effects
# =======================================================================================
@pytest.mark.parametrize("op, fn", [("batch_norm", bn_unbiased), ("batch_norm", garbage),
                                    ("group_norm", gn_strided),
                                    ("batch_norm_backward", bwd_no_var_term),
                                    ("batch_norm", bn_std_plus_eps)])
def test_messages_are_deterministic(op, fn):
    a, b = str(check(op, fn)), str(check(op, fn))
    assert a == b
    assert "0x" not in a  # no addresses
    assert repr(check(op, fn)) == a


def test_report_is_plain_text_only():
    report = check("batch_norm", bn_unbiased)
    assert not hasattr(report, "_repr_html_") and not hasattr(report, "_repr_markdown_")
    assert all(len(line) <= 80 for line in report.message.splitlines())  # the page column


def test_bn_chapter_example():
    # the report the BatchNorm chapter prints
    text = str(check("batch_norm", bn_unbiased))
    assert text.splitlines()[0] == ("batch_norm: not correct. Diagnosis: unbiased variance in "
                                    "the normalization [unbiased_var]")
    assert "Largest error: 0.309 in set A (x of shape (4, 3), float64)" in flat(text)


def test_no_global_rng_side_effects():
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    check("group_norm", gn_strided)
    check("batch_norm", garbage)
    assert torch.equal(state, torch.get_rng_state())


def test_seed_changes_the_inputs_not_the_diagnosis():
    a, b = check("batch_norm", bn_unbiased, seed=0), check("batch_norm", bn_unbiased, seed=7)
    assert a.misconception == b.misconception == "unbiased_var"
    assert a.max_abs_error != b.max_abs_error


# =======================================================================================
# API details
# =======================================================================================
def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown op"):
        check("batchnorm", bn_correct)
    with pytest.raises(TypeError, match="unknown option"):
        check("batch_norm", bn_correct, sed=1)
    with pytest.raises(ValueError, match="ndims"):
        check("instance_norm", in_correct, ndims=(2,))
    with pytest.raises(ValueError, match="convention"):
        check("weight_standardize", ws_original, convention="paper")
    with pytest.raises(TypeError, match="callable"):
        check("batch_norm", 3)


def test_catalogue_table():
    table = ex.catalogue_table()
    for key in CATALOGUE:
        assert key in table
    assert {m.key for m in ex.catalogue("running_update")} == {
        "naive_var", "biased_running_var", "momentum_swapped"}
    assert "strided_groups" in ex.catalogue_table("group_norm")
    assert "strided_groups" not in ex.catalogue_table("batch_norm")
    for m in CATALOGUE.values():
        assert set(m.ops) <= set(ex.OPS), m.key


def test_signatures():
    assert ex.signature("group_norm") == "f(x, num_groups, gamma, beta, eps)"
    assert ex.signature("batch_norm_backward") == "f(dy, x, gamma, eps)"
