"""Checker op of Weight Standardization: ``weight_standardize``.

``f(w, eps) -> w_hat`` for a conv weight ``(C_out, C_in, kH, kW)``: one mean and one std
per output channel, over its ``C_in * kH * kW`` weights.  Three conventions are in use
(:data:`normcore.functional.WS_CONVENTIONS`); option ``convention=`` picks the one the
exercise asks for, and the other conventions become mistakes.
"""
from __future__ import annotations

import torch

from .. import axes, functional
from ..functional import WS_CONVENTIONS, normalize
from .inputs import SET_NAMES, Case, draw
from .ops import Op, register
from .report import dtype_text, shape_text
from .variants import role_layout, role_names, role_variants, spatial_names, variant

#: Each convention's formula, in words.
CONVENTION_FORMULA = {
    "original": "`(w - mean) / (std + eps)` with the unbiased std (n - 1)",
    "bit": "`(w - mean) / sqrt(var + eps)` with the biased variance (n)",
    "timm": "`(w - mean) / sqrt(var + eps)` with the biased variance (n)",
}

#: The roles one output channel's filter spans: LayerNorm's set, on the weight
#: ``(C_out, C_in, *kernel)`` read as ``(N, C, *S)``.
FILTER_ROLES = axes.TABLE["layer"].roles


class WeightStandardizeOp(Op):
    name = "weight_standardize"
    abbr = "WS"
    call_text = "f(w, eps)"
    input_name = "w"
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
            raise ValueError(f"check('weight_standardize', ...): unknown convention "
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

    def call_hint(self, options):
        shapes = {2: "(C_out, C_in)", 3: "(C_out, C_in, k)", 4: "(C_out, C_in, kH, kW)"}
        return ("The checker calls f(w, eps) with w of shape "
                + " and ".join(shapes[d] for d in options["ndims"]) + ".")

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

    def evaluate(self, spec, case):
        base = axes.layout("layer", case.shape)
        lay = base if spec["reduce"] is None else role_layout(base, spec["reduce"][1])
        if lay is None:
            return None  # this reduce set names no dim of this input (e.g. (H, W) of (N, C))
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
