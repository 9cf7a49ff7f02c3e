"""Checker op of deploying Weight Standardization: ``fold_ws``.

``f(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn) -> (weight,
bias)``: a WS convolution (``weight`` ``(C_out, C_in, kH, kW)``, ``bias``, the convention of
option ``convention=`` with ``eps_ws``) followed by an eval-mode BatchNorm (``gamma``,
``beta``, the running buffers, ``eps_bn``), folded into one plain ``Conv2d``
(:func:`normcore.fold.fold_ws`, then :func:`normcore.fold.fold_bn`).

Its mistakes are those of the two steps, and of their order: each is the forward op's
standardization (:class:`~.ws.WeightStandardizeOp`) and the BatchNorm folding op's
(:class:`~.running.FoldBatchNormOp`) with a knob turned, composed, not a third
implementation.
"""
from __future__ import annotations

import dataclasses

import torch

from .. import fold
from ..functional import WS_CONVENTIONS
from ..nn import WSConv2d
from .catalogue import Misconception, add
from .inputs import SET_NAMES, Case, affine, draw
from .ops import register
from .report import dtype_text, shape_text
from .running import FoldBatchNormOp, fold_with_bn
from .variants import variant
from .ws import WeightStandardizeOp

add(Misconception(
    "fold_ws_raw_weight", "the raw weight folded instead of the standardized one",
    "folded weight s * W from the raw weight: the standardization is left out",
    "Your folded weight is `s * W`: BatchNorm's scale times the raw weight.",
    "The WS convolution computes with the standardized weight W_hat, not with W. At "
    "inference W_hat is a constant, and that constant is what the plain convolution must "
    "hold; BatchNorm then scales it, so the folded weight is `s * W_hat` with "
    "`s = gamma / sqrt(running_var + eps_bn)`.",
    "Standardize first ({conv_formula}, with eps_ws), then scale: "
    "`s.view(-1, 1, 1, 1) * w_hat`."))
add(Misconception(
    "fold_ws_bn_before_ws", "BatchNorm folded in before the standardization",
    "folded weight WS(s * W): BN's scale put into the raw weight, which WS then undoes",
    "Your folded weight is the standardization of `s * W`: you folded BatchNorm's scale "
    "into the raw weight, then standardized.",
    "Standardizing divides each filter by its own standard deviation, so it removes any "
    "positive scale of the filter: WS(s_c W_c) = WS(W_c) (up to eps), and BatchNorm's scale "
    "is lost. In the block WS comes first and BatchNorm scales its result, so the folded "
    "weight is `s * W_hat`.",
    "Standardize the raw weight first, then multiply by s: `s.view(-1, 1, 1, 1) * w_hat`."))
add(Misconception(
    "fold_bias_dropped", "the layer's own bias left out of the folded bias",
    "folded bias beta - s * running_mean: the convolution's bias b is missing",
    "Your folded bias is `beta - s * running_mean`: the convolution's own bias is missing.",
    "The WS convolution adds its bias (which is not standardized) before BatchNorm, and "
    "BatchNorm scales it with the rest: `s * (W_hat x + b - running_mean) + beta`. Only a "
    "convolution without bias (bias=False) has b = 0.",
    "`b' = s * (b - running_mean) + beta`."))

_WS = WeightStandardizeOp()
_BN = FoldBatchNormOp()


