"""The catalogue of known mistakes, as data: a key, a plain-words name, and the prose.

Each :class:`Misconception` says what the student did, why it is wrong and what to change,
as templates whose ``{fields}`` the op that diagnosed it fills in (its ``context`` hook and
its ``render_fields`` hook, see :class:`normcore.exercises.ops.Op`).  Which ops can name a
mistake is not written here: each op lists the keys it can diagnose
(``Op.misconceptions``), and :func:`normcore.exercises.ops.register` fills in
:attr:`Misconception.ops`, so that an op family added in its own module can reuse these
entries (and :func:`add` new ones) without editing this file.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Misconception:
    """One known mistake.  ``did``/``why``/``fix`` are templates filled per op.

    ``title`` is the plain-words name a report and a teacher's summary show;
    ``description`` is the one-line summary of :func:`normcore.exercises.catalogue_table`;
    ``ops`` the ops that can diagnose it (filled in as ops register).
    ``defaults`` fills the template fields an op does not give (the words of the op the
    entry was first written for); a default may use the op's fields itself.
    """

    key: str
    title: str
    description: str
    did: str
    why: str
    fix: str
    ops: tuple[str, ...] = ()
    defaults: dict = dataclasses.field(default_factory=dict, hash=False)

    def render(self, fields: dict) -> tuple[str, str, str]:
        """``(did, why, fix)`` with the op's template fields filled in."""
        fields = {**{k: v.format(**fields) for k, v in self.defaults.items() if k not in fields},
                  **fields}
        return self.did.format(**fields), self.why.format(**fields), self.fix.format(**fields)


#: BatchNorm's words for the formula of dx, the defaults of the backward entries (an op
#: whose gamma varies inside a set, such as GroupNorm, gives its own).
BATCH_NORM_DX = {
    "dx_full": "`dx = gamma / sqrt(var + eps) * (dy - mean(dy) - x_hat * mean(dy * x_hat))`, "
               "with the means over {sum_dims} of each channel",
    "mean_term": "mean(dy)",
    "var_term": "x_hat * mean(dy * x_hat)",
    "per_set": "per channel",
}


