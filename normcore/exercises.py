r"""Exercise checkers: run a student's function next to the reference and name the mistake.

A checker does not only say "wrong".  It reruns the computation the way common mistakes
would do it, and tells the student *which* mistake their numbers show::

    >>> from normcore import exercises
    >>> def my_bn(x, gamma, beta, eps):
    ...     dims = [0] + list(range(2, x.dim()))
    ...     mean = x.mean(dim=dims, keepdim=True)
    ...     var = x.var(dim=dims, keepdim=True)          # unbiased by default!
    ...     shape = [1, -1] + [1] * (x.dim() - 2)
    ...     return gamma.view(shape) * (x - mean) / torch.sqrt(var + eps) + beta.view(shape)
    >>> print(exercises.check("batch_norm", my_bn))          # doctest: +SKIP
    batch_norm: not correct. Diagnosis: unbiased variance in the normalization [unbiased_var]
    What you did: You normalized with the unbiased variance, dividing the sum of squared
      deviations by n - 1 (torch.var and torch.std do this unless told otherwise).
    Why it is wrong: BatchNorm normalizes with the biased variance, the plain mean of the
      squared deviations (divide by n): it describes the values being normalized. The
      unbiased (n - 1) variance only goes into running_var, as an estimate for eval mode.
      The difference is largest for small sets: for n = 4 the std differs by 15%.
    What to change: Use `x.var(dim=..., unbiased=False)` (or `correction=0`), or
      `((x - mean) ** 2).mean(dim=...)`.
    Largest error: 0.309 in set A (x of shape (4, 3), float64), at sample 3, channel 2.

How it works
------------
1. :func:`check` builds a few seeded inputs (*test sets*), chosen so that the mistakes
   separate: small sets (biased and unbiased variance differ by 15% for n = 4), channels with
   different means and scales (reducing over the wrong axes changes the numbers), one set
   with a nearly constant channel and a large ``eps`` (only there does ``eps`` matter), and
   one float32 set with a large mean and a small spread (only there does
   :math:`E[x^2]-E[x]^2` fail).
2. It calls the student's function and the reference (:mod:`normcore.functional`) on each,
   and reports an exception, a wrong type, shape or dtype, or NaN before comparing values.
3. If the values differ, it evaluates every entry of the *catalogue* of known mistakes on the
   same inputs, and reports the one the student's output matches (then every pair of them,
   since "unbiased variance **and** eps outside the square root" is one line,
   ``(x - m) / (x.std(0) + eps)``).

The catalogue is not a second implementation of the norms.  Each mistake is a change of
one knob of the primitives: another reduce set (a :class:`~normcore.axes.Layout` from
:func:`normcore.axes.layout` with other ``reduce_dims``, or another norm's layout),
``correction`` and ``eps_mode`` of :func:`normcore.functional.normalize`, the variance from
:func:`normcore.stats.var_naive`, the running update from :func:`normcore.stats.ema_update_`
with the factor swapped, or autograd through ``normalize`` with the statistics detached.

Operations and the student's function
-------------------------------------
========================  =============================================================
op                        the student writes
========================  =============================================================
``batch_norm``            ``f(x, gamma, beta, eps) -> y``; training mode (batch
                          statistics); ``x`` is ``(N, C)``, ``(N, C, L)`` or
                          ``(N, C, H, W)``; gamma, beta ``(C,)``
``layer_norm``            ``f(x, gamma, beta, eps) -> y``; over every dim but the first;
                          gamma, beta have shape ``x.shape[1:]``
``instance_norm``         ``f(x, gamma, beta, eps) -> y``; ``x`` is ``(N, C, L)`` or
                          ``(N, C, H, W)``; gamma, beta ``(C,)``
``group_norm``            ``f(x, num_groups, gamma, beta, eps) -> y``; ``x`` is
                          ``(N, C, *)``; gamma, beta ``(C,)``
``running_update``        ``f(running_mean, running_var, x, momentum) ->
                          (new_running_mean, new_running_var)``: BatchNorm's buffers
                          in training (unbiased variance stored,
                          ``r <- (1 - m) r + m s``); ``x`` is ``(N, C)`` or ``(N, C, H, W)``
``batch_norm_backward``   ``f(dy, x, gamma, eps) -> (dx, dgamma, dbeta)`` of training-mode
                          BatchNorm
``weight_standardize``    ``f(w, eps) -> w_hat`` for a conv weight ``(C_out, C_in, kH, kW)``;
                          option ``convention=`` ``"original"`` (default), ``"bit"`` or
                          ``"timm"`` (:data:`normcore.functional.WS_CONVENTIONS`)
========================  =============================================================

Options of :func:`check`: ``seed`` (default 0) changes the inputs; ``ndims`` restricts the
input ranks (e.g. ``ndims=(4,)`` for an exercise that only asks for ``(N, C, H, W)``);
``convention`` for ``weight_standardize``.

The report prints as plain text and is deterministic (no addresses, no timings, numbers
rounded to three significant digits), so notebooks can show it under nbval.
"""
from __future__ import annotations

import dataclasses
import math
import textwrap
from dataclasses import dataclass
from typing import Callable

import torch

from . import axes, functional, stats
from .axes import Layout
from .functional import WS_CONVENTIONS, normalize

__all__ = [
    "check", "Report", "Misconception", "CATALOGUE", "OPS", "catalogue", "catalogue_table",
    "print_catalogue", "reference", "signature",
]

#: (rtol, atol) for "matches": the student's numbers against the reference or a variant.
_TOL = {torch.float64: (1e-6, 1e-8), torch.float32: (1e-4, 1e-4)}
_WIDTH = 76  # fits the book's output column
_LARGE_MEAN = 4096.0


# =======================================================================================
# the catalogue: what each mistake is, in words
# =======================================================================================
@dataclass(frozen=True)
class Misconception:
    """One known mistake.  ``did``/``why``/``fix`` are templates filled per op."""

    key: str
    title: str
    ops: tuple[str, ...]
    description: str
    did: str
    why: str
    fix: str

    def render(self, ctx: dict) -> tuple[str, str, str]:
        return self.did.format(**ctx), self.why.format(**ctx), self.fix.format(**ctx)


_FWD = ("batch_norm", "layer_norm", "instance_norm", "group_norm")

