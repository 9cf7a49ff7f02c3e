"""Checker ops of the LayerNorm and RMSNorm chapter: ``layer_norm_shape``,
``layer_norm_backward`` and ``rms_norm``.

* ``layer_norm_shape``: ``f(x, normalized_shape, gamma, beta, eps) -> y``, LayerNorm over
  the trailing ``normalized_shape`` dims (one, two or three of them), gamma and beta of
  that shape.
* ``layer_norm_backward``: ``f(dy, x, normalized_shape, gamma, eps) -> (dx, dgamma,
  dbeta)``.
* ``rms_norm``: ``f(x, normalized_shape, gamma, eps) -> y``.

Each mistake is the reference (:func:`normcore.functional.normalize` with a LayerNorm or an
RMSNorm :class:`~normcore.axes.Layout`, or autograd through it) with one knob changed: the
reduce set (BatchNorm's set, the last dim only), gamma and beta per channel, the variance
formula (:func:`normcore.stats.var_naive`), the correction, where eps goes, the mean
subtracted in RMSNorm, the mean's or the variance's gradient path dropped (detached), gamma
taken out of the set sums as in BatchNorm.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as TF

from .. import axes, functional, stats
from ..functional import normalize
from .backward import autograd_grads
from .catalogue import Misconception, add as _add
from .forward import unbiased_why
from .inputs import SET_NAMES, Case, affine, draw, large_mean, structured
from .ops import Op, register
from .report import dtype_text, number, shape_text
from .variants import knob_stats, variant

_DIMS = ("N", "C", "H", "W")

_add(Misconception(
    "affine_per_channel", "gamma and beta per channel instead of per element",
    "LayerNorm with one gamma/beta per channel (as GroupNorm with one group) instead of one "
    "per element of normalized_shape",
    "You applied one gamma and one beta per channel (the first dim of normalized_shape), "
    "taking gamma[c, 0, ...] for every position of channel c.",
    "LayerNorm's gamma and beta have the shape of normalized_shape: one scale and one shift "
    "per element of the normalized set, so every position gets its own. One per channel is "
    "GroupNorm with one group.",
    "Multiply by the whole gamma and add the whole beta: both have shape normalized_shape "
    "and broadcast against x's trailing dims as they are."))
_add(Misconception(
    "rms_centered", "RMSNorm that subtracts the mean",
    "RMSNorm computed on x - mean (that is LayerNorm without beta)",
    "You subtracted the mean before taking the root mean square: `(x - mean) / "
    "sqrt(mean((x - mean)^2) + eps)`, which is LayerNorm without beta.",
    "RMSNorm (Zhang & Sennrich 2019) does not center: y = gamma * x / sqrt(mean(x^2) + "
    "eps). Your output agrees with it only where a set already has mean 0; in set {shift_case} "
    "the sets have nonzero means, and there the two differ.",
    "Divide x itself by `torch.sqrt((x * x).mean(dim=dims, keepdim=True) + eps)`."))
_add(Misconception(
    "rms_eps_outside", "eps added to the RMS instead of the mean square",
    "x / (rms + eps) instead of x / sqrt(mean(x^2) + eps)",
    "You added eps to the root mean square: `x / (sqrt(mean(x^2)) + eps)`.",
    "RMSNorm divides by `sqrt(mean(x^2) + eps)`: eps goes inside the square root. The two "
    "differ when the mean square is small, as in set {eps_case} (a set of values near 1e-4, "
    "with eps = {eps_value}).",
    "Compute `x / torch.sqrt((x * x).mean(dim=dims, keepdim=True) + eps)`."))
_add(Misconception(
    "ln_backward_no_mean_grad", "the gradient through the mean dropped",
    "LayerNorm backward without the -mean_S(d) term (the mean treated as a constant)",
    "Your dx is `r * (d - x_hat * mean(d * x_hat))` with d = gamma * dy: it has the term "
    "from the variance but not the one from the mean.",
    "The mean of each sample depends on every x_i of that sample; its path contributes "
    "`-mean(d)`, the mean over the normalized dims. The full formula is `dx = r * (d - "
    "mean(d) - x_hat * mean(d * x_hat))`.",
    "Also subtract `d.mean(dim=dims, keepdim=True)`, over the normalized dims."))
_add(Misconception(
    "ln_backward_no_var_grad", "the gradient through the variance dropped",
    "LayerNorm backward without the -x_hat mean_S(d x_hat) term",
    "Your dx is `r * (d - mean(d))` with d = gamma * dy: it has the term from the mean but "
    "not the one from the variance.",
    "The variance depends on x as well; its path contributes `-x_hat * mean(d * x_hat)`, "
    "the mean over the normalized dims. The full formula is `dx = r * (d - mean(d) - "
    "x_hat * mean(d * x_hat))`.",
    "Also subtract `x_hat * (d * x_hat).mean(dim=dims, keepdim=True)`."))
_add(Misconception(
    "ln_backward_gamma_outside", "gamma taken out of the sums, as in BatchNorm",
    "LayerNorm dx = gamma * r * (dy - mean(dy) - x_hat * mean(dy * x_hat)), BatchNorm's "
    "form, which is wrong when gamma varies inside the set",
    "You computed `dx = gamma * r * (dy - mean(dy) - x_hat * mean(dy * x_hat))`, with gamma "
    "outside the means, as BatchNorm's backward can be written.",
    "In BatchNorm gamma is one number per set (per channel), so it factors out of the sums "
    "over the set. In {norm} gamma has {gamma_per_set}, so the sums "
    "must be of d = gamma * dy: `dx = r * (d - mean(d) - x_hat * mean(d * x_hat))`.",
    "Form `d = gamma * dy` first and take both means of d.",
    defaults={"gamma_per_set": "one entry per element of the set"}))


def _ns_text(shape, k) -> str:
    ns = tuple(shape[len(shape) - k:])
    return shape_text(ns)


def _ln_layout(shape, k, norm="layer"):
    return axes.layout(norm, shape, normalized_ndim=k)


def _reduce_layout(lay, which):
    """LN's layout, or the input (unflattened) reduced over the batch dim or over its last
    dim only; gamma and beta still broadcast against the trailing dims."""
    if which == "layer":
        return lay
    shape, nd, k = tuple(lay.shape), len(lay.shape), len(lay.affine_shape)
    dims = (0,) if which == "batch" else (nd - 1,)
    return dataclasses.replace(lay, view_shape=shape, reduce_dims=dims,
                               affine_view_shape=(1,) * (nd - k) + tuple(lay.affine_shape))


def _per_channel(t, k):
    """gamma[c, 0, ...] for every position of channel c (the first normalized dim)."""
    if k == 1:
        return t
    first = t[(slice(None),) + (slice(0, 1),) * (k - 1)]
    return first.expand(t.shape).clone()


def _axes_words(shape, k):
    names = list(_DIMS[4 - len(shape):]) if len(shape) <= 4 else [f"d{i}" for i in range(len(shape))]
    return names


class _LayerShapeBase(Op):
    """What the LayerNorm-shaped ops share: inputs with 1, 2 or 3 normalized dims."""

    ndims_allowed = ndims_default = (1, 2, 3)    # here: len(normalized_shape)
    indexed_by_sample_and_channel = False
    #: len(normalized_shape) -> (shape of the float64 set, shape of the float32 set)
    shapes = {1: (3, 4, 6), 2: (4, 3, 5), 3: (2, 3, 2, 4)}
    shapes32 = {1: (4, 8), 2: (3, 4, 5), 3: (2, 3, 2, 3)}

    def locate(self, case, i, idx):
        return "index (" + ", ".join(map(str, idx)) + ")"

    def render_fields(self, context, key, detail):
        """The wrong set in words: the forward ops' two wrong sets (BN's, the last dim)."""
        if key != "wrong_axes":
            return {}
        if detail["roles"] == ("N",):
            return {"got": "the batch dim (N)", "other": ", which is how BatchNorm groups "
                    "the elements"}
        return {"got": "the last dim only", "other": " (for a normalized_shape of two or "
                "three dims)"}

    def _words(self, options, cases):
        k = max(options["ndims"])
        shape = self.shapes[k]
        names = _axes_words(shape, k)
        return shape, k, names


# ---------------------------------------------------------------------------------------
# LayerNorm forward over any normalized_shape
# ---------------------------------------------------------------------------------------
class LayerNormShapeOp(_LayerShapeBase):
    name = "layer_norm_shape"
    abbr = "LN-ns"
    call_text = "f(x, normalized_shape, gamma, beta, eps)"
    misconceptions = ("wrong_axes", "unbiased_var", "eps_outside_sqrt", "naive_var",
                      "affine_per_channel")

    def _case(self, gen, name, shape, k, dtype, eps, kind, options, x=None, extra=""):
        x = structured(gen, shape, dtype) if x is None else x
        ns = tuple(shape[len(shape) - k:])
        gamma, beta = affine(gen, ns, dtype)
        label = (f"x of shape {shape_text(shape)}, normalized_shape {shape_text(ns)}, "
                 f"{dtype_text(dtype)}{extra}")
        return Case(name, label, {"x": x, "normalized_shape": ns, "gamma": gamma, "beta": beta},
                    shape, dtype, eps, None, kind, options)

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        out = [self._case(gen, next(names), self.shapes[k], k, torch.float64, 1e-5, "regular",
                          options) for k in options["ndims"]]
        top = max(options["ndims"])
        out.append(self._case(gen, next(names), self.shapes32[top], top, torch.float32, 1e-5,
                              "float32", options))
        shape = self.shapes[top]
        x = structured(gen, shape, torch.float64)
        x[1] = 0.5 + 1e-4 * draw(gen, shape[1:])
        out.append(self._case(gen, next(names), shape, top, torch.float64, 1e-3, "nearzero",
                              options, x=x, extra=", eps=0.001; sample 1 is nearly constant "
                              "(std 1e-4), so eps matters there"))
        big = (2, 4, 8)                                    # 32 = 2^5 values per set
        kb = min(top, 2)
        out.append(self._case(gen, next(names), big, kb, torch.float32, 1e-5, "largemean",
                              options, x=large_mean(gen, big), extra=", values near 4096 "
                              "with a spread of about 0.4 (large mean, small spread)"))
        return out

    def solution(self, options):
        def layer_norm(x, normalized_shape, gamma, beta, eps):
            return functional.layer_norm(x, normalized_shape, gamma, beta, eps)
        return layer_norm

    def call(self, fn, case):
        a = case.args
        return fn(a["x"].clone(), tuple(a["normalized_shape"]), a["gamma"].clone(),
                  a["beta"].clone(), case.eps)

    def torch_kernels(self, case):
        a = case.args
        return [(TF.layer_norm(a["x"], a["normalized_shape"], a["gamma"], a["beta"],
                              case.eps),)]

    def call_hint(self, options):
        return ("The checker calls " + self.call_text + " with normalized_shape a tuple of "
                + " or ".join(str(k) for k in options["ndims"]) + " trailing dims of x.")

    def base_spec(self, options):
        return {"reduce": "layer", "correction": 0, "eps_mode": "inside", "var": "two-pass",
                "affine": "element"}

    def candidates(self, options, cases):
        return [
            variant("wrong_axes", {"reduce": "batch"}, roles=("N",)),
            variant("wrong_axes", {"reduce": "last"}, roles=("last",)),
            variant("affine_per_channel", {"affine": "channel"}),
            variant("unbiased_var", {"correction": 1}),
            variant("eps_outside_sqrt", {"eps_mode": "outside"}),
            variant("naive_var", {"var": "naive"}),
        ]

    def evaluate(self, spec, case):
        x, k = case.args["x"], len(case.args["normalized_shape"])
        lay = _reduce_layout(_ln_layout(case.shape, k), spec["reduce"])
        gamma, beta = case.args["gamma"], case.args["beta"]
        if spec["affine"] == "channel":
            gamma, beta = _per_channel(gamma, k), _per_channel(beta, k)
        if spec["var"] == "naive":
            xv = x.reshape(lay.view_shape)
            mean = xv.mean(lay.reduce_dims, keepdim=True)
            var = stats.var_naive(xv, lay.reduce_dims, correction=spec["correction"],
                                  keepdim=True)
            return (normalize(x, lay, case.eps, gamma, beta, mean=mean, var=var,
                              eps_mode=spec["eps_mode"]).output,)
        return (normalize(x, lay, case.eps, gamma, beta, correction=spec["correction"],
                          eps_mode=spec["eps_mode"]).output,)

    def context(self, options, cases):
        shape, k, names = self._words(options, cases)
        want = "the trailing normalized_shape dims of each sample"
        near = next(c for c in cases if c.kind == "nearzero")
        big = next(c for c in cases if c.kind == "largemean")
        kb = len(big.args["normalized_shape"])
        big_var = torch.var_mean(big.args["x"].double(), dim=tuple(range(3 - kb, 3)),
                                 correction=0)[0].mean()
        return {
            "norm": "LayerNorm", "names": names, "want": want,
            "axes_why": ("LayerNorm gives each sample (each index of the leading dims) one "
                         "mean and one variance, over all of the trailing normalized_shape "
                         "dims, and nothing is shared across the batch."),
            "axes_fix": ("`dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))`, "
                         "then `x.mean(dim=dims, keepdim=True)`"),
            "unbiased_why": unbiased_why("LayerNorm", running_var=False),
            "eps_case": near.name, "eps_value": number(near.eps), "eps_where": "",
            "big_case": big.name, "big_var": number(float(big_var), 2),
        }


# ---------------------------------------------------------------------------------------
# LayerNorm backward
# ---------------------------------------------------------------------------------------
class LayerNormBackwardOp(_LayerShapeBase):
    name = "layer_norm_backward"
    abbr = "LN-bwd"
    call_text = "f(dy, x, normalized_shape, gamma, eps)"
    outputs = ("dx", "dgamma", "dbeta")
    misconceptions = ("wrong_axes", "ln_backward_no_mean_grad", "ln_backward_no_var_grad",
                      "ln_backward_gamma_outside", "dgamma_uses_x")

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        plan = [(self.shapes[k], k, torch.float64, "regular") for k in options["ndims"]]
        top = max(options["ndims"])
        plan.append((self.shapes32[top], top, torch.float32, "float32"))
        out = []
        for shape, k, dtype, kind in plan:
            ns = tuple(shape[len(shape) - k:])
            x = structured(gen, shape, dtype)
            gamma, _ = affine(gen, ns, dtype)
            dy = draw(gen, shape, dtype)
            out.append(Case(next(names), f"x of shape {shape_text(shape)}, normalized_shape "
                            f"{shape_text(ns)}, {dtype_text(dtype)}",
                            {"dy": dy, "x": x, "normalized_shape": ns, "gamma": gamma},
                            shape, dtype, kind=kind, options=options))
        return out

    def torch_kernels(self, case):
        a, ns = case.args, case.args["normalized_shape"]
        return [autograd_grads(lambda x, w, b: TF.layer_norm(x, ns, w, b, case.eps),
                               a["dy"], a["x"], a["gamma"])]

    def solution(self, options):
        def layer_norm_backward(dy, x, normalized_shape, gamma, eps):
            return autograd_grads(lambda x, w, b: functional.layer_norm(
                x, normalized_shape, w, b, eps), dy, x, gamma)
        return layer_norm_backward

    def call(self, fn, case):
        a = case.args
        return fn(a["dy"].clone(), a["x"].clone(), tuple(a["normalized_shape"]),
                  a["gamma"].clone(), case.eps)

    def expected_shapes(self, case):
        ns = tuple(case.args["normalized_shape"])
        return (case.shape, ns, ns)

    def shape_hint(self, i):
        return (" (the shape of x)" if i == 0 else
                " (normalized_shape: sum over the leading, sample dims)")

    def base_spec(self, options):
        return {"reduce": "layer", "mean_grad": True, "var_grad": True, "gamma": "inside",
                "dgamma": "x_hat"}

    def candidates(self, options, cases):
        return [
            variant("ln_backward_no_var_grad", {"var_grad": False}),
            variant("ln_backward_no_mean_grad", {"mean_grad": False}),
            variant("ln_backward_gamma_outside", {"gamma": "outside"}),
            variant("dgamma_uses_x", {"dgamma": "x"}),
            variant("wrong_axes", {"reduce": "batch"}, roles=("N",)),
        ]

    def evaluate(self, spec, case):
        k = len(case.args["normalized_shape"])
        lay = _reduce_layout(_ln_layout(case.shape, k), spec["reduce"])
        dy, x0, g0 = case.args["dy"], case.args["x"], case.args["gamma"]
        lead = tuple(range(x0.dim() - k))

        def grads(gamma_in_graph: bool, dy_in):
            x = x0.clone().requires_grad_(True)
            gamma = g0.clone().requires_grad_(True)
            beta = torch.zeros_like(gamma, requires_grad=True)
            mean, var = knob_stats(x, lay, spec)
            y = normalize(x, lay, case.eps, gamma if gamma_in_graph else None, beta,
                          mean=mean, var=var).output
            return torch.autograd.grad(y, (x, gamma, beta), dy_in, allow_unused=True)

        with torch.enable_grad():
            dx, dgamma, dbeta = grads(True, dy)
            if spec["gamma"] == "outside":
                # BatchNorm's form: the set sums of dy, then one factor gamma on the outside
                dx = grads(False, dy)[0] * g0
        if dgamma is None:
            dgamma = torch.zeros_like(g0)
        if spec["dgamma"] == "x":
            dgamma = (dy * x0).sum(dim=lead)
        return (dx.detach(), dgamma.detach(), dbeta.detach())

    def context(self, options, cases):
        shape, k, names = self._words(options, cases)
        return {
            "norm": "LayerNorm", "names": names,
            "want": "the trailing normalized_shape dims of each sample",
            "sum_dims": "the leading (sample) dims",
            "axes_why": ("LayerNorm's sets are the normalized dims of each sample; the sums "
                         "in the gradient of x run over the same set, and those of gamma and "
                         "beta over the samples."),
            "axes_fix": ("`dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))` "
                         "for the means in dx"),
        }

    def render_fields(self, context, key, detail):
        if key != "wrong_axes":
            return {}
        return {"got": "the batch dim (N)", "other": ", which is how BatchNorm groups the "
                "elements"}

    def locate(self, case, i, idx):
        return "index (" + ", ".join(map(str, idx)) + ")" + ("" if i == 0 else " of gamma")


# ---------------------------------------------------------------------------------------
# RMSNorm forward
# ---------------------------------------------------------------------------------------
class RMSNormOp(_LayerShapeBase):
    name = "rms_norm"
    abbr = "RMS"
    call_text = "f(x, normalized_shape, gamma, eps)"
    misconceptions = ("wrong_axes", "rms_centered", "rms_eps_outside")

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        plan = [(self.shapes[k], k, torch.float64, 1e-5, "regular") for k in options["ndims"]]
        top = max(options["ndims"])
        plan.append((self.shapes32[top], top, torch.float32, 1e-5, "float32"))
        plan.append((self.shapes[top], top, torch.float64, 1e-3, "nearzero"))
        out = []
        for shape, k, dtype, eps, kind in plan:
            ns = tuple(shape[len(shape) - k:])
            x = structured(gen, shape, dtype)
            extra = ""
            if kind == "nearzero":
                x[1] = 1e-4 * draw(gen, shape[1:], dtype)
                extra = ", eps=0.001; sample 1 holds values near 1e-4, so eps matters there"
            gamma, _ = affine(gen, ns, dtype)
            out.append(Case(next(names), f"x of shape {shape_text(shape)}, normalized_shape "
                            f"{shape_text(ns)}, {dtype_text(dtype)}{extra}",
                            {"x": x, "normalized_shape": ns, "gamma": gamma},
                            shape, dtype, eps, None, kind, options))
        return out

    def torch_kernels(self, case):
        a = case.args
        return [(TF.rms_norm(a["x"], a["normalized_shape"], a["gamma"], case.eps),)]

    def solution(self, options):
        def rms_norm(x, normalized_shape, gamma, eps):
            return functional.rms_norm(x, normalized_shape, gamma, eps)
        return rms_norm

    def call(self, fn, case):
        a = case.args
        return fn(a["x"].clone(), tuple(a["normalized_shape"]), a["gamma"].clone(), case.eps)

    def base_spec(self, options):
        return {"reduce": "layer", "center": False, "eps_mode": "inside"}

    def candidates(self, options, cases):
        return [
            variant("rms_centered", {"center": True}),
            variant("rms_eps_outside", {"eps_mode": "outside"}),
            variant("wrong_axes", {"reduce": "batch"}, roles=("N",)),
            variant("wrong_axes", {"reduce": "last"}, roles=("last",)),
        ]

    def evaluate(self, spec, case):
        x, k, gamma = case.args["x"], len(case.args["normalized_shape"]), case.args["gamma"]
        # RMSNorm's layout (uncentered), or LayerNorm's when the mean is subtracted
        lay = _reduce_layout(_ln_layout(case.shape, k, "layer" if spec["center"] else "rms"),
                             spec["reduce"])
        return (normalize(x, lay, case.eps, gamma, eps_mode=spec["eps_mode"]).output,)

    def context(self, options, cases):
        shape, k, names = self._words(options, cases)
        near = next(c for c in cases if c.kind == "nearzero")
        return {
            "norm": "RMSNorm", "names": names,
            "want": "the trailing normalized_shape dims of each sample",
            "axes_why": ("RMSNorm's sets are LayerNorm's: the trailing normalized_shape dims "
                         "of each sample; nothing is shared across the batch."),
            "axes_fix": ("`dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))`, "
                         "then `(x * x).mean(dim=dims, keepdim=True)`"),
            "eps_case": near.name, "eps_value": number(near.eps),
            "shift_case": cases[0].name,
        }


for _op in (LayerNormShapeOp(), LayerNormBackwardOp(), RMSNormOp()):
    register(_op)
del _op