_ENTRIES = [
    Misconception(
        "wrong_axes", "statistics over the wrong axes",
        "mean and variance reduced over the wrong dims (BN over N only, LN over H, W as in "
        "IN, IN over C, H, W as in LN, ...); says which dims were used and which are right",
        "You computed each mean and variance over {got}{other}, but {norm} computes them "
        "over {want}.",
        "{axes_why}",
        "Reduce over {want}: {axes_fix}."),
    Misconception(
        "group_size_as_num_groups", "num_groups used as the group size",
        "groups of num_groups channels (C // G groups) instead of G groups of C // G channels",
        "You made groups of num_groups channels, i.e. C // num_groups groups, instead of "
        "num_groups groups of C // num_groups channels: for C = {C} and num_groups = {G} you "
        "used {CG} groups of {G} channels.",
        "num_groups is the number of groups; each group holds C // num_groups consecutive "
        "channels.",
        "Put the group count first when you reshape: `x.view(N, num_groups, -1)`, then reduce "
        "over the last dim."),
    Misconception(
        "strided_groups", "strided instead of contiguous channel groups",
        "channel c put in group c % G (channels 0, G, 2G, ... together) instead of c // (C/G)",
        "You put channel c in group c % num_groups (channels 0, G, 2G, ... share statistics), "
        "as `x.view(N, C // G, G, ...)` with a reduction over dim 1 does.",
        "GroupNorm's groups are blocks of C // G consecutive channels: group 0 is channels "
        "0 .. C/G - 1, group 1 the next C/G channels, and so on (the GN paper and "
        "torch.nn.GroupNorm both do this).",
        "Reshape as `x.view(N, G, C // G, ...)`, group index first, and reduce over the "
        "channels of the group and the positions."),
    Misconception(
        "affine_per_group", "gamma and beta per group instead of per channel",
        "one gamma/beta per group (e.g. gamma[g] for every channel of group g) instead of one "
        "per channel",
        "You applied one gamma and one beta per group instead of one per channel: {pick}.",
        "GroupNorm shares the mean and variance within a group, but gamma and beta have one "
        "entry per channel (shape (C,)), as in BatchNorm.",
        "Reshape the normalized values back to x.shape first, then apply gamma and beta per "
        "channel: `y = x_hat * gamma.view(1, C, 1, ...) + beta.view(1, C, 1, ...)`."),
    Misconception(
        "unbiased_var", "unbiased variance in the normalization",
        "normalized with the unbiased variance (divide by n - 1, torch.var's default) instead "
        "of the biased one (divide by n)",
        "You normalized with the unbiased variance, dividing the sum of squared deviations by "
        "n - 1 (torch.var and torch.std do this unless told otherwise).",
        "{unbiased_why}",
        "Use `x.var(dim=..., unbiased=False)` (or `correction=0`), or "
        "`((x - mean) ** 2).mean(dim=...)`."),
    Misconception(
        "biased_var", "biased std in the original Weight Standardization",
        "WS 'original' convention: divided by the biased std (n) instead of the unbiased one",
        "You divided by the biased std (dividing the sum of squared deviations by n).",
        "The original Weight Standardization code (Qiao et al. 2019, the 'original' convention "
        "here) uses `w.std(dim=1)`, the unbiased std (n - 1), plus eps: "
        "`(w - mean) / (std + eps)`.",
        "Use `w.std(dim=..., keepdim=True)`, which is unbiased by default (`correction=1`)."),
    Misconception(
        "eps_outside_sqrt", "eps added to the std instead of the variance",
        "(x - mean) / (std + eps) instead of (x - mean) / sqrt(var + eps)",
        "You added eps to the standard deviation: `(x - mean) / (std + eps)`.",
        "{norm} divides by `sqrt(var + eps)`: eps goes inside the square root. The two differ "
        "when the variance is small: for var = 1e-8 and eps = 1e-3, sqrt(var + eps) = 0.0316 "
        "but std + eps = 0.0011.",
        "Compute `(x - mean) / torch.sqrt(var + eps)`."),
    Misconception(
        "eps_inside_sqrt", "eps inside the square root in the original WS",
        "WS 'original' convention: sqrt(var + eps) instead of std + eps",
        "You put eps inside the square root: `(w - mean) / sqrt(var + eps)`.",
        "The original Weight Standardization adds eps to the std, `(w - mean) / (std + eps)`, "
        "as the paper's code does.",
        "Compute `(w - mean) / (w.std(...) + eps)`."),
    Misconception(
        "other_convention", "another Weight Standardization convention",
        "implemented another WS convention (original: unbiased std + eps; BiT/timm: "
        "sqrt(biased var + eps))",
        "You implemented the {other_name} convention, {other_formula}.",
        "This exercise asks for the '{conv}' convention, {conv_formula}. Weight "
        "Standardization has three conventions in use (normcore.functional.WS_CONVENTIONS); "
        "they differ in biased vs unbiased variance and in where eps goes.",
        "Compute {conv_formula}."),
    Misconception(
        "no_eps", "no eps",
        "left eps out: (x - mean) / sqrt(var)",
        "You left eps out: `(x - mean) / sqrt(var)`.",
        "eps keeps the division safe when a set is (nearly) constant: without it a constant "
        "set gives 0/0 = NaN, and a nearly constant one is blown up to unit variance, which "
        "amplifies its noise. Set {eps_case} has such a set.",
        "Divide by `torch.sqrt(var + eps)`{eps_where}, with the eps argument."),
    Misconception(
        "fixed_eps", "eps hard-coded",
        "used eps = 1e-5 whatever the eps argument was",
        "You used eps = 1e-5 whatever the eps argument was.",
        "eps is a parameter of the layer (its eps attribute). Set {eps_case} passes "
        "eps = {eps_value}, and there the results differ.",
        "Use the eps argument of your function."),
    Misconception(
        "naive_var", "variance as E[x^2] - E[x]^2 (catastrophic cancellation)",
        "variance computed as mean of squares minus square of mean, which loses every digit "
        "in float32 when |mean| >> std",
        "You computed the variance as E[x^2] - E[x]^2, the mean of the squares minus the "
        "square of the mean.",
        "That formula cancels catastrophically when the mean is large compared to the spread. "
        "In set {big_case} (float32, values near 4096 with a spread of about 0.4) both terms "
        "are about 16.8 million, float32 keeps about 7 significant digits, and their "
        "difference comes out as 0 instead of about {big_var}.",
        "Subtract the mean first: `var = ((x - mean) ** 2).mean(dim=...)`, or use "
        "`torch.var_mean(x, dim=..., correction=0)`, which is stable."),
    Misconception(
        "no_affine", "gamma and beta not applied",
        "returned x_hat without gamma * x_hat + beta",
        "You returned the normalized values x_hat without applying gamma and beta.",
        "{norm} ends with `y = gamma * x_hat + beta`, a learnable affine map, so that the "
        "network can undo the normalization where that helps.",
        "Return `gamma * x_hat + beta`, {affine_hint}."),
    Misconception(
        "biased_running_var", "biased variance stored in running_var",
        "stored the biased batch variance (divide by n) in running_var instead of the "
        "unbiased one",
        "You stored the biased batch variance (divided by n) in running_var.",
        "PyTorch stores the unbiased variance (divided by n - 1) in running_var: it estimates "
        "the variance of the whole data, for eval mode. Only the normalization of the "
        "current batch uses the biased one. Here n = N * H * W, the values per channel.",
        "Update running_var with `var_biased * n / (n - 1)`, or with "
        "`x.var(dim=..., unbiased=True)`."),
    Misconception(
        "momentum_swapped", "momentum applied the wrong way round",
        "r <- m * r + (1 - m) * s instead of r <- (1 - m) * r + m * s",
        "You applied momentum the wrong way round: `r <- m * r + (1 - m) * s`.",
        "In PyTorch, momentum is the weight of the new batch statistic: "
        "`r <- (1 - m) * r + m * s` (the opposite of an optimizer's momentum). With the "
        "default m = 0.1 the running statistics move 10% of the way towards each batch.",
        "`running = (1 - momentum) * running + momentum * batch_stat`."),
    Misconception(
        "backward_stats_constant", "mean and variance treated as constants",
        "dx = dy * gamma / sqrt(var + eps): the paths through the batch mean and variance are "
        "missing",
        "Your dx is `dy * gamma / sqrt(var + eps)`: you treated the {stats_name} as "
        "constants.",
        "{stats_from_x}, so each x_i changes them too, and those two paths add two terms: "
        "{dx_full}.{constants_note}",
        "Subtract `{mean_term}` and `{var_term}`, {per_set}, before scaling.",
        defaults={"stats_name": "batch mean and variance",
                  "stats_from_x": "In training mode the mean and variance are computed from x",
                  "constants_note": " (Treating them as constants is right only in eval "
                                    "mode.)", **BATCH_NORM_DX}),
    Misconception(
        "backward_no_var_grad", "the gradient through the variance dropped",
        "dx = gamma / sqrt(var + eps) * (dy - mean(dy)): the x_hat * mean(dy * x_hat) term "
        "is missing",
        "Your dx is `{dx_no_var}`: it has the term from the mean but not the one from the "
        "variance.",
        "The variance depends on x as well; its path contributes `-{var_term}`. The full "
        "formula is {dx_full}.",
        "Also subtract `{var_term}` ({per_set}).",
        defaults={"dx_no_var": "gamma / sqrt(var + eps) * (dy - mean(dy))", **BATCH_NORM_DX}),
    Misconception(
        "backward_no_mean_grad", "the gradient through the mean dropped",
        "dx = gamma / sqrt(var + eps) * (dy - x_hat * mean(dy * x_hat)): the mean(dy) term is "
        "missing",
        "Your dx is `{dx_no_mean}`: it has the term from the variance but not the one from "
        "the mean.",
        "The mean depends on every x_i; its path contributes `-{mean_term}`. The full formula "
        "is {dx_full}.",
        "Also subtract `{mean_term}` ({per_set}).",
        defaults={"dx_no_mean": "gamma / sqrt(var + eps) * (dy - x_hat * mean(dy * x_hat))",
                  **BATCH_NORM_DX}),
    Misconception(
        "dgamma_uses_x", "dgamma from x instead of x_hat",
        "dgamma = sum(dy * x) instead of sum(dy * x_hat)",
        "You computed dgamma as the sum of `dy * x`, with the raw input x.",
        "`y = gamma * x_hat + beta`, so the derivative of y with respect to gamma is x_hat, the "
        "normalized input.",
        "`dgamma = (dy * x_hat).sum(...)` over {sum_dims}."),
    Misconception(
        "dx_without_gamma", "gamma missing from dx",
        "dx lacks the factor gamma",
        "Your dx lacks the factor gamma.",
        "`y = gamma * x_hat + beta`, so the gradient that reaches x_hat is `dy * gamma`: "
        "{gamma_in_dx}.",
        "Use `dy * gamma.view(1, -1, 1, ...)` in place of dy in the formula for dx.",
        defaults={"gamma_in_dx": "all of dx is scaled by gamma, per channel"}),
]


#: key -> :class:`Misconception`, in catalogue order (the order of the instructor's table).
CATALOGUE: dict[str, Misconception] = {m.key: m for m in _ENTRIES}
del _ENTRIES


def add(misconception: Misconception) -> Misconception:
    """Add a new entry (for an op family's own mistakes); its key must be new."""
    if misconception.key in CATALOGUE:
        raise ValueError(f"misconception {misconception.key!r} is already in the catalogue")
    CATALOGUE[misconception.key] = misconception
    return misconception


def _add_op(key: str, op: str) -> None:
    """Record that ``op`` can diagnose ``key`` (called when an op registers)."""
    if key not in CATALOGUE:
        raise ValueError(f"op {op!r} names {key!r}, which is not in the catalogue; "
                         f"add it with catalogue.add(Misconception(...))")
    entry = CATALOGUE[key]
    if op not in entry.ops:
        CATALOGUE[key] = dataclasses.replace(entry, ops=entry.ops + (op,))