_ENTRIES = [
    Misconception(
        "wrong_axes", "statistics over the wrong axes",
        _FWD + ("weight_standardize", "batch_norm_backward"),
        "mean and variance reduced over the wrong dims (BN over N only, LN over H, W as in "
        "IN, IN over C, H, W as in LN, ...); says which dims were used and which are right",
        "You computed each mean and variance over {got}{other}, but {norm} computes them "
        "over {want}.",
        "{axes_why}",
        "Reduce over {want}: {axes_fix}."),
    Misconception(
        "group_size_as_num_groups", "num_groups used as the group size", ("group_norm",),
        "groups of num_groups channels (C // G groups) instead of G groups of C // G channels",
        "You made groups of num_groups channels, i.e. C // num_groups groups, instead of "
        "num_groups groups of C // num_groups channels: for C = {C} and num_groups = {G} you "
        "used {CG} groups of {G} channels.",
        "num_groups is the number of groups; each group holds C // num_groups consecutive "
        "channels.",
        "Put the group count first when you reshape: `x.view(N, num_groups, -1)`, then reduce "
        "over the last dim."),
    Misconception(
        "strided_groups", "strided instead of contiguous channel groups", ("group_norm",),
        "channel c put in group c % G (channels 0, G, 2G, ... together) instead of c // (C/G)",
        "You put channel c in group c % num_groups (channels 0, G, 2G, ... share statistics), "
        "as `x.view(N, C // G, G, ...)` with a reduction over dim 1 does.",
        "GroupNorm's groups are blocks of C // G consecutive channels: group 0 is channels "
        "0 .. C/G - 1, group 1 the next C/G channels, and so on (the GN paper and "
        "torch.nn.GroupNorm both do this).",
        "Reshape as `x.view(N, G, C // G, ...)`, group index first, and reduce over the "
        "channels of the group and the positions."),
    Misconception(
        "affine_per_group", "gamma and beta per group instead of per channel", ("group_norm",),
        "one gamma/beta per group (e.g. gamma[g] for every channel of group g) instead of one "
        "per channel",
        "You applied one gamma and one beta per group instead of one per channel: {pick}.",
        "GroupNorm shares the mean and variance within a group, but gamma and beta have one "
        "entry per channel (shape (C,)), as in BatchNorm.",
        "Reshape the normalized values back to x.shape first, then apply gamma and beta per "
        "channel: `y = x_hat * gamma.view(1, C, 1, ...) + beta.view(1, C, 1, ...)`."),
    Misconception(
        "unbiased_var", "unbiased variance in the normalization",
        _FWD + ("weight_standardize", "batch_norm_backward"),
        "normalized with the unbiased variance (divide by n - 1, torch.var's default) instead "
        "of the biased one (divide by n)",
        "You normalized with the unbiased variance, dividing the sum of squared deviations by "
        "n - 1 (torch.var and torch.std do this unless told otherwise).",
        "{unbiased_why}",
        "Use `x.var(dim=..., unbiased=False)` (or `correction=0`), or "
        "`((x - mean) ** 2).mean(dim=...)`."),
    Misconception(
        "biased_var", "biased std in the original Weight Standardization",
        ("weight_standardize",),
        "WS 'original' convention: divided by the biased std (n) instead of the unbiased one",
        "You divided by the biased std (dividing the sum of squared deviations by n).",
        "The original Weight Standardization code (Qiao et al. 2019, the 'original' convention "
        "here) uses `w.std(dim=1)`, the unbiased std (n - 1), plus eps: "
        "`(w - mean) / (std + eps)`.",
        "Use `w.std(dim=..., keepdim=True)`, which is unbiased by default (`correction=1`)."),
    Misconception(
        "eps_outside_sqrt", "eps added to the std instead of the variance",
        _FWD + ("weight_standardize",),
        "(x - mean) / (std + eps) instead of (x - mean) / sqrt(var + eps)",
        "You added eps to the standard deviation: `(x - mean) / (std + eps)`.",
        "{norm} divides by `sqrt(var + eps)`: eps goes inside the square root. The two differ "
        "when the variance is small: for var = 1e-8 and eps = 1e-3, sqrt(var + eps) = 0.0316 "
        "but std + eps = 0.0011.",
        "Compute `(x - mean) / torch.sqrt(var + eps)`."),
    Misconception(
        "eps_inside_sqrt", "eps inside the square root in the original WS",
        ("weight_standardize",),
        "WS 'original' convention: sqrt(var + eps) instead of std + eps",
        "You put eps inside the square root: `(w - mean) / sqrt(var + eps)`.",
        "The original Weight Standardization adds eps to the std, `(w - mean) / (std + eps)`, "
        "as the paper's code does.",
        "Compute `(w - mean) / (w.std(...) + eps)`."),
    Misconception(
        "other_convention", "another Weight Standardization convention",
        ("weight_standardize",),
        "implemented another WS convention (original: unbiased std + eps; BiT/timm: "
        "sqrt(biased var + eps))",
        "You implemented the {other_name} convention, {other_formula}.",
        "This exercise asks for the '{conv}' convention, {conv_formula}. Weight "
        "Standardization has three conventions in use (normcore.functional.WS_CONVENTIONS); "
        "they differ in biased vs unbiased variance and in where eps goes.",
        "Compute {conv_formula}."),
    Misconception(
        "no_eps", "no eps",
        _FWD + ("weight_standardize",),
        "left eps out: (x - mean) / sqrt(var)",
        "You left eps out: `(x - mean) / sqrt(var)`.",
        "eps keeps the division safe when a set is (nearly) constant: without it a constant "
        "set gives 0/0 = NaN, and a nearly constant one is blown up to unit variance, which "
        "amplifies its noise. Set {eps_case} has such a set.",
        "Divide by `torch.sqrt(var + eps)`{eps_where}, with the eps argument."),
    Misconception(
        "fixed_eps", "eps hard-coded", _FWD,
        "used eps = 1e-5 whatever the eps argument was",
        "You used eps = 1e-5 whatever the eps argument was.",
        "eps is a parameter of the layer (its eps attribute). Set {eps_case} passes "
        "eps = {eps_value}, and there the results differ.",
        "Use the eps argument of your function."),
    Misconception(
        "naive_var", "variance as E[x^2] - E[x]^2 (catastrophic cancellation)",
        _FWD + ("running_update",),
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
        "no_affine", "gamma and beta not applied", _FWD,
        "returned x_hat without gamma * x_hat + beta",
        "You returned the normalized values x_hat without applying gamma and beta.",
        "{norm} ends with `y = gamma * x_hat + beta`, a learnable affine map, so that the "
        "network can undo the normalization where that helps.",
        "Return `gamma * x_hat + beta`, {affine_hint}."),
    Misconception(
        "biased_running_var", "biased variance stored in running_var", ("running_update",),
        "stored the biased batch variance (divide by n) in running_var instead of the "
        "unbiased one",
        "You stored the biased batch variance (divided by n) in running_var.",
        "PyTorch stores the unbiased variance (divided by n - 1) in running_var: it estimates "
        "the variance of the whole data, for eval mode. Only the normalization of the "
        "current batch uses the biased one. Here n = N * H * W, the values per channel.",
        "Update running_var with `var_biased * n / (n - 1)`, or with "
        "`x.var(dim=..., unbiased=True)`."),
    Misconception(
        "momentum_swapped", "momentum applied the wrong way round", ("running_update",),
        "r <- m * r + (1 - m) * s instead of r <- (1 - m) * r + m * s",
        "You applied momentum the wrong way round: `r <- m * r + (1 - m) * s`.",
        "In PyTorch, momentum is the weight of the new batch statistic: "
        "`r <- (1 - m) * r + m * s` (the opposite of an optimizer's momentum). With the "
        "default m = 0.1 the running statistics move 10% of the way towards each batch.",
        "`running = (1 - momentum) * running + momentum * batch_stat`."),
    Misconception(
        "backward_stats_constant", "mean and variance treated as constants",
        ("batch_norm_backward",),
        "dx = dy * gamma / sqrt(var + eps): the paths through the batch mean and variance are "
        "missing",
        "Your dx is `dy * gamma / sqrt(var + eps)`: you treated the batch mean and variance as "
        "constants.",
        "In training mode the mean and variance are computed from x, so each x_i changes "
        "them too, and those two paths add two terms: `dx = gamma / sqrt(var + eps) * "
        "(dy - mean(dy) - x_hat * mean(dy * x_hat))`, with the means over {sum_dims} of each "
        "channel. (Treating them as constants is right only in eval mode.)",
        "Subtract `mean(dy)` and `x_hat * mean(dy * x_hat)`, per channel, before scaling."),
    Misconception(
        "backward_no_var_grad", "the gradient through the variance dropped",
        ("batch_norm_backward",),
        "dx = gamma / sqrt(var + eps) * (dy - mean(dy)): the x_hat * mean(dy * x_hat) term "
        "is missing",
        "Your dx is `gamma / sqrt(var + eps) * (dy - mean(dy))`: it has the term from the mean "
        "but not the one from the variance.",
        "The variance depends on x as well; its path contributes "
        "`-x_hat * mean(dy * x_hat)`. The full formula is `dx = gamma / sqrt(var + eps) * "
        "(dy - mean(dy) - x_hat * mean(dy * x_hat))`, with the means over {sum_dims} of each channel.",
        "Also subtract `x_hat * mean(dy * x_hat)` (per channel)."),
    Misconception(
        "backward_no_mean_grad", "the gradient through the mean dropped",
        ("batch_norm_backward",),
        "dx = gamma / sqrt(var + eps) * (dy - x_hat * mean(dy * x_hat)): the mean(dy) term is "
        "missing",
        "Your dx is `gamma / sqrt(var + eps) * (dy - x_hat * mean(dy * x_hat))`: it has the "
        "term from the variance but not the one from the mean.",
        "The mean depends on every x_i; its path contributes `-mean(dy)`. The full formula "
        "is `dx = gamma / sqrt(var + eps) * (dy - mean(dy) - x_hat * mean(dy * x_hat))`, with the "
        "means over {sum_dims} of each channel.",
        "Also subtract `mean(dy)` (per channel)."),
    Misconception(
        "dgamma_uses_x", "dgamma from x instead of x_hat", ("batch_norm_backward",),
        "dgamma = sum(dy * x) instead of sum(dy * x_hat)",
        "You computed dgamma as the sum of `dy * x`, with the raw input x.",
        "`y = gamma * x_hat + beta`, so the derivative of y with respect to gamma is x_hat, the "
        "normalized input.",
        "`dgamma = (dy * x_hat).sum(...)` over {sum_dims}."),
    Misconception(
        "dx_without_gamma", "gamma missing from dx", ("batch_norm_backward",),
        "dx lacks the factor gamma",
        "Your dx lacks the factor gamma.",
        "`y = gamma * x_hat + beta`, so the gradient that reaches x_hat is `dy * gamma`: all of dx "
        "is scaled by gamma, per channel.",
        "Use `dy * gamma.view(1, -1, 1, ...)` in place of dy in the formula for dx."),
]

#: key -> :class:`Misconception`, in the order the checker tries them.
CATALOGUE: dict[str, Misconception] = {m.key: m for m in _ENTRIES}


# =======================================================================================
# the report
# =======================================================================================
@dataclass(frozen=True)
class Report:
    """What :func:`check` found.  Prints as plain, deterministic text.

    ``kind`` is one of ``"pass"``, ``"misconception"``, ``"unknown"`` (wrong, no known
    mistake matches), ``"exception"``, ``"type"``, ``"shape"``, ``"dtype"``, ``"nan"``.
    ``misconception`` is a :data:`CATALOGUE` key (the first, if two mistakes combine;
    ``misconceptions`` has them all).  ``max_abs_error`` is the largest difference from the
    reference over every test set (``None`` when the values could not be compared).
    """

    op: str
    passed: bool
    kind: str
    misconception: str | None
    message: str
    max_abs_error: float | None
    misconceptions: tuple[str, ...] = ()
    where: str | None = None

    @property
    def headline(self) -> str:
        if self.passed:
            return f"{self.op}: correct."
        if self.misconceptions:
            titles = " + ".join(f"{CATALOGUE[k].title} [{k}]" for k in self.misconceptions)
            return f"{self.op}: not correct. Diagnosis: {titles}"
        return f"{self.op}: not correct."

    def __str__(self) -> str:
        return f"{self.headline}\n{self.message}"

    __repr__ = __str__


# =======================================================================================
# small helpers
# =======================================================================================
def _g(x: float, digits: int = 3) -> str:
    """A number rounded to ``digits`` significant digits, printed the same everywhere."""
    if x is None:
        return "n/a"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    v = float(f"{x:.{digits}g}")
    if 1e-4 <= abs(v) < 1e6:  # plain notation: 2870, 0.309, 0.000123
        return f"{v:f}".rstrip("0").rstrip(".")
    return f"{v:.{digits}g}"


def _wrap(text: str, indent: str = "") -> str:
    """Fill each line of ``text`` to the page width; code in `backticks` is not broken."""
    out = []
    for para in text.split("\n"):
        pieces = para.split("`")
        # odd pieces are code: protect their spaces from the line breaker
        para = "`".join(p.replace(" ", "\x00") if i % 2 else p for i, p in enumerate(pieces))
        filled = textwrap.fill(para, _WIDTH, initial_indent=indent,
                               subsequent_indent=indent + "  ", break_on_hyphens=False,
                               break_long_words=False)
        out.append(filled.replace("\x00", " "))
    return "\n".join(out)


def _shape(t) -> str:
    s = tuple(t.shape) if isinstance(t, torch.Tensor) else tuple(t)
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _prod(xs) -> int:
    n = 1
    for s in xs:
        n *= s
    return n


def _close(a: torch.Tensor, b: torch.Tensor, dtype) -> torch.Tensor:
    rtol, atol = _TOL[dtype]
    return torch.isclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)


def _all_close(outs_a, outs_b, cases) -> bool:
    """Every output close on every set; a set where either side is ``None`` (a variant
    that does not exist for that input, such as reducing over (H, W) of an (N, C) input)
    is skipped."""
    return all(bool(_close(a, b, c.dtype).all())
               for oa, ob, c in zip(outs_a, outs_b, cases) if oa is not None and ob is not None
               for a, b in zip(oa, ob))


def _labels_of(lay: Layout) -> torch.Tensor:
    """Label array of an arbitrary layout (as :func:`axes.stat_groups` does for a norm)."""
    stat = lay.stat_shape
    return torch.arange(_prod(stat)).reshape(stat).expand(lay.view_shape).reshape(lay.shape)


