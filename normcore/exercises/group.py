"""Checker op of GroupNorm's backward pass: ``group_norm_backward``.

``f(dy, x, num_groups, gamma, eps) -> (dx, dgamma, dbeta)`` of GroupNorm, ``x`` of shape
``(N, C, *)``, gamma ``(C,)``.  It is BatchNorm's backward op
(:class:`~normcore.exercises.backward.BatchNormBackwardOp`) with GroupNorm's set and
three more knobs: the channel order of the groups (strided: channel c in group c % G),
gamma outside the sums of dx (BatchNorm's form, wrong here since gamma varies inside a
group), and dgamma or dbeta summed over the whole group instead of over the channel.
Every mistake is still autograd through :func:`normcore.functional.normalize` with knobs
turned.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as TF

from .. import functional
from .backward import BatchNormBackwardOp, autograd_grads
from .catalogue import Misconception, add as _add
from .forward import strided_order
from .ops import register
from .report import shape_text
from .variants import variant

_add(Misconception(
    "affine_grad_per_group", "dgamma or dbeta summed per group instead of per channel",
    "GroupNorm backward: each channel's dgamma or dbeta summed over all C // G channels of "
    "its group (the group's total, given to each of its channels) instead of over the "
    "channel alone",
    "You gave every channel of a group the group's total: {which}, summed over every "
    "channel of c's group and every sample and position.",
    "The statistics are shared by a group, but gamma and beta are not: gamma_c and beta_c "
    "belong to channel c alone (shape (C,)), and y = gamma_c * x_hat + beta_c touches only "
    "the elements of channel c. So their gradients sum over channel c's elements: every "
    "sample and position, {sum_dims}, and no other channel.",
    "Reshape x_hat back to x's shape first, then sum per channel: `dgamma = (dy * x_hat)"
    ".sum(dim=dims)` and `dbeta = dy.sum(dim=dims)` with `dims = (0, *range(2, x.dim()))`."))

#: What ``affine_grad_per_group`` says for each output summed per group.
PER_GROUP_WHICH = {
    "both": "dgamma[c] = sum of dy * x_hat and dbeta[c] = sum of dy",
    "dgamma": "dgamma[c] = sum of dy * x_hat",
    "dbeta": "dbeta[c] = sum of dy",
}

#: GroupNorm's words in the backward entries written for BatchNorm (their ``defaults``):
#: gamma varies inside a set, so it stays inside the means of dx.
GROUP_DX = {
    "stats_name": "mean and variance of each group",
    "stats_from_x": "GroupNorm computes the mean and variance of each group from x (in "
                    "training and in eval mode alike)",
    "constants_note": "",
    "dx_full": "`dx = r * (d - mean(d) - x_hat * mean(d * x_hat))` with d = gamma * dy, "
               "r = 1 / sqrt(var + eps), and the means over the set of each element (its "
               "sample's group of C // G channels, at every position); gamma stays inside "
               "the means, as it differs between the channels of a group",
    "mean_term": "mean(d)",
    "var_term": "x_hat * mean(d * x_hat)",
    "per_set": "per sample and group",
    "dx_no_var": "(gamma * dy - mean(gamma * dy)) / sqrt(var + eps)",
    "dx_no_mean": "(gamma * dy - x_hat * mean(gamma * dy * x_hat)) / sqrt(var + eps)",
    "gamma_in_dx": "every term of dx is made of it, the two means over the group included, "
                   "each element with the gamma of its own channel",
    "gamma_per_set": "one entry per channel, and a set holds the C // G channels of a group",
}


def per_group_total(t: torch.Tensor, num_groups: int) -> torch.Tensor:
    """A ``(C,)`` tensor summed over each group of C // G channels, the total given to
    every channel of the group."""
    size = t.shape[0] // num_groups
    return t.view(num_groups, size).sum(1).repeat_interleave(size)


class GroupNormBackwardOp(BatchNormBackwardOp):
    name = "group_norm_backward"
    abbr = "GN-bwd"
    norm = "group"
    call_text = "f(dy, x, num_groups, gamma, eps)"
    misconceptions = ("wrong_axes", "strided_groups", "unbiased_var", "backward_stats_constant",
                      "backward_no_var_grad", "backward_no_mean_grad", "dgamma_uses_x",
                      "dx_without_gamma", "ln_backward_gamma_outside", "affine_grad_per_group")
    # input rank -> (shape, num_groups): at least 2 groups of at least 2 channels, so that
    # LN's set (G = 1), IN's (one channel), the strided groups and the per-group sums
    # all differ from GN's; gamma (uniform in [0.5, 2]) differs between a group's channels
    shapes = {2: ((4, 6), 3), 3: ((2, 6, 4), 2), 4: ((2, 6, 2, 3), 3)}
    shapes32 = {2: ((4, 8), 4), 3: ((3, 8, 4), 2), 4: ((2, 8, 2, 3), 4)}

    def _entry(self, table, ndim):
        return table[ndim]

    def solution(self, options):
        def group_norm_backward(dy, x, num_groups, gamma, eps):
            return autograd_grads(lambda x, w, b: functional.group_norm(
                x, num_groups, w, b, eps), dy, x, gamma)
        return group_norm_backward

    def call(self, fn, case):
        a = case.args
        return fn(a["dy"].clone(), a["x"].clone(), case.groups, a["gamma"].clone(), case.eps)

    def call_hint(self, options):
        return super().call_hint(options).rstrip(".") + ", and num_groups a divisor of C."

    def torch_kernels(self, case):
        a = case.args
        return [autograd_grads(lambda x, w, b: TF.group_norm(x, case.groups, w, b, case.eps),
                               a["dy"], a["x"], a["gamma"])]

    # ---- variants -----------------------------------------------------------------------
    def base_spec(self, options):
        return {**super().base_spec(options), "order": "contiguous", "dgamma_sum": "channel",
                "dbeta_sum": "channel"}

    def candidates(self, options, cases):
        return [variant("strided_groups", {"order": "strided"})] \
            + super().candidates(options, cases) + [
            variant("ln_backward_gamma_outside", {"dx_gamma": "outside"}),
            variant("affine_grad_per_group", {"dgamma_sum": "group", "dbeta_sum": "group"},
                    which="both"),
            variant("affine_grad_per_group", {"dgamma_sum": "group"}, which="dgamma"),
            variant("affine_grad_per_group", {"dbeta_sum": "group"}, which="dbeta"),
        ]

    def evaluate(self, spec, case):
        a, G = case.args, case.groups
        if spec["order"] == "contiguous":
            out = super().evaluate(spec, case)
        else:   # GroupNorm of the channels reordered so that the strided groups are contiguous
            order = strided_order(case.shape[1], G)
            back = torch.argsort(order)
            shuffled = {**a, "dy": a["dy"][:, order], "x": a["x"][:, order],
                        "gamma": a["gamma"][order]}
            out = super().evaluate(spec, dataclasses.replace(case, args=shuffled))
            if out is not None:
                out = (out[0][:, back], out[1][back], out[2][back])
        if out is None:
            return None
        dx, dgamma, dbeta = out
        if spec["dgamma_sum"] == "group":
            dgamma = per_group_total(dgamma, G)
        if spec["dbeta_sum"] == "group":
            dbeta = per_group_total(dbeta, G)
        return (dx, dgamma, dbeta)

    # ---- words --------------------------------------------------------------------------
    def context(self, options, cases):
        ctx = super().context(options, cases)
        shown = self.display_case(cases)
        shape, G = shown.shape, shown.groups
        ctx.update(GROUP_DX)
        ctx["axes_fix"] = (f"view x, dy and x_hat as `(N, num_groups, -1)` (here "
                           f"{shape_text((shape[0], G, -1))}) and take every mean of dx over "
                           f"the last dim, with keepdim=True")
        return ctx

    def render_fields(self, context, key, detail):
        if key == "affine_grad_per_group":
            return {"which": PER_GROUP_WHICH[detail["which"]]}
        return super().render_fields(context, key, detail)


register(GroupNormBackwardOp())