class FoldWeightStandardizeOp(WeightStandardizeOp):
    name = "fold_ws"
    abbr = "fold-WS"
    call_text = "f(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn)"
    input_name = "weight"
    shaped_args = "weight"
    outputs = ("weight", "bias")
    ndims_allowed = ndims_default = (4,)
    misconceptions = ("unbiased_var", "biased_var", "eps_outside_sqrt", "eps_inside_sqrt",
                      "other_convention", "no_eps", "fold_no_mean", "fold_bias_unscaled",
                      "fold_no_sqrt", "fold_ws_raw_weight", "fold_ws_bn_before_ws",
                      "fold_bias_dropped")

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        eps = WS_CONVENTIONS[options["convention"]]["eps"]
        names = iter(SET_NAMES)
        plan = [(self.shapes[4], torch.float64, "regular", eps, 1e-5),
                (self.small[4], torch.float64, "regular", eps, 1e-5),
                (self.shapes32[4], torch.float32, "float32", eps, 1e-5),
                (self.shapes[4], torch.float64, "nearzero", 1e-3, 1e-3)]
        out = []
        for shape, dtype, kind, eps_ws, eps_bn in plan:
            C = shape[0]
            w = self._weight(gen, shape, torch.float64)
            var = 0.5 + 1.5 * torch.rand(C, generator=gen, dtype=torch.float64)
            label = f"weight of shape {shape_text(shape)}, {dtype_text(dtype)}"
            if kind == "nearzero":
                w[1] = 0.5 + 1e-4 * draw(gen, shape[1:])
                var[2] = 1e-6
                label += (", eps_ws=eps_bn=0.001; output channel 1 is nearly constant (std "
                          "1e-4) and channel 2 has running_var 1e-6, so both eps matter")
            gamma, beta = affine(gen, (C,), dtype)
            args = {"weight": w.to(dtype), "bias": draw(gen, (C,), dtype), "eps_ws": eps_ws,
                    "gamma": gamma, "beta": beta,
                    "running_mean": (2.0 * draw(gen, (C,))).to(dtype),
                    "running_var": var.to(dtype), "eps_bn": eps_bn}
            out.append(Case(next(names), label, args, shape, dtype, eps_bn, kind=kind,
                            options=options))
        return out

    # ---- the reference and the call -------------------------------------------------------
    def solution(self, options):
        convention = options.get("convention", "original")

        def fold_ws(weight, bias, eps_ws, gamma, beta, running_mean, running_var, eps_bn):
            C_out, C_in = weight.shape[:2]
            conv = WSConv2d(C_in, C_out, tuple(weight.shape[2:]), ws_eps=eps_ws,
                            convention=convention, dtype=weight.dtype)
            # fold_bn(fold_ws(conv), bn)
            return fold_with_bn(conv, weight, bias, gamma, beta, running_mean, running_var,
                                eps_bn, prepare=fold.fold_ws)
        return fold_ws

    def call(self, fn, case):
        a = case.args
        return fn(a["weight"].clone(), a["bias"].clone(), a["eps_ws"], a["gamma"].clone(),
                  a["beta"].clone(), a["running_mean"].clone(), a["running_var"].clone(),
                  a["eps_bn"])

    def torch_kernels(self, case):
        """timm's standardization, then torch's own folding (``fuse_conv_bn_weights``);
        none for the original convention (see :meth:`WeightStandardizeOp.torch_standardize`)."""
        a = case.args
        w_hat = self.torch_standardize(a["weight"], a["eps_ws"], case.options["convention"])
        if w_hat is None:
            return []
        return _BN.torch_kernels(dataclasses.replace(case, args={**a, "weight": w_hat},
                                                     eps=a["eps_bn"]))

    def expected_shapes(self, case):
        return _BN.expected_shapes(case)

    def shape_hint(self, i):
        return _BN.shape_hint(i)

    # ---- variants: the WS op's knobs, the BN folding op's knobs, and their order ---------
    def base_spec(self, options):
        ws = {f"ws_{k}": v for k, v in super().base_spec(options).items()}
        return {**ws, **_BN.base_spec(options), "weight": "standardized", "bias": True}

    def candidates(self, options, cases):
        out = [variant("fold_ws_raw_weight", {"weight": "raw"}),
               variant("fold_ws_bn_before_ws", {"weight": "bn_first"}),
               variant("fold_bias_dropped", {"bias": False})]
        for cand in super().candidates(options, cases):      # the standardization's own
            if cand.keys[0] != "wrong_axes":
                out.append(dataclasses.replace(
                    cand, changes=tuple((f"ws_{k}", v) for k, v in cand.changes),
                    details=((("part", "ws"),),)))
        for cand in _BN.candidates(options, cases):           # BatchNorm's folding
            out.append(dataclasses.replace(cand, details=((("part", "bn"),),)))
        return out

    def evaluate(self, spec, case):
        a = case.args
        ws_spec = {k[3:]: v for k, v in spec.items() if k.startswith("ws_")}

        def standardize(w):
            return _WS.evaluate(ws_spec, dataclasses.replace(case, args={"w": w},
                                                             eps=a["eps_ws"]))[0]

        def fold_bn(w):
            bias = a["bias"] if spec["bias"] else torch.zeros_like(a["bias"])
            return _BN.evaluate(spec, dataclasses.replace(
                case, args={**a, "weight": w, "bias": bias}, eps=a["eps_bn"]))

        if spec["weight"] == "bn_first":                    # WS(s W), s (b - mu) + beta
            weight, bias = fold_bn(a["weight"])
            return (standardize(weight), bias)
        w = a["weight"] if spec["weight"] == "raw" else standardize(a["weight"])
        return fold_bn(w)                                  # s W_hat, s (b - mu) + beta

    # ---- words --------------------------------------------------------------------------
    def context(self, options, cases):
        return {**super().context(options, cases), "norm": "BatchNorm",
                "eps_where": " (here `s = gamma / torch.sqrt(running_var + eps_bn)`)"}

    def render_fields(self, context, key, detail):
        if detail.get("part") != "ws":
            return {}
        conv = context["conv"]
        std = "; `std + eps` in this convention" if conv == "original" else ""
        return {"norm": f"Weight Standardization ('{conv}' convention)",
                "eps_where": f" in the standardization (eps = eps_ws{std})"}

    def locate(self, case, i, idx):
        if i == 1:
            return f"output channel {idx[0]}"
        return _WS.locate(case, i, idx)


register(FoldWeightStandardizeOp())