def _same_partition(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.flatten(), b.flatten()
    return bool(((a[:, None] == a[None, :]) == (b[:, None] == b[None, :])).all())


def _spatial_names(k: int) -> list[str]:
    return {0: [], 1: ["L"], 2: ["H", "W"], 3: ["D", "H", "W"]}.get(k, [f"S{i}" for i in range(k)])


def _tuple_text(parts) -> str:
    return "(" + ", ".join(parts) + ")"


# =======================================================================================
# test sets
# =======================================================================================
@dataclass
class _Case:
    name: str
    label: str
    args: dict
    shape: tuple
    dtype: torch.dtype
    eps: float = 1e-5
    groups: int | None = None
    kind: str = "regular"

    @property
    def title(self) -> str:
        return f"set {self.name} ({self.label})"

    @property
    def short(self) -> str:
        """The set's name with its shape and dtype only."""
        what = self.label.split(" of shape ")[0]
        return f"set {self.name} ({what} of shape {_shape(self.shape)}, {_dt(self.dtype)})"


def _draw(g, shape, dtype=torch.float64):
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _structured(g, shape, dtype):
    """Channels (and samples) with different means and scales, so that every choice of
    reduce dims gives different statistics."""
    x = _draw(g, shape)
    view = [1] * len(shape)
    if len(shape) >= 2:
        cv = list(view)
        cv[1] = shape[1]
        scale = 0.5 + 2.0 * torch.rand(shape[1], generator=g, dtype=torch.float64)
        shift = 2.0 * _draw(g, (shape[1],))
        x = x * scale.view(cv) + shift.view(cv)
    nv = list(view)
    nv[0] = shape[0]
    x = x + _draw(g, (shape[0],)).view(nv)
    return x.to(dtype)


def _large_mean(g, shape, dtype=torch.float32):
    """4096 + d with d in {-0.5, -0.25, 0.25, 0.5}.  With power-of-two set sizes, every sum
    in E[x^2] - E[x]^2 is exact in float32 in any order, and the result is exactly 0 (the
    true variance is about 0.16): a deterministic catastrophic cancellation."""
    levels = torch.tensor([-0.5, -0.25, 0.25, 0.5], dtype=torch.float64)
    d = levels[torch.randint(0, 4, shape, generator=g)]
    return (_LARGE_MEAN + d).to(dtype)


def _affine(g, shape, dtype):
    gamma = (0.5 + 1.5 * torch.rand(shape, generator=g, dtype=torch.float64)).to(dtype)
    beta = (0.5 * _draw(g, shape)).to(dtype)
    return gamma, beta


# =======================================================================================
# candidates (one knob changed, or two)
# =======================================================================================
@dataclass(frozen=True)
class _Cand:
    keys: tuple[str, ...]
    changes: tuple[tuple[str, object], ...]
    details: tuple[tuple[tuple[str, object], ...], ...]  # one detail dict per key

    @property
    def fields(self) -> frozenset:
        return frozenset(k for k, _ in self.changes)

    def spec(self, base: dict) -> dict:
        s = dict(base)
        s.update(dict(self.changes))
        return s

    def __add__(self, other: "_Cand") -> "_Cand":
        return _Cand(self.keys + other.keys, self.changes + other.changes,
                     self.details + other.details)


def _cand(key, changes: dict, **detail) -> _Cand:
    return _Cand((key,), tuple(changes.items()), (tuple(detail.items()),))


# the reduce sets tried for "wrong_axes", in words: N batch, C channels, G the channels of
# one group, S every spatial dim, "last" only the last dim
_ROLE_SETS = [("N",), ("S",), ("C", "S"), ("N", "C", "S"), ("last",), ("C",), ("N", "C"),
              ("N", "S"), ("G",), ("N", "G", "S"), ("N", "G")]


def _role_layout(base: Layout, roles) -> Layout | None:
    """``base`` with the reduce dims that ``roles`` name; ``None`` if they name no dim."""
    grouped = base.norm == "group" and base.num_groups is not None
    nv = len(base.view_shape)
    sp0 = 3 if grouped else 2
    cdims = (1, 2) if grouped else (1,)
    spatial = tuple(range(sp0, nv))
    dims: set[int] = set()
    for r in roles:
        if r == "N":
            dims.add(0)
        elif r == "C":
            dims.update(cdims)
        elif r == "G":
            if not grouped:
                return None
            dims.add(2)
        elif r == "S":
            dims.update(spatial)  # nothing for an (N, C) input
        elif r == "last":
            dims.update(spatial[-1:] or cdims)
    if not dims:
        return None
    return dataclasses.replace(base, reduce_dims=tuple(sorted(dims)))


# =======================================================================================
# operations
# =======================================================================================
class _Op:
    name = ""
    call_text = ""
    input_name = "x"
    outputs: tuple[str, ...] = ("y",)
    ndims_allowed: tuple[int, ...] = (2, 3, 4)
    ndims_default: tuple[int, ...] = (2, 3, 4)
    option_names: tuple[str, ...] = ("seed", "ndims")
    doc = ""

    # ---- options and inputs ---------------------------------------------------------
    def parse_options(self, options: dict) -> dict:
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            raise TypeError(
                f"check({self.name!r}, ...): unknown option(s) {', '.join(unknown)}; "
                f"this op takes {', '.join(self.option_names)}")
        o = {"seed": int(options.get("seed", 0))}
        nd = options.get("ndims", self.ndims_default)
        nd = (nd,) if isinstance(nd, int) else tuple(sorted(set(int(d) for d in nd)))
        bad = [d for d in nd if d not in self.ndims_allowed]
        if not nd or bad:
            raise ValueError(
                f"check({self.name!r}, ...): ndims={options.get('ndims')!r}; {self.name} "
                f"inputs may have {', '.join(map(str, self.ndims_allowed))} dims")
        o["ndims"] = nd
        return o

    def cases(self, o) -> list[_Case]:
        raise NotImplementedError

    def reference(self, case) -> tuple:
        raise NotImplementedError

    def call(self, fn, case):
        raise NotImplementedError

    def expected_shapes(self, case) -> tuple:
        return (case.shape,)

    def shape_hint(self, i: int) -> str:
        return f" (the shape of {self.input_name})"

    def base_spec(self, o) -> dict:
        raise NotImplementedError

    def candidates(self, o, cases) -> list[_Cand]:
        raise NotImplementedError

    def evaluate(self, spec, case) -> tuple:
        raise NotImplementedError

    def context(self, o, cases) -> dict:
        return {}

    def locate(self, case, i: int, idx: tuple) -> str:
        return self._locate_nc(idx)

    def call_hint(self, o) -> str:
        return ""

    @staticmethod
    def _locate_nc(idx, first="sample", second="channel") -> str:
        parts = [f"{first} {idx[0]}"]
        if len(idx) > 1:
            parts.append(f"{second} {idx[1]}")
        if len(idx) == 3:
            parts.append(f"position {idx[2]}")
        elif len(idx) > 3:
            parts.append("position (" + ", ".join(map(str, idx[2:])) + ")")
        return ", ".join(parts)

    # ---- helpers shared by the ops ----------------------------------------------------
    @staticmethod
    def _display(cases) -> _Case:
        regular = [c for c in cases if c.kind == "regular"] or cases
        return max(regular, key=lambda c: len(c.shape))

    def _role_cands(self, base_layouts) -> list[_Cand]:
        return [_cand("wrong_axes", {"reduce": ("roles", roles)}, roles=roles)
                for roles in _ROLE_SETS
                if any(_role_layout(b, roles) is not None for b in base_layouts)]


# ---------------------------------------------------------------------------------------
# the four forward norms
# ---------------------------------------------------------------------------------------
class _NormOp(_Op):
    option_names = ("seed", "ndims")

    def __init__(self, name, norm, ndims, shapes, shapes32, shapes_big, roles_ref, words):
        self.name, self.norm = name, norm
        self.ndims_allowed = self.ndims_default = ndims
        self.shapes, self.shapes32, self.shapes_big = shapes, shapes32, shapes_big
        self.roles_ref, self.words = roles_ref, words
        grouped = norm == "group"
        self.call_text = ("f(x, num_groups, gamma, beta, eps)" if grouped
                          else "f(x, gamma, beta, eps)")

    # ---- inputs -------------------------------------------------------------------------
    def _split(self, entry):
        return entry if self.norm == "group" else (entry, None)

    def _make(self, g, name, label, shape, G, dtype, eps, kind, x=None):
        lay = axes.layout(self.norm, shape, G)
        if x is None:
            x = _structured(g, shape, dtype)
        gamma, beta = _affine(g, lay.affine_shape, dtype)
        return _Case(name, label, {"x": x, "gamma": gamma, "beta": beta}, shape, dtype, eps, G,
                     kind)

    def _label(self, shape, dtype, G, extra=""):
        s = f"x of shape {_shape(shape)}, {_dt(dtype)}"
        if G is not None:
            s += f", num_groups={G}"
        return s + extra

    def cases(self, o):
        g = torch.Generator().manual_seed(o["seed"])
        nd = o["ndims"]
        out = []
        names = iter("ABCDEFGHIJ")
        for d in nd:
            shape, G = self._split(self.shapes[d])
            out.append(self._make(g, next(names), self._label(shape, torch.float64, G), shape, G,
                                  torch.float64, 1e-5, "regular"))
        top = max(nd)
        shape, G = self._split(self.shapes32[top])
        out.append(self._make(g, next(names), self._label(shape, torch.float32, G), shape, G,
                              torch.float32, 1e-5, "float32"))
        # one set nearly constant (std 1e-4) and a large eps: only there does eps matter
        shape, G = self._split(self.shapes[top])
        x = _structured(g, shape, torch.float64)
        mask = axes.stat_groups(self.norm, shape, G) == 1
        x[mask] = 0.5 + 1e-4 * _draw(g, (int(mask.sum()),))
        extra = (f", eps=0.001; {self.words['set1']} is nearly constant (std 1e-4), so eps "
                 f"matters there")
        out.append(self._make(g, next(names), self._label(shape, torch.float64, G, extra), shape,
                              G, torch.float64, 1e-3, "nearzero", x=x))
        # large mean, small spread, float32: E[x^2] - E[x]^2 loses every digit
        d = 3 if 3 in nd else top
        shape, G = self._split(self.shapes_big[d])
        extra = ", values near 4096 with a spread of about 0.4 (large mean, small spread)"
        out.append(self._make(g, next(names), self._label(shape, torch.float32, G, extra), shape,
                              G, torch.float32, 1e-5, "largemean",
                              x=_large_mean(g, shape)))
        return out

    # ---- calls --------------------------------------------------------------------------
    def reference(self, c):
        x, gamma, beta = c.args["x"], c.args["gamma"], c.args["beta"]
        if self.norm == "batch":
            y = functional.batch_norm(x, None, None, gamma, beta, training=True, eps=c.eps)
        elif self.norm == "layer":
            y = functional.layer_norm(x, x.shape[1:], gamma, beta, c.eps)
        elif self.norm == "instance":
            y = functional.instance_norm(x, weight=gamma, bias=beta, eps=c.eps)
        else:
            y = functional.group_norm(x, c.groups, gamma, beta, c.eps)
        return (y,)

    def call(self, fn, c):
        a = {k: v.clone() for k, v in c.args.items()}
        if self.norm == "group":
            return fn(a["x"], c.groups, a["gamma"], a["beta"], c.eps)
        return fn(a["x"], a["gamma"], a["beta"], c.eps)

    def call_hint(self, o):
        shapes = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)"}
        return ("The checker calls " + self.call_text + " with x of shape "
                + " and ".join(shapes[d] for d in o["ndims"]) + ".")

    # ---- variants -----------------------------------------------------------------------
    def base_spec(self, o):
        return {"reduce": None, "order": "contiguous", "correction": 0, "eps_mode": "inside",
                "eps": "given", "var": "two_pass", "affine": "per_channel"}

    def candidates(self, o, cases):
        bases = [axes.layout(self.norm, c.shape, c.groups) for c in cases]
        out = self._role_cands(bases)
        if self.norm == "group":
            out.append(_cand("group_size_as_num_groups", {"reduce": ("swap",)}))
            out.append(_cand("strided_groups", {"order": "strided"}))
            for pick in ("first_G", "first_of_group", "group_mean"):
                out.append(_cand("affine_per_group", {"affine": pick}, pick=pick))
        out += [
            _cand("unbiased_var", {"correction": 1}),
            _cand("eps_outside_sqrt", {"eps_mode": "outside"}),
            # without eps, where eps would go does not matter: no_eps sets both knobs
            _cand("no_eps", {"eps": "none", "eps_mode": "inside"}),
            _cand("fixed_eps", {"eps": "fixed"}),
            _cand("naive_var", {"var": "naive"}),
            _cand("no_affine", {"affine": "none"}),
        ]
        return out

    def _layout(self, spec, c) -> Layout | None:
        base = axes.layout(self.norm, c.shape, c.groups)
        r = spec["reduce"]
        if r is None:
            return base
        if r[0] == "swap":
            return axes.layout("group", c.shape, c.shape[1] // c.groups)
        return _role_layout(base, r[1])

    def evaluate(self, spec, c):
        x, gamma, beta = c.args["x"], c.args["gamma"], c.args["beta"]
        lay = self._layout(spec, c)
        if lay is None:
            return None  # this reduce set names no dim of this input (e.g. (H, W) of (N, C))
        eps = {"given": c.eps, "none": 0.0, "fixed": 1e-5}[spec["eps"]]
        w, b = gamma, beta
        aff = spec["affine"]
        if aff == "none":
            w = b = None
        elif aff != "per_channel":
            C, G = c.shape[1], c.groups
            size = C // G
            grp = torch.arange(C) // size
            if aff == "first_G":          # gamma[g] for every channel of group g
                w, b = gamma[grp], beta[grp]
            elif aff == "first_of_group":  # the gamma of the group's first channel
                w, b = gamma[grp * size], beta[grp * size]
            else:                          # the group's average gamma
                w, b = gamma.view(G, size).mean(1)[grp], beta.view(G, size).mean(1)[grp]
        perm = None
        if spec["order"] == "strided":
            C, G = c.shape[1], c.groups
            perm = torch.tensor(sorted(range(C), key=lambda ch: (ch % G, ch)))
            x = x[:, perm]
            w = None if w is None else w[perm]
            b = None if b is None else b[perm]
        if spec["var"] == "naive":
            xv = x.reshape(lay.view_shape)
            mean = xv.mean(dim=lay.reduce_dims, keepdim=True)
            var = stats.var_naive(xv, lay.reduce_dims, correction=spec["correction"], keepdim=True)
            y = normalize(x, lay, eps, w, b, mean=mean, var=var, eps_mode=spec["eps_mode"]).output
        else:
            y = normalize(x, lay, eps, w, b, correction=spec["correction"],
                          eps_mode=spec["eps_mode"]).output
        if perm is not None:
            y = y[:, torch.argsort(perm)]
        return (y,)

    # ---- words --------------------------------------------------------------------------
    def context(self, o, cases):
        disp = self._display(cases)
        shape, G = disp.shape, disp.groups
        names = ["N", "C"] + _spatial_names(len(shape) - 2)
        ctx = {"norm": axes.TITLES[self.norm], "shape": _shape(shape), "names": names,
               "want": _role_names(self.roles_ref, names)}
        lay = axes.layout(self.norm, shape, G)
        describe = axes.describe(self.norm, shape, G)
        if self.norm == "group":
            fix = (f"reshape x to `(N, num_groups, -1)` (here {_shape((shape[0], G, -1))}), take "
                   f"the mean and variance over the last dim with keepdim=True, normalize, and "
                   f"reshape back to x.shape")
            ctx.update(C=shape[1], G=G, CG=shape[1] // G)
        else:
            gen = {"batch": "(0, *range(2, x.dim()))", "layer": "tuple(range(1, x.dim()))",
                   "instance": "tuple(range(2, x.dim()))"}[self.norm]
            fix = (f"for x of shape {_shape(shape)} that is "
                   f"`x.mean(dim={_shape(lay.reduce_dims)}, keepdim=True)`; in general "
                   f"`dim = {gen}`")
        ctx["axes_why"] = f"{self.words['why']} For x of shape {_shape(shape)}: {describe}."
        ctx["axes_fix"] = fix
        ctx["unbiased_why"] = (
            f"{ctx['norm']} normalizes with the biased variance, the plain mean of the squared "
            f"deviations (divide by n): it describes the values being normalized. The unbiased "
            f"(n - 1) variance only goes into running_var, as an estimate for eval mode. The "
            f"difference is largest for small sets: for n = 4 the std differs by 15%.")
        near = next(c for c in cases if c.kind == "nearzero")
        big = next(c for c in cases if c.kind == "largemean")
        ctx["eps_case"], ctx["eps_value"], ctx["eps_where"] = near.name, _g(near.eps), ""
        ctx["big_case"] = big.name
        ctx["big_var"] = _g(float(torch.var_mean(
            big.args["x"].double().reshape(axes.layout(self.norm, big.shape, big.groups).view_shape),
            dim=axes.layout(self.norm, big.shape, big.groups).reduce_dims,
            correction=0)[0].mean()), 2)
        ctx["affine_hint"] = (
            "gamma and beta have shape x.shape[1:] and broadcast as they are"
            if self.norm == "layer" else
            "with gamma and beta reshaped to broadcast over the channel dim: "
            "`gamma.view(1, -1, *[1] * (x.dim() - 2))`")
        ctx["_other_shape"] = shape
        ctx["_other_groups"] = G
        ctx["_other_lay"] = lay
        return ctx

    def wrong_axes_detail(self, ctx, roles) -> dict:
        shape = ctx["_other_shape"]
        base = ctx["_other_lay"]
        lay = _role_layout(base, roles)
        other = ""
        if lay is not None:
            mine = _labels_of(lay)
            for norm in ("batch", "layer", "instance"):
                if norm == self.norm or (norm == "instance" and len(shape) < 3):
                    continue
                if _same_partition(mine, axes.stat_groups(norm, shape)):
                    other = f", which is how {axes.TITLES[norm]} groups the elements"
                    break
        return {"got": _role_names(roles, ctx["names"]), "other": other}


def _role_names(roles, names) -> str:
    parts = []
    if "N" in roles:
        parts.append(names[0])
    if "C" in roles:
        parts.append(names[1])
    elif "G" in roles:
        parts.append("the channels of one group")
    if "S" in roles:
        parts.extend(names[2:])
    elif "last" in roles:
        last = names[-1] if len(names) > 2 else names[1]
        if last not in parts:
            parts.append(last)
    return _tuple_text(parts)


_NORM_WHY = {
    "batch": "BatchNorm gives each channel one mean and one variance, shared by every sample "
             "and every position of the batch.",
    "layer": "LayerNorm gives each sample one mean and one variance, over all of its features "
             "(every dim but the first); nothing is shared across the batch.",
    "instance": "InstanceNorm gives each (sample, channel) pair its own mean and variance, "
                "over the positions only.",
    "group": "GroupNorm splits the C channels into num_groups groups of C // num_groups "
             "consecutive channels; each (sample, group) gets one mean and variance, over the "
             "group's channels and all positions.",
}

_OPS_LIST: list[_Op] = [
    _NormOp("batch_norm", "batch", (2, 3, 4),
            {2: (4, 3), 3: (3, 4, 5), 4: (2, 3, 3, 2)},
            {2: (5, 4), 3: (2, 4, 6), 4: (3, 4, 2, 3)},
            {2: (8, 4), 3: (4, 4, 8), 4: (2, 4, 4, 4)},
            ("N", "S"), {"set1": "channel 1", "why": _NORM_WHY["batch"]}),
    _NormOp("layer_norm", "layer", (2, 3, 4),
            {2: (3, 5), 3: (2, 3, 4), 4: (2, 3, 2, 3)},
            {2: (4, 6), 3: (3, 4, 5), 4: (2, 4, 3, 2)},
            {2: (4, 32), 3: (4, 4, 8), 4: (2, 4, 4, 2)},
            ("C", "S"), {"set1": "sample 1", "why": _NORM_WHY["layer"]}),
    _NormOp("instance_norm", "instance", (3, 4),
            {3: (2, 3, 4), 4: (2, 3, 3, 2)},
            {3: (3, 4, 5), 4: (2, 4, 2, 3)},
            {3: (4, 4, 8), 4: (2, 4, 4, 4)},
            ("S",), {"set1": "channel 1 of sample 0", "why": _NORM_WHY["instance"]}),
    _NormOp("group_norm", "group", (2, 3, 4),
            {2: ((3, 6), 3), 3: ((2, 6, 4), 3), 4: ((2, 6, 2, 3), 2)},
            {2: ((4, 8), 4), 3: ((2, 8, 3), 2), 4: ((2, 8, 2, 2), 4)},
            {2: ((4, 8), 2), 3: ((4, 8, 4), 2), 4: ((2, 8, 2, 4), 2)},
            ("G", "S"), {"set1": "group 1 of sample 0", "why": _NORM_WHY["group"]}),
]


# ---------------------------------------------------------------------------------------
# weight standardization
# ---------------------------------------------------------------------------------------
_CONV_FORMULA = {
    "original": "`(w - mean) / (std + eps)` with the unbiased std (n - 1)",
    "bit": "`(w - mean) / sqrt(var + eps)` with the biased variance (n)",
    "timm": "`(w - mean) / sqrt(var + eps)` with the biased variance (n)",
}


class _WSOp(_Op):
    name = "weight_standardize"
    call_text = "f(w, eps)"
    input_name = "w"
    outputs = ("w_hat",)
    ndims_allowed = (2, 3, 4)
    ndims_default = (4,)
    option_names = ("seed", "ndims", "convention")
    shapes = {2: (4, 3), 3: (4, 3, 5), 4: (4, 3, 3, 3)}
    small = {2: (3, 2), 3: (3, 2, 2), 4: (3, 2, 2, 2)}
    shapes32 = {2: (6, 5), 3: (5, 4, 3), 4: (6, 4, 3, 3)}

    def parse_options(self, options):
        o = super().parse_options({k: v for k, v in options.items() if k != "convention"})
        conv = options.get("convention", "original")
        if conv not in WS_CONVENTIONS:
            raise ValueError(f"check('weight_standardize', ...): unknown convention {conv!r}; "
                             f"choose one of {sorted(WS_CONVENTIONS)}")
        o["convention"] = conv
        return o

    def _weight(self, g, shape, dtype):
        w = _draw(g, shape)
        cv = [1] * len(shape)
        cv[0] = shape[0]
        iv = [1] * len(shape)
        iv[1] = shape[1]
        w = w * (0.2 + torch.rand(shape[0], generator=g, dtype=torch.float64)).view(cv)
        w = w + 0.5 * _draw(g, (shape[0],)).view(cv) + 0.5 * _draw(g, (shape[1],)).view(iv)
        return w.to(dtype)

    def cases(self, o):
        g = torch.Generator().manual_seed(o["seed"])
        eps = WS_CONVENTIONS[o["convention"]]["eps"]
        names = iter("ABCDEFGHIJ")
        out = []
        conv = o["convention"]
        for d in o["ndims"]:
            s = self.shapes[d]
            out.append(_Case(next(names), f"w of shape {_shape(s)}, float64",
                             {"w": self._weight(g, s, torch.float64), "convention": conv}, s,
                             torch.float64, eps))
        top = max(o["ndims"])
        for s, dtype, kind in ((self.small[top], torch.float64, "regular"),
                               (self.shapes32[top], torch.float32, "float32")):
            out.append(_Case(next(names), f"w of shape {_shape(s)}, {_dt(dtype)}",
                             {"w": self._weight(g, s, dtype), "convention": conv}, s, dtype, eps,
                             kind=kind))
        s = self.shapes[top]
        w = self._weight(g, s, torch.float64)
        w[1] = 0.5 + 1e-4 * _draw(g, s[1:])
        out.append(_Case(next(names), f"w of shape {_shape(s)}, float64, eps=0.001; output "
                         f"channel 1 is nearly constant (std 1e-4), so eps matters there",
                         {"w": w, "convention": conv}, s, torch.float64, 1e-3, kind="nearzero"))
        return out

    def reference(self, c):
        return (functional.weight_standardize(c.args["w"], c.eps, convention=c.args["convention"]),)

    def call(self, fn, c):
        return fn(c.args["w"].clone(), c.eps)

    def call_hint(self, o):
        shapes = {2: "(C_out, C_in)", 3: "(C_out, C_in, k)", 4: "(C_out, C_in, kH, kW)"}
        return ("The checker calls f(w, eps) with w of shape "
                + " and ".join(shapes[d] for d in o["ndims"]) + ".")

    def base_spec(self, o):
        conv = WS_CONVENTIONS[o["convention"]]
        return {"reduce": None, "correction": conv["correction"], "eps_mode": conv["eps_mode"],
                "eps": "given"}

    def candidates(self, o, cases):
        conv = WS_CONVENTIONS[o["convention"]]
        bases = [axes.layout("layer", c.shape) for c in cases]
        out = self._role_cands(bases)
        unb = conv["correction"] == 1
        out.append(_cand("other_convention", {"correction": 0 if unb else 1,
                                              "eps_mode": "inside" if unb else "outside"}))
        out.append(_cand("biased_var" if unb else "unbiased_var",
                         {"correction": 0 if unb else 1}))
        inside = conv["eps_mode"] == "inside"
        out.append(_cand("eps_outside_sqrt" if inside else "eps_inside_sqrt",
                         {"eps_mode": "outside" if inside else "inside"}))
        out.append(_cand("no_eps", {"eps": "none", "eps_mode": conv["eps_mode"]}))
        return out

    def evaluate(self, spec, c):
        base = axes.layout("layer", c.shape)
        lay = base if spec["reduce"] is None else _role_layout(base, spec["reduce"][1])
        if lay is None:
            return None  # this reduce set names no dim of this input (e.g. (H, W) of (N, C))
        eps = c.eps if spec["eps"] == "given" else 0.0
        return (normalize(c.args["w"], lay, eps, correction=spec["correction"],
                          eps_mode=spec["eps_mode"]).output,)

    def context(self, o, cases):
        conv = o["convention"]
        disp = self._display(cases)
        shape = disp.shape
        k = len(shape) - 2
        names = ["C_out", "C_in"] + (["k"] if k == 1 else [f"k{n}" for n in _spatial_names(k)])
        base = axes.layout("layer", shape)
        unb = WS_CONVENTIONS[conv]["correction"] == 1
        near = next(c for c in cases if c.kind == "nearzero")
        return {
            "norm": f"Weight Standardization ('{conv}' convention)",
            "names": names, "want": _role_names(("C", "S"), names),
            "axes_why": "Weight Standardization standardizes each output channel's filter: one "
                        "mean and one std per output channel, over all of its weights "
                        f"{_role_names(('C', 'S'), names)}.",
            "axes_fix": f"for w of shape {_shape(shape)} that is `w.mean(dim="
                        f"{_shape(base.reduce_dims)}, keepdim=True)`; in general "
                        f"`dim = tuple(range(1, w.dim()))`",
            "unbiased_why": f"The '{conv}' convention of Weight Standardization uses the biased "
                            f"variance (divide by n): {_CONV_FORMULA[conv]}.",
            "conv": conv, "conv_formula": _CONV_FORMULA[conv],
            "other_name": "original" if not unb else "BiT / timm",
            "other_formula": _CONV_FORMULA["original" if not unb else "bit"],
            "eps_case": near.name, "eps_where": "" if not unb else " (or std + eps)",
            "_other_lay": base,
        }

    def wrong_axes_detail(self, ctx, roles):
        return {"got": _role_names(roles, ctx["names"]), "other": ""}

    def locate(self, case, i, idx):
        parts = [f"output channel {idx[0]}"]
        if len(idx) > 1:
            parts.append(f"input channel {idx[1]}")
        if len(idx) > 2:
            parts.append("kernel position " + (str(idx[2]) if len(idx) == 3 else
                                               "(" + ", ".join(map(str, idx[2:])) + ")"))
        return ", ".join(parts)


# ---------------------------------------------------------------------------------------
# running statistics
# ---------------------------------------------------------------------------------------
class _RunningOp(_Op):
    name = "running_update"
    call_text = "f(running_mean, running_var, x, momentum)"
    outputs = ("new_running_mean", "new_running_var")
    ndims_allowed = (2, 3, 4)
    ndims_default = (2, 4)
    shapes = {2: (4, 3), 3: (3, 4, 5), 4: (2, 3, 2, 2)}
    shapes32 = {2: (6, 4), 3: (2, 4, 6), 4: (3, 4, 2, 2)}
    shapes_big = {2: (8, 4), 3: (4, 4, 8), 4: (2, 4, 4, 4)}
    momenta = (0.1, 0.3, 0.2, 0.15, 0.1, 0.1)

    def cases(self, o):
        g = torch.Generator().manual_seed(o["seed"])
        names = iter("ABCDEFGHIJ")
        mom = iter(self.momenta)
        top = max(o["ndims"])
        spec = [(self.shapes[d], torch.float64, "regular") for d in o["ndims"]]
        spec.append((self.shapes32[top], torch.float32, "float32"))
        spec.append((self.shapes_big[2 if 2 in o["ndims"] else top], torch.float32, "largemean"))
        out = []
        for shape, dtype, kind in spec:
            C = shape[1]
            x = _large_mean(g, shape) if kind == "largemean" else _structured(g, shape, dtype)
            rm = (0.5 * _draw(g, (C,))).to(dtype)
            rv = (0.5 + torch.rand(C, generator=g, dtype=torch.float64)).to(dtype)
            m = next(mom)
            label = f"x of shape {_shape(shape)}, {_dt(dtype)}, momentum={m}"
            if kind == "largemean":
                label += ", values near 4096 with a spread of about 0.4 (large mean, small spread)"
            out.append(_Case(next(names), label, {"running_mean": rm, "running_var": rv, "x": x,
                                                  "momentum": m}, shape, dtype, kind=kind))
        return out

    def reference(self, c):
        rm, rv = c.args["running_mean"].clone(), c.args["running_var"].clone()
        functional.batch_norm(c.args["x"], rm, rv, training=True, momentum=c.args["momentum"])
        return (rm, rv)

    def call(self, fn, c):
        a = c.args
        return fn(a["running_mean"].clone(), a["running_var"].clone(), a["x"].clone(),
                  a["momentum"])

    def call_hint(self, o):
        shapes = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)"}
        return ("The checker calls " + self.call_text + " with x of shape "
                + " and ".join(shapes[d] for d in o["ndims"]) + ".")

    def expected_shapes(self, c):
        return ((c.shape[1],), (c.shape[1],))

    def shape_hint(self, i):
        return " (one value per channel)"

    def base_spec(self, o):
        return {"correction": 1, "order": "torch", "var": "two_pass"}

    def candidates(self, o, cases):
        return [_cand("biased_running_var", {"correction": 0}),
                _cand("momentum_swapped", {"order": "swapped"}),
                _cand("naive_var", {"var": "naive"})]

    def evaluate(self, spec, c):
        x, m = c.args["x"], c.args["momentum"]
        C = c.shape[1]
        lay = axes.layout("batch", c.shape)
        if spec["var"] == "naive":
            xv = x.reshape(lay.view_shape)
            mean = xv.mean(dim=lay.reduce_dims)
            var = stats.var_naive(xv, lay.reduce_dims, correction=spec["correction"])
        else:
            out = normalize(x, lay, 1e-5, correction=spec["correction"])
            mean, var = out.mean, out.var
        f = m if spec["order"] == "torch" else 1.0 - m
        rm = stats.ema_update_(c.args["running_mean"].clone(), mean.reshape(C), f)
        rv = stats.ema_update_(c.args["running_var"].clone(), var.reshape(C), f)
        return (rm, rv)

    def context(self, o, cases):
        big = next(c for c in cases if c.kind == "largemean")
        lay = axes.layout("batch", big.shape)
        v = torch.var_mean(big.args["x"].double(), dim=lay.reduce_dims, correction=0)[0]
        return {"norm": "BatchNorm", "big_case": big.name, "big_var": _g(float(v.mean()), 2)}

    def locate(self, case, i, idx):
        return f"channel {idx[0]}"


# ---------------------------------------------------------------------------------------
# BatchNorm backward
# ---------------------------------------------------------------------------------------
class _BackwardOp(_Op):
    name = "batch_norm_backward"
    call_text = "f(dy, x, gamma, eps)"
    outputs = ("dx", "dgamma", "dbeta")
    shapes = {2: (4, 3), 3: (3, 4, 5), 4: (2, 3, 3, 2)}
    shapes32 = {2: (5, 4), 3: (2, 4, 6), 4: (3, 4, 2, 3)}

    def cases(self, o):
        g = torch.Generator().manual_seed(o["seed"])
        names = iter("ABCDEFGHIJ")
        top = max(o["ndims"])
        spec = [(self.shapes[d], torch.float64, "regular") for d in o["ndims"]]
        spec.append((self.shapes32[top], torch.float32, "float32"))
        out = []
        for shape, dtype, kind in spec:
            x = _structured(g, shape, dtype)
            gamma, _ = _affine(g, (shape[1],), dtype)
            dy = _draw(g, shape, dtype)
            out.append(_Case(next(names), f"x of shape {_shape(shape)}, {_dt(dtype)}",
                             {"dy": dy, "x": x, "gamma": gamma}, shape, dtype, kind=kind))
        return out

    def reference(self, c):
        with torch.enable_grad():
            x = c.args["x"].clone().requires_grad_(True)
            gamma = c.args["gamma"].clone().requires_grad_(True)
            beta = torch.zeros_like(gamma, requires_grad=True)
            y = functional.batch_norm(x, None, None, gamma, beta, training=True, eps=c.eps)
            return tuple(t.detach() for t in torch.autograd.grad(y, (x, gamma, beta),
                                                                 c.args["dy"]))

    def call(self, fn, c):
        a = c.args
        return fn(a["dy"].clone(), a["x"].clone(), a["gamma"].clone(), c.eps)

    def call_hint(self, o):
        shapes = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)"}
        return ("The checker calls " + self.call_text + " with dy and x of shape "
                + " and ".join(shapes[d] for d in o["ndims"]) + ".")

    def expected_shapes(self, c):
        return (c.shape, (c.shape[1],), (c.shape[1],))

    def shape_hint(self, i):
        return (" (the shape of x)" if i == 0 else
                " (one value per channel: sum over N and the positions)")

    def base_spec(self, o):
        return {"reduce": None, "correction": 0, "mean_grad": True, "var_grad": True,
                "dgamma": "x_hat", "dx_gamma": True}

    def candidates(self, o, cases):
        bases = [axes.layout("batch", c.shape) for c in cases]
        return [
            _cand("backward_stats_constant", {"mean_grad": False, "var_grad": False}),
            _cand("backward_no_var_grad", {"var_grad": False}),
            _cand("backward_no_mean_grad", {"mean_grad": False}),
            _cand("dx_without_gamma", {"dx_gamma": False}),
            _cand("dgamma_uses_x", {"dgamma": "x"}),
            _cand("unbiased_var", {"correction": 1}),
        ] + self._role_cands(bases)

    def evaluate(self, spec, c):
        base = axes.layout("batch", c.shape)
        lay = base if spec["reduce"] is None else _role_layout(base, spec["reduce"][1])
        if lay is None:
            return None  # this reduce set names no dim of this input (e.g. (H, W) of (N, C))
        dy = c.args["dy"]

        def grads(weight_on: bool):
            x = c.args["x"].clone().requires_grad_(True)
            gamma = c.args["gamma"].clone().requires_grad_(True)
            beta = torch.zeros_like(gamma, requires_grad=True)
            var, mean = torch.var_mean(x.reshape(lay.view_shape), dim=lay.reduce_dims,
                                       correction=spec["correction"], keepdim=True)
            if not spec["mean_grad"]:
                mean = mean.detach()
            if not spec["var_grad"]:
                var = var.detach()
            y = normalize(x, lay, c.eps, gamma if weight_on else None, beta, mean=mean,
                          var=var).output
            return torch.autograd.grad(y, (x, gamma, beta), dy, allow_unused=True)

        with torch.enable_grad():
            dx, dg, db = grads(True)
            if not spec["dx_gamma"]:
                dx = grads(False)[0]
        if spec["dgamma"] == "x":
            dims = [d for d in range(dy.dim()) if d != 1]
            dg = (dy * c.args["x"]).sum(dim=dims)
        return (dx.detach(), dg.detach(), db.detach())

    def context(self, o, cases):
        disp = self._display(cases)
        names = ["N", "C"] + _spatial_names(len(disp.shape) - 2)
        base = axes.layout("batch", disp.shape)
        want = _role_names(("N", "S"), names)
        return {
            "norm": "BatchNorm", "names": names, "want": want, "sum_dims": want,
            "axes_why": _NORM_WHY["batch"] + " The sums in the gradient run over the same set.",
            "axes_fix": f"for x of shape {_shape(disp.shape)} that is `dim="
                        f"{_shape(base.reduce_dims)}`; in general `dim = (0, *range(2, x.dim()))`",
            "unbiased_why": "The forward pass normalizes with the biased variance (divide by n), "
                            "so its gradient has 1/n where yours has 1/(n - 1).",
            "_other_lay": base, "_other_shape": disp.shape,
        }

    def wrong_axes_detail(self, ctx, roles):
        shape = ctx["_other_shape"]
        lay = _role_layout(ctx["_other_lay"], roles)
        other = ""
        if lay is not None:
            for norm in ("layer", "instance"):
                if norm == "instance" and len(shape) < 3:
                    continue
                if _same_partition(_labels_of(lay), axes.stat_groups(norm, shape)):
                    other = f", which is how {axes.TITLES[norm]} groups the elements"
        return {"got": _role_names(roles, ctx["names"]), "other": other}

    def locate(self, case, i, idx):
        return self._locate_nc(idx) if i == 0 else f"channel {idx[0]}"


