"""Checker op of BatchNorm's running statistics: ``running_update``.

``f(running_mean, running_var, x, momentum) -> (new_running_mean, new_running_var)``: the
buffers' update in training mode (the unbiased batch variance is stored,
``r <- (1 - m) r + m s``).  The mistakes turn the variance ``correction``, the order of
:func:`normcore.stats.ema_update_`'s factor, or the variance formula.
"""
from __future__ import annotations

import torch

from .. import axes, functional, stats
from ..functional import normalize
from .inputs import SET_NAMES, Case, draw, large_mean, structured
from .ops import Op, register
from .report import dtype_text, number, shape_text
from .variants import variant

_INPUT_SHAPES = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)"}


class RunningUpdateOp(Op):
    name = "running_update"
    abbr = "run"
    call_text = "f(running_mean, running_var, x, momentum)"
    outputs = ("new_running_mean", "new_running_var")
    ndims_allowed = (2, 3, 4)
    ndims_default = (2, 4)
    misconceptions = ("naive_var", "biased_running_var", "momentum_swapped")
    shapes = {2: (4, 3), 3: (3, 4, 5), 4: (2, 3, 2, 2)}
    shapes32 = {2: (6, 4), 3: (2, 4, 6), 4: (3, 4, 2, 2)}
    shapes_big = {2: (8, 4), 3: (4, 4, 8), 4: (2, 4, 4, 4)}
    momenta = (0.1, 0.3, 0.2, 0.15, 0.1, 0.1)

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        momenta = iter(self.momenta)
        ndims = options["ndims"]
        top = max(ndims)
        plan = [(self.shapes[d], torch.float64, "regular") for d in ndims]
        plan.append((self.shapes32[top], torch.float32, "float32"))
        plan.append((self.shapes_big[2 if 2 in ndims else top], torch.float32, "largemean"))
        out = []
        for shape, dtype, kind in plan:
            C = shape[1]
            x = large_mean(gen, shape) if kind == "largemean" else structured(gen, shape, dtype)
            running_mean = (0.5 * draw(gen, (C,))).to(dtype)
            running_var = (0.5 + torch.rand(C, generator=gen, dtype=torch.float64)).to(dtype)
            m = next(momenta)
            label = f"x of shape {shape_text(shape)}, {dtype_text(dtype)}, momentum={m}"
            if kind == "largemean":
                label += ", values near 4096 with a spread of about 0.4 (large mean, small spread)"
            out.append(Case(next(names), label,
                            {"running_mean": running_mean, "running_var": running_var, "x": x,
                             "momentum": m}, shape, dtype, kind=kind, options=options))
        return out

    # ---- the reference and the call -------------------------------------------------------
    def solution(self, options):
        def running_update(running_mean, running_var, x, momentum):
            new_mean, new_var = running_mean.clone(), running_var.clone()
            functional.batch_norm(x, new_mean, new_var, training=True, momentum=momentum)
            return new_mean, new_var
        return running_update

    def call(self, fn, case):
        a = case.args
        return fn(a["running_mean"].clone(), a["running_var"].clone(), a["x"].clone(),
                  a["momentum"])

    def call_hint(self, options):
        return ("The checker calls " + self.call_text + " with x of shape "
                + " and ".join(_INPUT_SHAPES[d] for d in options["ndims"]) + ".")

    def expected_shapes(self, case):
        return ((case.shape[1],), (case.shape[1],))

    def shape_hint(self, i):
        return " (one value per channel)"

    # ---- variants -----------------------------------------------------------------------
    def base_spec(self, options):
        return {"correction": 1, "order": "torch", "var": "two_pass"}

    def candidates(self, options, cases):
        return [variant("biased_running_var", {"correction": 0}),
                variant("momentum_swapped", {"order": "swapped"}),
                variant("naive_var", {"var": "naive"})]

    def evaluate(self, spec, case):
        x, m = case.args["x"], case.args["momentum"]
        C = case.shape[1]
        lay = axes.layout("batch", case.shape)
        if spec["var"] == "naive":
            xv = x.reshape(lay.view_shape)
            mean = xv.mean(dim=lay.reduce_dims)
            var = stats.var_naive(xv, lay.reduce_dims, correction=spec["correction"])
        else:
            out = normalize(x, lay, 1e-5, correction=spec["correction"])
            mean, var = out.mean, out.var
        factor = m if spec["order"] == "torch" else 1.0 - m
        new_mean = stats.ema_update_(case.args["running_mean"].clone(), mean.reshape(C), factor)
        new_var = stats.ema_update_(case.args["running_var"].clone(), var.reshape(C), factor)
        return (new_mean, new_var)

    # ---- words --------------------------------------------------------------------------
    def context(self, options, cases):
        big = next(c for c in cases if c.kind == "largemean")
        lay = axes.layout("batch", big.shape)
        v = torch.var_mean(big.args["x"].double(), dim=lay.reduce_dims, correction=0)[0]
        return {"norm": "BatchNorm", "big_case": big.name, "big_var": number(float(v.mean()), 2)}

    def locate(self, case, i, idx):
        return f"channel {idx[0]}"


register(RunningUpdateOp())
