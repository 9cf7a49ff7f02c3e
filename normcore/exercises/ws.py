"""Checker ops of Weight Standardization: ``weight_standardize`` and its backward pass,
``weight_standardize_backward``.

``f(w, eps) -> w_hat`` for a conv weight ``(C_out, C_in, kH, kW)``: one mean and one std
per output channel, over its ``C_in * kH * kW`` weights.  Three conventions are in use
(:data:`normcore.functional.WS_CONVENTIONS`); option ``convention=`` picks the one the
exercise asks for, and the other conventions become mistakes.  ``f(dw_hat, w, eps) -> dw``
is the gradient through it, for the same weights and conventions.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as TF

from .. import axes, functional
from ..functional import WS_CONVENTIONS, normalize
from .catalogue import Misconception, add
from .inputs import SET_NAMES, Case, draw
from .ops import Op, register
from .report import dtype_text, shape_text
from .variants import knob_stats, role_layout, role_names, role_variants, spatial_names, \
    variant

#: Each convention's formula, in words.
CONVENTION_FORMULA = {
    "original": "`(w - mean) / (std + eps)` with the unbiased std (n - 1)",
    "bit": "`(w - mean) / sqrt(var + eps)` with the biased variance (n)",
    "timm": "`(w - mean) / sqrt(var + eps)` with the biased variance (n)",
}

#: The weight's shape for each rank, in words.
WEIGHT_SHAPES = {2: "(C_out, C_in)", 3: "(C_out, C_in, k)", 4: "(C_out, C_in, kH, kW)"}
#: The roles one output channel's filter spans: LayerNorm's set, on the weight
#: ``(C_out, C_in, *kernel)`` read as ``(N, C, *S)``.
FILTER_ROLES = axes.TABLE["layer"].roles


class WeightStandardizeOp(Op):
    name = "weight_standardize"
    abbr = "WS"
    call_text = "f(w, eps)"
    input_name = "w"
    #: The arguments of the weight's shape, for :meth:`call_hint`.
    shaped_args = "w"
    outputs = ("w_hat",)
    ndims_allowed = (2, 3, 4)
    ndims_default = (4,)
    option_names = ("seed", "ndims", "convention")
    misconceptions = ("wrong_axes", "unbiased_var", "biased_var", "eps_outside_sqrt",
                      "eps_inside_sqrt", "other_convention", "no_eps")
    indexed_by_sample_and_channel = False
    shapes = {2: (4, 3), 3: (4, 3, 5), 4: (4, 3, 3, 3)}
    small = {2: (3, 2), 3: (3, 2, 2), 4: (3, 2, 2, 2)}
    shapes32 = {2: (6, 5), 3: (5, 4, 3), 4: (6, 4, 3, 3)}

    def parse_options(self, options):
        parsed = super().parse_options({k: v for k, v in options.items() if k != "convention"})
        convention = options.get("convention", "original")
        if convention not in WS_CONVENTIONS:
            raise ValueError(f"check({self.name!r}, ...): unknown convention "
                             f"{convention!r}; choose one of {sorted(WS_CONVENTIONS)}")
        parsed["convention"] = convention
        return parsed

    # ---- inputs -------------------------------------------------------------------------
    def _weight(self, gen, shape, dtype):
        w = draw(gen, shape)
        out_view = [1] * len(shape)
        out_view[0] = shape[0]
        in_view = [1] * len(shape)
        in_view[1] = shape[1]
        w = w * (0.2 + torch.rand(shape[0], generator=gen, dtype=torch.float64)).view(out_view)
        w = w + 0.5 * draw(gen, (shape[0],)).view(out_view) \
            + 0.5 * draw(gen, (shape[1],)).view(in_view)
        return w.to(dtype)

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        eps = WS_CONVENTIONS[options["convention"]]["eps"]
        names = iter(SET_NAMES)
        out = []
        for d in options["ndims"]:
            s = self.shapes[d]
            out.append(Case(next(names), f"w of shape {shape_text(s)}, float64",
                            {"w": self._weight(gen, s, torch.float64)}, s, torch.float64, eps,
                            options=options))
        top = max(options["ndims"])
        for s, dtype, kind in ((self.small[top], torch.float64, "regular"),
                               (self.shapes32[top], torch.float32, "float32")):
            out.append(Case(next(names), f"w of shape {shape_text(s)}, {dtype_text(dtype)}",
                            {"w": self._weight(gen, s, dtype)}, s, dtype, eps, kind=kind,
                            options=options))
        s = self.shapes[top]
        w = self._weight(gen, s, torch.float64)
        w[1] = 0.5 + 1e-4 * draw(gen, s[1:])
        out.append(Case(next(names), f"w of shape {shape_text(s)}, float64, eps=0.001; output "
                        f"channel 1 is nearly constant (std 1e-4), so eps matters there",
                        {"w": w}, s, torch.float64, 1e-3, kind="nearzero", options=options))
        return out

    # ---- the reference and the call -------------------------------------------------------
    def solution(self, options):
        convention = options.get("convention", "original")
        return lambda w, eps: functional.weight_standardize(w, eps, convention=convention)

    def call(self, fn, case):
        return fn(case.args["w"].clone(), case.eps)

    @staticmethod
    def torch_standardize(w, eps, convention):
        """timm's StdConv2d: torch's ``batch_norm`` over each filter of ``w`` viewed as
        ``(1, C_out, F)``, for the conventions with the biased variance; ``None`` for the
        original one (torch has no op with eps added to the unbiased std)."""
        if WS_CONVENTIONS[convention]["correction"] != 0:
            return None
        return TF.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                             momentum=0.0, eps=eps).reshape_as(w)

    def torch_kernels(self, case):
        w_hat = self.torch_standardize(case.args["w"], case.eps, case.options["convention"])
        return [] if w_hat is None else [(w_hat,)]

    def call_hint(self, options):
        return (f"The checker calls {self.call_text} with {self.shaped_args} of shape "
                + " and ".join(WEIGHT_SHAPES[d] for d in options["ndims"]) + ".")

    # ---- variants -----------------------------------------------------------------------
    def base_spec(self, options):
        conv = WS_CONVENTIONS[options["convention"]]
        return {"reduce": None, "correction": conv["correction"], "eps_mode": conv["eps_mode"],
                "eps": "given"}

    def candidates(self, options, cases):
        conv = WS_CONVENTIONS[options["convention"]]
        bases = [axes.layout("layer", c.shape) for c in cases]
        out = role_variants(bases)
        unbiased = conv["correction"] == 1
        out.append(variant("other_convention", {"correction": 0 if unbiased else 1,
                                                "eps_mode": "inside" if unbiased else "outside"}))
        out.append(variant("biased_var" if unbiased else "unbiased_var",
                           {"correction": 0 if unbiased else 1}))
        inside = conv["eps_mode"] == "inside"
        out.append(variant("eps_outside_sqrt" if inside else "eps_inside_sqrt",
                           {"eps_mode": "outside" if inside else "inside"}))
        out.append(variant("no_eps", {"eps": "none", "eps_mode": conv["eps_mode"]}))
        return out

    @staticmethod
    def reduce_layout(spec, case):
        """The filters' layout, or the one of a ``wrong_axes`` variant's reduce set (``None``
        if that set names no dim of this input, e.g. (kH, kW) of a 2-D weight)."""
        base = axes.layout("layer", case.shape)
        return base if spec["reduce"] is None else role_layout(base, spec["reduce"][1])

    def evaluate(self, spec, case):
        lay = self.reduce_layout(spec, case)
        if lay is None:
            return None
        eps = case.eps if spec["eps"] == "given" else 0.0
        return (normalize(case.args["w"], lay, eps, correction=spec["correction"],
                          eps_mode=spec["eps_mode"]).output,)

    # ---- words --------------------------------------------------------------------------
    def context(self, options, cases):
        conv = options["convention"]
        shape = self.display_case(cases).shape
        k = len(shape) - 2
        names = ["C_out", "C_in"] + (["k"] if k == 1 else [f"k{n}" for n in spatial_names(k)])
        base = axes.layout("layer", shape)
        unbiased = WS_CONVENTIONS[conv]["correction"] == 1
        near = next(c for c in cases if c.kind == "nearzero")
        other = "original" if not unbiased else "bit"
        return {
            "norm": f"Weight Standardization ('{conv}' convention)",
            "names": names, "want": role_names(FILTER_ROLES, names),
            "axes_why": "Weight Standardization standardizes each output channel's filter: one "
                        "mean and one std per output channel, over all of its weights "
                        f"{role_names(FILTER_ROLES, names)}.",
            "axes_fix": f"for w of shape {shape_text(shape)} that is `w.mean(dim="
                        f"{shape_text(base.reduce_dims)}, keepdim=True)`; in general "
                        f"`dim = tuple(range(1, w.dim()))`",
            "unbiased_why": f"The '{conv}' convention of Weight Standardization uses the biased "
                            f"variance (divide by n): {CONVENTION_FORMULA[conv]}.",
            "conv": conv, "conv_formula": CONVENTION_FORMULA[conv],
            "other_name": "original" if not unbiased else "BiT / timm",
            "other_formula": CONVENTION_FORMULA[other],
            "eps_case": near.name, "eps_where": "" if not unbiased else " (or std + eps)",
        }

    def render_fields(self, context, key, detail):
        if key == "wrong_axes":
            return {"got": role_names(detail["roles"], context["names"]), "other": ""}
        return {}

    def locate(self, case, i, idx):
        parts = [f"output channel {idx[0]}"]
        if len(idx) > 1:
            parts.append(f"input channel {idx[1]}")
        if len(idx) > 2:
            parts.append("kernel position " + (str(idx[2]) if len(idx) == 3 else
                                               "(" + ", ".join(map(str, idx[2:])) + ")"))
        return ", ".join(parts)


register(WeightStandardizeOp())


# =======================================================================================
# the backward pass of Weight Standardization
# =======================================================================================
add(Misconception(
    "ws_backward_stats_constant", "WS backward with the filter's mean and std as constants",
    "WS backward dW = d / std: the paths through each filter's mean and standard deviation "
    "are missing",
    "Your dW is `{const_grad}` (d = dL/dW_hat): you treated each filter's mean and standard "
    "deviation as constants.",
    "Both are computed from the filter's weights, so every weight moves them too, and their "
    "two paths project d: off the all-ones vector (the mean) and off W_hat (the standard "
    "deviation). The full gradient is {grad_formula}. Without the projections it neither "
    "sums to 0 over a filter nor is it orthogonal to W_hat.",
    "Subtract `{mean_term}` and `{std_term}`, per output channel."))
add(Misconception(
    "ws_backward_no_mean_grad", "WS backward without the gradient through the mean",
    "WS backward without the -mean(d) term: a filter's gradient does not sum to 0",
    "Your dW lacks the term `-{mean_term}`: it has the path through each filter's standard "
    "deviation but not the one through its mean, so a filter's gradient does not sum to 0.",
    "The mean of a filter depends on every one of its weights; its path removes the "
    "component of d along the all-ones vector (adding a constant to a filter does not change "
    "W_hat, so the gradient has no component along it). The full gradient is "
    "{grad_formula}.",
    "Also subtract `{mean_term}`, with the mean over {want} of each output channel."))
add(Misconception(
    "ws_backward_no_std_grad", "WS backward without the gradient through the std",
    "WS backward without the -W_hat mean(d W_hat) term: the gradient is not orthogonal to "
    "W_hat",
    "Your dW is `{no_std_grad}`: it has the path through each filter's mean but not the one "
    "through its standard deviation, so it is not orthogonal to W_hat.",
    "The standard deviation depends on every weight too; its path removes the component of "
    "d along W_hat (scaling a filter does not change W_hat, so up to eps the gradient has no "
    "component along it). The full gradient is {grad_formula}.",
    "Also subtract `{std_term}`, with the sum or mean over {want} of each output channel."))

#: The gradient's terms in words, for the biased conventions (r = 1/sqrt(var + eps)) and
#: the original one (s the unbiased std, eps added to it): the chapter's two formulas.
GRAD_WORDS = {
    "inside": {
        "const_grad": "r * d", "mean_term": "r * mean(d)",
        "std_term": "r * W_hat * mean(d * W_hat)", "no_std_grad": "r * (d - mean(d))",
        "grad_formula": "`dW = r * (d - mean(d) - W_hat * mean(d * W_hat))` with "
                        "`r = 1 / sqrt(var + eps)`, the means over each filter's F weights"},
    "outside": {
        "const_grad": "d / (s + eps)", "mean_term": "mean(d) / (s + eps)",
        "std_term": "W_hat * sum(d * W_hat) / ((F - 1) * s)",
        "no_std_grad": "(d - mean(d)) / (s + eps)",
        "grad_formula": "`dW = (d - mean(d)) / (s + eps) - W_hat * sum(d * W_hat) / "
                        "((F - 1) * s)` with s the unbiased std, the mean and the sum over "
                        "each filter's F weights"},
}


class WeightStandardizeBackwardOp(WeightStandardizeOp):
    """``f(dw_hat, w, eps) -> dw``: the gradient through Weight Standardization, for the
    convention of option ``convention=``.  The inputs are the forward op's weights with an
    incoming gradient; each mistake is autograd through
    :func:`normcore.functional.normalize` with a knob changed (the mean or the variance
    detached, another correction, eps elsewhere, another reduce set)."""

    name = "weight_standardize_backward"
    abbr = "WS-bwd"
    call_text = "f(dw_hat, w, eps)"
    shaped_args = "dw_hat and w"
    outputs = ("dw",)
    misconceptions = ("wrong_axes", "unbiased_var", "biased_var", "eps_outside_sqrt",
                      "eps_inside_sqrt", "other_convention", "no_eps",
                      "ws_backward_stats_constant", "ws_backward_no_mean_grad",
                      "ws_backward_no_std_grad")

    def cases(self, options):
        gen = torch.Generator().manual_seed(10_000 + options["seed"])
        out = []
        for case in super().cases(options):
            dw_hat = draw(gen, case.shape, case.dtype)      # d = dL/dW_hat
            out.append(dataclasses.replace(case, args={"dw_hat": dw_hat, **case.args}))
        return out

    def solution(self, options):
        convention = options.get("convention", "original")

        def weight_standardize_backward(dw_hat, w, eps):
            with torch.enable_grad():
                w = w.detach().clone().requires_grad_(True)
                w_hat = functional.weight_standardize(w, eps, convention=convention)
                dw, = torch.autograd.grad(w_hat, w, dw_hat)
            return dw.detach()
        return weight_standardize_backward

    def call(self, fn, case):
        return fn(case.args["dw_hat"].clone(), case.args["w"].clone(), case.eps)

    def torch_kernels(self, case):
        conv = case.options["convention"]
        if self.torch_standardize(case.args["w"], case.eps, conv) is None:
            return []
        with torch.enable_grad():
            w = case.args["w"].clone().requires_grad_(True)
            dw, = torch.autograd.grad(self.torch_standardize(w, case.eps, conv), w,
                                      case.args["dw_hat"])
        return [(dw.detach(),)]

    def base_spec(self, options):
        return {**super().base_spec(options), "mean_grad": True, "var_grad": True}

    def candidates(self, options, cases):
        return [variant("ws_backward_stats_constant", {"mean_grad": False, "var_grad": False}),
                variant("ws_backward_no_std_grad", {"var_grad": False}),
                variant("ws_backward_no_mean_grad", {"mean_grad": False}),
                ] + super().candidates(options, cases)

    def evaluate(self, spec, case):
        lay = self.reduce_layout(spec, case)
        if lay is None:
            return None
        eps = case.eps if spec["eps"] == "given" else 0.0
        with torch.enable_grad():
            w = case.args["w"].clone().requires_grad_(True)
            mean, var = knob_stats(w, lay, spec, spec["correction"])
            w_hat = normalize(w, lay, eps, mean=mean, var=var,
                              eps_mode=spec["eps_mode"]).output
            dw, = torch.autograd.grad(w_hat, w, case.args["dw_hat"])
        return (dw.detach(),)

    def context(self, options, cases):
        out = super().context(options, cases)
        out["axes_why"] += " The sums in the gradient run over the same set."
        out.update(GRAD_WORDS[WS_CONVENTIONS[options["convention"]]["eps_mode"]])
        return out


register(WeightStandardizeBackwardOp())