_OPS_LIST += [_RunningOp(), _BackwardOp(), _WSOp()]

#: op name -> the student's call signature.
OPS: dict[str, str] = {op.name: op.call_text for op in _OPS_LIST}
_OPS: dict[str, _Op] = {op.name: op for op in _OPS_LIST}


def _get_op(op: str) -> _Op:
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(_OPS)}")
    return _OPS[op]


# =======================================================================================
# the checker
# =======================================================================================
def check(op: str, student_fn: Callable, **options) -> Report:
    """Run ``student_fn`` and the reference for ``op`` on seeded inputs; say what is wrong.

    Returns a :class:`Report`; ``print(report)`` gives the plain-text verdict.  Options:
    ``seed`` (int, default 0), ``ndims`` (the input ranks to test, e.g. ``(4,)``) and, for
    ``weight_standardize``, ``convention`` (``"original"``, ``"bit"``, ``"timm"``).
    """
    spec = _get_op(op)
    if not callable(student_fn):
        raise TypeError(f"check({op!r}, ...): the student function must be callable, got "
                        f"{type(student_fn).__name__}")
    o = spec.parse_options(options)
    cases = spec.cases(o)
    base = spec.base_spec(o)
    refs = [spec.reference(c) for c in cases]

    # 1. run the student's function on every set
    outs = []
    for c in cases:
        try:
            raw = spec.call(student_fn, c)
        except Exception as e:  # noqa: BLE001 - any error of the student's code is reported
            return _report_exception(spec, o, c, e)
        got = _as_outputs(spec, c, raw)
        if isinstance(got, Report):
            return got
        outs.append(got)

    # 2. shapes, then dtypes
    for c, got in zip(cases, outs):
        for i, (name, t, shape) in enumerate(zip(spec.outputs, got, spec.expected_shapes(c))):
            if tuple(t.shape) != tuple(shape):
                return _simple(spec, "shape", _wrap(
                    f"Your function returned {_what(spec, i)} of shape {_shape(t)} on "
                    f"{c.title}, but it must have shape {_shape(shape)}{spec.shape_hint(i)}."))
    for c, got in zip(cases, outs):
        for i, t in enumerate(got):
            if t.dtype != c.dtype:
                return _simple(spec, "dtype", _wrap(
                    f"Your function returned {_what(spec, i)} as {_dt(t.dtype)} for a "
                    f"{_dt(c.dtype)} input on {c.title}. Keep the input's dtype: create new "
                    f"tensors with dtype=x.dtype (torch.tensor(...) and torch.zeros(n) default to "
                    f"float32), and avoid .float() and .double()."))

    # 3. values
    err = _largest_error(spec, cases, outs, refs)
    if _all_close(outs, refs, cases):
        return Report(op, True, "pass", None, _wrap(
            f"Your function matches the reference on all {len(cases)} test sets."),
            err["max"], (), None)

    # 4. which mistake is it?
    ctx = spec.context(o, cases)
    found = _diagnose(spec, base, cases, outs, refs, o)
    where = err["text"]
    if found is not None:
        return _report_misconception(spec, ctx, found, err, cases)
    bad = [(c, got) for c, got, ref in zip(cases, outs, refs)
           if any(bool((~torch.isfinite(t) & torch.isfinite(r)).any())
                  for t, r in zip(got, ref))]
    if bad:
        c, got = bad[0]
        i, t = next((i, t) for i, t in enumerate(got) if not bool(torch.isfinite(t).all()))
        idx = tuple(int(v) for v in (~torch.isfinite(t)).nonzero()[0])
        n_bad = int((~torch.isfinite(t)).sum())
        msg = _wrap(
            f"Your function returned NaN or inf: {n_bad} of {t.numel()} values of "
            f"{'the output' if len(spec.outputs) == 1 else spec.outputs[i]} on {c.title}, the first at {spec.locate(c, i, idx)}. The "
            f"reference is finite there.\nCommon causes: dividing by sqrt(var) without eps when "
            f"a set is (nearly) constant; the square root of a negative variance "
            f"(E[x^2] - E[x]^2 can come out negative); dividing by n - 1 when n = 1; or a "
            f"division by zero elsewhere.")
        return Report(op, False, "nan", None, msg, err["max"], (), where)
    return Report(op, False, "unknown", None, _unknown_message(spec, cases, outs, refs, err),
                  err["max"], (), where)


