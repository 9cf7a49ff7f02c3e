"""Checker op of BatchNorm's backward pass: ``batch_norm_backward``.

``f(dy, x, gamma, eps) -> (dx, dgamma, dbeta)`` of training-mode BatchNorm.  Each mistake
is autograd through :func:`normcore.functional.normalize` with a knob changed: the mean or
the variance detached (their gradient paths dropped), gamma left out of dx, dgamma from x,
the unbiased variance, another reduce set.
"""
from __future__ import annotations

import torch

from .. import axes, functional
from ..functional import normalize
from .forward import NORM_WHY
from .inputs import SET_NAMES, Case, affine, draw, structured
from .ops import Op, locate_sample_channel, register
from .report import dtype_text, shape_text
from .variants import knob_stats, role_layout, role_names, role_variants, same_set_as, \
    spatial_names, variant

_INPUT_SHAPES = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)"}
#: The roles BatchNorm's set spans (from the table): the sums of its gradient run over them.
BATCH_ROLES = axes.TABLE["batch"].roles


class BatchNormBackwardOp(Op):
    name = "batch_norm_backward"
    abbr = "BN-bwd"
    call_text = "f(dy, x, gamma, eps)"
    outputs = ("dx", "dgamma", "dbeta")
    misconceptions = ("wrong_axes", "unbiased_var", "backward_stats_constant",
                      "backward_no_var_grad", "backward_no_mean_grad", "dgamma_uses_x",
                      "dx_without_gamma")
    shapes = {2: (4, 3), 3: (3, 4, 5), 4: (2, 3, 3, 2)}
    shapes32 = {2: (5, 4), 3: (2, 4, 6), 4: (3, 4, 2, 3)}

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        top = max(options["ndims"])
        plan = [(self.shapes[d], torch.float64, "regular") for d in options["ndims"]]
        plan.append((self.shapes32[top], torch.float32, "float32"))
        out = []
        for shape, dtype, kind in plan:
            x = structured(gen, shape, dtype)
            gamma, _ = affine(gen, (shape[1],), dtype)
            dy = draw(gen, shape, dtype)
            out.append(Case(next(names), f"x of shape {shape_text(shape)}, {dtype_text(dtype)}",
                            {"dy": dy, "x": x, "gamma": gamma}, shape, dtype, kind=kind,
                            options=options))
        return out

    # ---- the reference and the call -------------------------------------------------------
    def solution(self, options):
        def batch_norm_backward(dy, x, gamma, eps):
            with torch.enable_grad():
                x = x.detach().clone().requires_grad_(True)
                gamma = gamma.detach().clone().requires_grad_(True)
                beta = torch.zeros_like(gamma, requires_grad=True)
                y = functional.batch_norm(x, None, None, gamma, beta, training=True, eps=eps)
                grads = torch.autograd.grad(y, (x, gamma, beta), dy)
            return tuple(t.detach() for t in grads)
        return batch_norm_backward

    def call(self, fn, case):
        a = case.args
        return fn(a["dy"].clone(), a["x"].clone(), a["gamma"].clone(), case.eps)

    def call_hint(self, options):
        return ("The checker calls " + self.call_text + " with dy and x of shape "
                + " and ".join(_INPUT_SHAPES[d] for d in options["ndims"]) + ".")

    def expected_shapes(self, case):
        return (case.shape, (case.shape[1],), (case.shape[1],))

    def shape_hint(self, i):
        return (" (the shape of x)" if i == 0 else
                " (one value per channel: sum over N and the positions)")

    # ---- variants -----------------------------------------------------------------------
    def base_spec(self, options):
        return {"reduce": None, "correction": 0, "mean_grad": True, "var_grad": True,
                "dgamma": "x_hat", "dx_gamma": True}

    def candidates(self, options, cases):
        bases = [axes.layout("batch", c.shape) for c in cases]
        return [
            variant("backward_stats_constant", {"mean_grad": False, "var_grad": False}),
            variant("backward_no_var_grad", {"var_grad": False}),
            variant("backward_no_mean_grad", {"mean_grad": False}),
            variant("dx_without_gamma", {"dx_gamma": False}),
            variant("dgamma_uses_x", {"dgamma": "x"}),
            variant("unbiased_var", {"correction": 1}),
        ] + role_variants(bases)

    def evaluate(self, spec, case):
        base = axes.layout("batch", case.shape)
        lay = base if spec["reduce"] is None else role_layout(base, spec["reduce"][1])
        if lay is None:
            return None  # this reduce set names no dim of this input (e.g. (H, W) of (N, C))
        dy = case.args["dy"]

        def grads(with_gamma: bool):
            x = case.args["x"].clone().requires_grad_(True)
            gamma = case.args["gamma"].clone().requires_grad_(True)
            beta = torch.zeros_like(gamma, requires_grad=True)
            mean, var = knob_stats(x, lay, spec, spec["correction"])
            y = normalize(x, lay, case.eps, gamma if with_gamma else None, beta, mean=mean,
                          var=var).output
            return torch.autograd.grad(y, (x, gamma, beta), dy, allow_unused=True)

        with torch.enable_grad():
            dx, dgamma, dbeta = grads(True)
            if not spec["dx_gamma"]:
                dx = grads(False)[0]
        if spec["dgamma"] == "x":
            dims = [d for d in range(dy.dim()) if d != 1]
            dgamma = (dy * case.args["x"]).sum(dim=dims)
        return (dx.detach(), dgamma.detach(), dbeta.detach())

    # ---- words --------------------------------------------------------------------------
    def context(self, options, cases):
        shape = self.display_case(cases).shape
        names = ["N", "C"] + spatial_names(len(shape) - 2)
        base = axes.layout("batch", shape)
        want = role_names(BATCH_ROLES, names)
        return {
            "norm": "BatchNorm", "names": names, "want": want, "sum_dims": want,
            "axes_why": NORM_WHY["batch"] + " The sums in the gradient run over the same set.",
            "axes_fix": f"for x of shape {shape_text(shape)} that is `dim="
                        f"{shape_text(base.reduce_dims)}`; in general "
                        f"`dim = (0, *range(2, x.dim()))`",
            "unbiased_why": "The forward pass normalizes with the biased variance (divide by n), "
                            "so its gradient has 1/n where yours has 1/(n - 1).",
            "_layout": base,
        }

    def render_fields(self, context, key, detail):
        if key != "wrong_axes":
            return {}
        lay = role_layout(context["_layout"], detail["roles"])
        other = ""
        if lay is not None:
            match = same_set_as(lay, lay.shape, ("layer", "instance"))
            if match is not None:
                other = f", which is how {axes.TITLES[match]} groups the elements"
        return {"got": role_names(detail["roles"], context["names"]), "other": other}

    def locate(self, case, i, idx):
        return locate_sample_channel(idx) if i == 0 else f"channel {idx[0]}"


register(BatchNormBackwardOp())