def _what(spec: _Op, i: int) -> str:
    return "a tensor" if len(spec.outputs) == 1 else spec.outputs[i]


def _simple(spec, kind, message) -> Report:
    return Report(spec.name, False, kind, None, message, None, (), None)


def _as_outputs(spec: _Op, c: _Case, raw):
    k = len(spec.outputs)
    if k == 1:
        if isinstance(raw, torch.Tensor):
            return (raw.detach(),)
        extra = ""
        if isinstance(raw, (tuple, list)):
            extra = " Return only the normalized tensor, not a tuple."
        elif raw is None:
            extra = " Did you forget the return statement?"
        return _simple(spec, "type", _wrap(
            f"Your function returned {_type_name(raw)} on {c.title}; it must return one "
            f"torch.Tensor.{extra}"))
    names = ", ".join(spec.outputs)
    if (not isinstance(raw, (tuple, list)) or len(raw) != k
            or not all(isinstance(t, torch.Tensor) for t in raw)):
        extra = " Did you forget the return statement?" if raw is None else ""
        return _simple(spec, "type", _wrap(
            f"Your function returned {_type_name(raw)} on {c.title}; it must return a tuple "
            f"of {k} tensors, `({names})`.{extra}"))
    return tuple(t.detach() for t in raw)


def _type_name(raw) -> str:
    if raw is None:
        return "None"
    if isinstance(raw, (tuple, list)):
        inner = ", ".join(_type_name(r) if not isinstance(r, torch.Tensor) else "Tensor"
                          for r in raw)
        return f"a {type(raw).__name__} ({inner})"
    mod = type(raw).__module__
    qual = type(raw).__qualname__
    return f"a {qual if mod == 'builtins' else mod.split('.')[0] + '.' + qual}"


def _report_exception(spec, o, c, e) -> Report:
    text = str(e).strip().splitlines()
    text = " ".join(line.strip() for line in text[:3])
    if len(text) > 300:
        text = text[:297] + "..."
    msg = (f"Your function raised {type(e).__name__}: {text}\nwhen called as "
           f"{spec.call_text} on {c.title}.\n{spec.call_hint(o)}")
    if spec.input_name == "x" and len(o["ndims"]) > 1:
        msg += " Compute dims from x.dim() rather than assuming one shape."
    return Report(spec.name, False, "exception", None, _wrap(msg), None, (), None)


def _largest_error(spec, cases, outs, refs) -> dict:
    """The largest finite |student - reference|, where it is, and per set."""
    best = (-1.0, None, None, None)
    per_case = []
    for c, got, ref in zip(cases, outs, refs):
        worst = 0.0
        for i, (t, r) in enumerate(zip(got, ref)):
            diff = (t.double() - r.double()).abs()
            diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
            if diff.numel() == 0:
                continue
            m = float(diff.max())
            worst = max(worst, m)
            if m > best[0]:
                flat = int(diff.flatten().argmax())
                idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(flat), diff.shape))
                best = (m, c, i, idx)
        per_case.append(worst)
    m, c, i, idx = best
    text = None
    if c is not None:
        out = "" if len(spec.outputs) == 1 else f"{spec.outputs[i]}, "
        text = f"{_g(m)} in {out}{c.short}, at {spec.locate(c, i, idx)}"
    return {"max": m if m >= 0 else None, "text": text, "per_case": per_case}


def _distinct_candidates(spec, base, cases, refs, o):
    """Yield ``(candidate, outputs)`` for every single candidate that can be told apart
    from the reference and from every earlier candidate on these test sets."""
    seen = []
    for cand in spec.candidates(o, cases):
        try:
            vals = [spec.evaluate(cand.spec(base), c) for c in cases]
        except Exception:  # noqa: BLE001 - a knob that makes no sense for these shapes
            continue
        if sum(v is not None for v in vals) < 2:
            continue
        if _all_close(vals, refs, cases) or any(_all_close(vals, v, cases) for v in seen):
            continue
        seen.append(vals)
        yield cand, vals


def _diagnose(spec, base, cases, outs, refs, o):
    """The first candidate (single, then pair) whose output matches the student's."""
    singles = []
    for cand, vals in _distinct_candidates(spec, base, cases, refs, o):
        if _all_close(outs, vals, cases):
            return cand
        singles.append(cand)
    for i, a in enumerate(singles):
        for b in singles[i + 1:]:
            if a.fields & b.fields:
                continue
            pair = a + b
            try:
                vals = [spec.evaluate(pair.spec(base), c) for c in cases]
            except Exception:  # noqa: BLE001
                continue
            if _all_close(outs, vals, cases) and not _all_close(vals, refs, cases):
                return pair
    return None


def _render(spec, ctx, cand: _Cand, i: int) -> tuple[str, str, str]:
    key = cand.keys[i]
    detail = dict(cand.details[i])
    local = dict(ctx)
    if key == "wrong_axes":
        local.update(spec.wrong_axes_detail(ctx, detail["roles"]))
    if key == "affine_per_group":
        local["pick"] = {
            "first_G": "channel c of group g used gamma[g] and beta[g], the first num_groups "
                       "entries",
            "first_of_group": "every channel used the gamma and beta of its group's first "
                              "channel",
            "group_mean": "every channel used the average gamma and beta of its group",
        }[detail["pick"]]
    return CATALOGUE[key].render(local)


def _report_misconception(spec, ctx, cand: _Cand, err, cases) -> Report:
    parts = []
    if len(cand.keys) == 1:
        did, why, fix = _render(spec, ctx, cand, 0)
        parts += [f"What you did: {did}", f"Why it is wrong: {why}", f"What to change: {fix}"]
    else:
        parts.append("Your output matches two mistakes at once.")
        for i, key in enumerate(cand.keys):
            did, why, fix = _render(spec, ctx, cand, i)
            parts += [f"{i + 1}. {CATALOGUE[key].title} [{key}]",
                      f"What you did: {did}", f"Why it is wrong: {why}",
                      f"What to change: {fix}"]
    if err["text"]:
        parts.append(f"Largest error: {err['text']}.")
    msg = "\n".join(_wrap(p) for p in parts)
    return Report(spec.name, False, "misconception", cand.keys[0], msg, err["max"], cand.keys,
                  err["text"])


def _unknown_message(spec, cases, outs, refs, err) -> str:
    lines = ["Your function does not match the reference, and does not match any known "
             "misconception."]
    if err["text"]:
        lines.append(f"Largest error: {err['text']}.")
    good = [c.name for c, e, got, ref in zip(cases, err["per_case"], outs, refs)
            if _all_close([got], [ref], [c])]
    badl = [f"{c.name} (largest error {_g(e)})" for c, e, got, ref
            in zip(cases, err["per_case"], outs, refs) if not _all_close([got], [ref], [c])]
    lines.append(f"Sets that match the reference: {', '.join(good) or 'none'}. Sets that do "
                 f"not: {', '.join(badl)}.")
    if len(spec.outputs) > 1:
        ok = [name for i, name in enumerate(spec.outputs)
              if all(bool(_close(got[i], ref[i], c.dtype).all())
                     for c, got, ref in zip(cases, outs, refs))]
        wrong = [n for n in spec.outputs if n not in ok]
        lines.append(f"Wrong: {', '.join(wrong)}." + (f" Right: {', '.join(ok)}." if ok else ""))
    # in the worst set: which samples / channels hold the wrong values?
    worst = max(range(len(cases)), key=lambda k: err["per_case"][k])
    c = cases[worst]
    for i, (t, r) in enumerate(zip(outs[worst], refs[worst])):
        bad = ~_close(t, r, c.dtype)
        if not bool(bad.any()) or t.dim() < 2 or spec.name == "weight_standardize":
            continue
        idx = bad.nonzero()
        samples = sorted(set(int(v) for v in idx[:, 0]))
        chans = sorted(set(int(v) for v in idx[:, 1]))
        out = "" if len(spec.outputs) == 1 else f" of {spec.outputs[i]}"
        lines.append(f"In set {c.name} the wrong values{out} are in sample(s) "
                     f"{', '.join(map(str, samples))} of {t.shape[0]} and channel(s) "
                     f"{', '.join(map(str, chans))} of {t.shape[1]}.")
    lines.append("Test sets:")
    msg = "\n".join(_wrap(p) for p in lines)
    return msg + "\n" + "\n".join(_wrap(f"{c.name}: {c.label}", "  ") for c in cases)


# =======================================================================================
# for instructors
# =======================================================================================
_ABBR = {"batch_norm": "BN", "layer_norm": "LN", "instance_norm": "IN", "group_norm": "GN",
         "weight_standardize": "WS", "running_update": "run", "batch_norm_backward": "BN-bwd"}


def catalogue(op: str | None = None) -> list[Misconception]:
    """The catalogue entries (for one op, or all), in the order the checker tries them."""
    if op is not None:
        _get_op(op)
    return [m for m in _ENTRIES if op is None or op in m.ops]


def catalogue_table(op: str | None = None) -> str:
    """A compact plain-text table of the catalogue: key, ops, description."""
    rows = [(m.key, " ".join(_ABBR[o] for o in m.ops), m.description) for m in catalogue(op)]
    kw = max(len(r[0]) for r in rows)
    ow = max(max(len(r[1]) for r in rows), 3)
    dw = max(_WIDTH - kw - ow - 4, 30)
    lines = [f"{'key':<{kw}}  {'ops':<{ow}}  description", f"{'-' * kw}  {'-' * ow}  {'-' * dw}"]
    for key, ops, desc in rows:
        wrapped = textwrap.wrap(desc, dw, break_on_hyphens=False)
        lines.append(f"{key:<{kw}}  {ops:<{ow}}  {wrapped[0]}")
        lines += [f"{'':<{kw}}  {'':<{ow}}  {w}" for w in wrapped[1:]]
    legend = ", ".join(f"{v} = {k}" for k, v in _ABBR.items())
    return "\n".join(lines) + "\n" + _wrap(f"ops: {legend}")


def print_catalogue(op: str | None = None) -> None:
    """Print :func:`catalogue_table`."""
    print(catalogue_table(op))


def signature(op: str) -> str:
    """How :func:`check` calls the student's function for ``op``."""
    return _get_op(op).call_text


def reference(op: str, convention: str = "original") -> Callable:
    """A correct function with the student's signature, built on :mod:`normcore.functional`
    (what :func:`check` compares against)."""
    _get_op(op)
    if op == "batch_norm":
        return lambda x, gamma, beta, eps: functional.batch_norm(
            x, None, None, gamma, beta, training=True, eps=eps)
    if op == "layer_norm":
        return lambda x, gamma, beta, eps: functional.layer_norm(x, x.shape[1:], gamma, beta, eps)
    if op == "instance_norm":
        return lambda x, gamma, beta, eps: functional.instance_norm(
            x, weight=gamma, bias=beta, eps=eps)
    if op == "group_norm":
        return lambda x, num_groups, gamma, beta, eps: functional.group_norm(
            x, num_groups, gamma, beta, eps)
    if op == "weight_standardize":
        return lambda w, eps: functional.weight_standardize(w, eps, convention=convention)
    if op == "running_update":
        def running_update(running_mean, running_var, x, momentum):
            rm, rv = running_mean.clone(), running_var.clone()
            functional.batch_norm(x, rm, rv, training=True, momentum=momentum)
            return rm, rv
        return running_update

    def batch_norm_backward(dy, x, gamma, eps):
        return _OPS["batch_norm_backward"].reference(
            _Case("", "", {"dy": dy, "x": x, "gamma": gamma}, tuple(x.shape), x.dtype, eps))
    return batch_norm_backward


# =======================================================================================
# InstanceNorm chapter: adaptive_instance_norm (AdaIN)                   [begin IN block]
# =======================================================================================
# The student writes f(content, style, eps) -> y, with IN's statistics on both images and
# sqrt(var + eps) on both sides (normcore.functional.adaptive_instance_norm, alpha = 1).
# Each mistake is one knob of _AdaINOp.evaluate: which set the statistics are taken over,
# which image they come from, the variance's correction, where eps goes.

_ADAIN = "adaptive_instance_norm"
_ADAIN_ENTRIES = [
    Misconception(
        "adain_style_from_content", "style statistics taken from the content image", (_ADAIN,),
        "scaled and shifted with the content's own mean and std instead of the style's "
        "(the output is the content, unchanged)",
        "You de-normalized with the content's own mean and standard deviation: your output is "
        "the content image, unchanged (up to eps).",
        "AdaIN gives each channel of the content the statistics of the *style*: "
        "`std(style) * (content - mean(content)) / std(content) + mean(style)`. The content's "
        "statistics are only used to normalize it.",
        "Compute mean and std of `style` over its own spatial dims, and use them for the "
        "scale and the shift."),
    Misconception(
        "adain_stats_swapped", "content and style statistics swapped", (_ADAIN,),
        "normalized the content with the style's statistics and de-normalized with the "
        "content's: std(x) * (x - mean(y)) / std(y) + mean(x)",
        "You normalized the content with the style's mean and std, and scaled and shifted it "
        "with the content's: `std(content) * (content - mean(style)) / std(style) + "
        "mean(content)`.",
        "Normalizing must use the statistics of the tensor being normalized (the content), so "
        "that x_hat has mean 0 and std 1; then the style's statistics are put in.",
        "`std(style) * (content - mean(content)) / std(content) + mean(style)`."),
    Misconception(
        "adain_args_swapped", "content and style images swapped", (_ADAIN,),
        "returned AdaIN(style, content): the style image with the content's statistics",
        "You stylized the style image with the content's statistics: your output is "
        "AdaIN(style, content).",
        "The output keeps the content's spatial structure (its x_hat) and takes only the "
        "channel statistics from the style: its shape is the content's.",
        "Normalize `content` and give it the statistics of `style`, not the other way round."),
    Misconception(
        "adain_batch_set", "BatchNorm's set: statistics over the batch", (_ADAIN,),
        "mean and std per channel over (N, H, W) (BatchNorm's set) instead of per sample and "
        "channel over (H, W)",
        "You computed each mean and std per channel over the whole batch and the positions, "
        "{batch_dims}, which is how BatchNorm groups the elements.",
        "AdaIN uses InstanceNorm's statistics: one mean and std per sample and channel, over "
        "the positions only, so that each sample gets the style of its own style image.",
        "Reduce over the spatial dims only: `dim=tuple(range(2, x.dim()))`, with "
        "keepdim=True, for both images."),
    Misconception(
        "adain_layer_set", "LayerNorm's set: statistics over all channels", (_ADAIN,),
        "mean and std per sample over (C, H, W) (LayerNorm's set) instead of per channel over "
        "(H, W)",
        "You computed each mean and std per sample over all channels and positions, "
        "{layer_dims}, which is how LayerNorm groups the elements.",
        "Style lives in the per-channel statistics: AdaIN gives each channel its own mean and "
        "std (InstanceNorm's set, over the positions only); one mean and std for all channels "
        "would keep the content's colour balance.",
        "Reduce over the spatial dims only: `dim=tuple(range(2, x.dim()))`, with "
        "keepdim=True, for both images."),
    Misconception(
        "adain_style_no_eps", "eps left out of the style's std", (_ADAIN,),
        "scaled by sqrt(var(style)) instead of sqrt(var(style) + eps)",
        "You scaled by the style's std without eps, `sqrt(var(style))`.",
        "This exercise (and normcore.functional.adaptive_instance_norm) puts eps on both "
        "sides, `sqrt(var + eps)`, so that AdaIN(x, x) == x exactly. Set {eps_case} has a "
        "nearly constant style channel and eps = {eps_value}, where the two differ.",
        "Scale by `torch.sqrt(var_style + eps)`."),
]
_ENTRIES += _ADAIN_ENTRIES
# mistakes the forward norms share, which AdaIN's checker recognizes too
for _i, _m in enumerate(_ENTRIES):
    if _m.key in ("unbiased_var", "eps_outside_sqrt", "no_eps"):
        _ENTRIES[_i] = dataclasses.replace(_m, ops=_m.ops + (_ADAIN,))
CATALOGUE.clear()
CATALOGUE.update({m.key: m for m in _ENTRIES})
_ABBR[_ADAIN] = "AdaIN"


class _AdaINOp(_Op):
    name = _ADAIN
    call_text = "f(content, style, eps)"
    input_name = "content"
    ndims_allowed = (3, 4)
    ndims_default = (4,)

    # content shape, style shape (per rank): the first pair equal, the second not
    _SHAPES = {3: [((2, 3, 6), (2, 3, 6)), ((3, 2, 5), (3, 2, 7))],
               4: [((2, 3, 4, 5), (2, 3, 4, 5)), ((3, 4, 3, 4), (3, 4, 5, 2))]}

    def cases(self, o):
        g = torch.Generator().manual_seed(o["seed"])
        names = iter("ABCDEFGHIJ")
        out = []

        def make(shape_x, shape_y, dtype, eps, kind, extra=""):
            x = _structured(g, shape_x, dtype)
            y = (3.0 + 2.0 * _structured(g, shape_y, torch.float64)).to(dtype)
            label = (f"content of shape {_shape(shape_x)}, style {_shape(shape_y)}, "
                     f"{_dt(dtype)}{extra}")
            return _Case(next(names), label, {"content": x, "style": y}, shape_x, dtype, eps,
                         None, kind)

        for d in o["ndims"]:
            for sx, sy in self._SHAPES[d]:
                out.append(make(sx, sy, torch.float64, 1e-5, "regular"))
        top = max(o["ndims"])
        sx, sy = self._SHAPES[top][1]
        out.append(make(sx, sy, torch.float32, 1e-5, "float32"))
        # a nearly constant style channel and a large eps: only there does eps matter
        sx, sy = self._SHAPES[top][0]
        c = make(sx, sy, torch.float64, 1e-3, "nearzero",
                 ", eps=0.001; channel 1 of style sample 0 is nearly constant (std 1e-3)")
        y = c.args["style"]
        y[0, 1] = 0.5 + 1e-3 * _draw(g, tuple(y[0, 1].shape))
        out.append(c)
        return out

    def reference(self, c):
        return (functional.adaptive_instance_norm(c.args["content"], c.args["style"],
                                                  eps=c.eps),)

    def call(self, fn, c):
        return fn(c.args["content"].clone(), c.args["style"].clone(), c.eps)

    def call_hint(self, o):
        shapes = {3: "(N, C, L)", 4: "(N, C, H, W)"}
        return ("The checker calls f(content, style, eps) with content and style of shape "
                + " and ".join(shapes[d] for d in o["ndims"])
                + " (the same N and C; the style's spatial size may differ).")

    def base_spec(self, o):
        return {"set": "instance", "source": "right", "correction": 0, "eps_mode": "inside",
                "eps": "given", "style_eps": True}

    def candidates(self, o, cases):
        return [
            _cand("adain_style_from_content", {"source": "content"}),
            _cand("adain_stats_swapped", {"source": "stats_swapped"}),
            _cand("adain_args_swapped", {"source": "args_swapped"}),
            _cand("adain_batch_set", {"set": "batch"}),
            _cand("adain_layer_set", {"set": "layer"}),
            _cand("unbiased_var", {"correction": 1}),
            _cand("eps_outside_sqrt", {"eps_mode": "outside"}),
            _cand("no_eps", {"eps": "none", "eps_mode": "inside"}),
            _cand("adain_style_no_eps", {"style_eps": False}),
        ]

    @staticmethod
    def _stats(t, spec, eps, with_eps=True):
        lay = axes.layout(spec["set"], t.shape)
        tv = t.reshape(lay.view_shape)
        mean = tv.mean(lay.reduce_dims, keepdim=True)
        var = ((tv - mean) ** 2).sum(lay.reduce_dims, keepdim=True) / (
            lay.set_size - spec["correction"])
        if not with_eps:
            std = var.sqrt()
        elif spec["eps_mode"] == "inside":
            std = (var + eps).sqrt()
        else:
            std = var.sqrt() + eps
        return mean, std

    def evaluate(self, spec, c):
        x, y = c.args["content"], c.args["style"]
        eps = {"given": c.eps, "none": 0.0}[spec["eps"]]
        src = spec["source"]
        if src == "args_swapped":
            if x.shape != y.shape:
                return None
            x, y = y, x
        mx, sx = self._stats(x, spec, eps)
        my, sy = self._stats(y, spec, eps, spec["style_eps"])
        if src == "content":
            my, sy = mx, self._stats(x, spec, eps, spec["style_eps"])[1]
        elif src == "stats_swapped":
            mx, sx, my, sy = my, self._stats(y, spec, eps)[1], mx, self._stats(x, spec, eps)[1]
        return ((sy * (x - mx) / sx + my).to(c.dtype),)

    def context(self, o, cases):
        near = next(c for c in cases if c.kind == "nearzero")
        big = max(o["ndims"])
        spatial = _spatial_names(big - 2)
        return {
            "norm": "AdaIN", "eps_case": near.name, "eps_value": _g(near.eps),
            "eps_where": " for both images",
            "batch_dims": _tuple_text(["N"] + spatial),
            "layer_dims": _tuple_text(["C"] + spatial),
            "unbiased_why": (
                "AdaIN, like InstanceNorm, uses the biased variance (divide by the number of "
                "positions n). The widely copied AdaIN code calls `x.var(dim=2)`, which is "
                "unbiased (n - 1); this exercise and normcore use the biased one, as every "
                "norm layer does. For a 4 x 5 feature map the stds differ by 2.6%."),
        }


_OPS_LIST.append(_AdaINOp())
OPS[_ADAIN] = _OPS_LIST[-1].call_text
_OPS[_ADAIN] = _OPS_LIST[-1]

_reference_norms = reference


def reference(op: str, convention: str = "original") -> Callable:  # noqa: F811
    """A correct function with the student's signature, built on :mod:`normcore.functional`
    (what :func:`check` compares against)."""
    if op == _ADAIN:
        return lambda content, style, eps: functional.adaptive_instance_norm(
            content, style, eps=eps)
    return _reference_norms(op, convention)
_check_norms = check


def check(op: str, student_fn: Callable, **options) -> Report:  # noqa: F811
    """Run ``student_fn`` and the reference for ``op`` on seeded inputs; say what is wrong.

    Returns a :class:`Report`; ``print(report)`` gives the plain-text verdict.  Options:
    ``seed`` (int, default 0), ``ndims`` (the input ranks to test, e.g. ``(4,)``) and, for
    ``weight_standardize``, ``convention`` (``"original"``, ``"bit"``, ``"timm"``).
    """
    report = _check_norms(op, student_fn, **options)
    if op == _ADAIN and report.kind == "shape" and _adain_args_swapped(student_fn, options):
        # an output of the style's shape: the shape check spoke first, but the mistake has
        # a name
        spec = _OPS[op]
        o = spec.parse_options(options)
        cases = spec.cases(o)
        # the error, measured where content and style have the same shape
        same = [c for c in cases if c.args["content"].shape == c.args["style"].shape]
        outs = [(spec.call(student_fn, c).detach(),) for c in same]
        err = _largest_error(spec, same, outs, [spec.reference(c) for c in same])
        cand = _cand("adain_args_swapped", {"source": "args_swapped"})
        return _report_misconception(spec, spec.context(o, cases), cand, err, cases)
    return report


def _adain_args_swapped(fn, options) -> bool:
    """Does ``fn(content, style, eps)`` compute AdaIN(style, content) on every test set?"""
    spec = _OPS[_ADAIN]
    o = spec.parse_options(options)
    for c in spec.cases(o):
        try:
            got = spec.call(fn, c)
        except Exception:  # noqa: BLE001
            return False
        want = functional.adaptive_instance_norm(c.args["style"], c.args["content"], eps=c.eps)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape \
                or not bool(_close(got.detach(), want, c.dtype).all()):
            return False
    return True
# [end IN block] ========================================================================
