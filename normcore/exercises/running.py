"""Checker ops of the running-statistics chapter: ``running_update``, ``fold_bn``,
``chan_merge``.

``f(running_mean, running_var, x, momentum) -> (new_running_mean, new_running_var)``: the
buffers' update in training mode (the unbiased batch variance is stored,
``r <- (1 - m) r + m s``).  The mistakes turn the variance ``correction``, the order of
:func:`normcore.stats.ema_update_`'s factor, or the variance formula.

``fold_bn`` folds an eval-mode BatchNorm into the ``Linear``/``ConvNd`` before it
(:func:`normcore.fold.fold_bn`); ``chan_merge`` merges the moments of two parts with
Chan's formula (:func:`normcore.stats.chan_merge`).  Their own mistakes are added to the
catalogue here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF
from torch.nn.utils import fusion

from .. import axes, fold, functional, stats
from ..functional import normalize
from .catalogue import Misconception, add
from .inputs import SET_NAMES, Case, affine, draw, large_mean, structured
from .ops import Op, locate_sample_channel, register
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

    def torch_kernels(self, case):
        a = case.args
        mean, var = a["running_mean"].clone(), a["running_var"].clone()
        TF.batch_norm(a["x"], mean, var, training=True, momentum=a["momentum"])
        return [(mean, var)]

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


# =======================================================================================
# folding an eval-mode BatchNorm into the layer before it
# =======================================================================================
add(Misconception(
    "fold_no_mean", "running mean left out of the folded bias",
    "folded bias s * b + beta: the - s * running_mean term is missing",
    "Your folded bias is `s * b + beta`: the running mean is not subtracted.",
    "In eval mode BatchNorm computes `s * (z - running_mean) + beta` with "
    "`s = gamma / sqrt(running_var + eps)`; with `z = W x + b` that is "
    "`(s W) x + s * (b - running_mean) + beta`.",
    "`b' = s * (b - running_mean) + beta`."))
add(Misconception(
    "fold_bias_unscaled", "bias folded without the scale",
    "folded bias b - s * running_mean + beta: the layer's own bias is not scaled by s",
    "Your folded bias adds the layer's bias b unscaled: `b - s * running_mean + beta`.",
    "BatchNorm scales everything that comes out of the layer, its bias included: "
    "`s * (W x + b - running_mean) + beta`.",
    "`b' = s * (b - running_mean) + beta`."))
add(Misconception(
    "fold_no_sqrt", "divided by the variance instead of the std",
    "scale gamma / (running_var + eps) instead of gamma / sqrt(running_var + eps)",
    "You divided gamma by `running_var + eps`, without the square root.",
    "BatchNorm divides by the standard deviation: `s = gamma / sqrt(running_var + eps)`.",
    "`s = gamma / torch.sqrt(running_var + eps)`."))


def fold_with_bn(layer, weight, bias, gamma, beta, running_mean, running_var, eps,
                 prepare=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(weight, bias)`` of :func:`normcore.fold.fold_bn` applied to ``layer`` (given
    ``weight`` and ``bias``, then passed through ``prepare`` if any) and an eval-mode
    BatchNorm with these values: the folding ops' one reference."""
    bn = torch.nn.BatchNorm1d(len(gamma), eps=eps, dtype=weight.dtype).eval()
    with torch.no_grad():
        for module, values in ((layer, (weight, bias)), (bn, (gamma, beta))):
            module.weight.copy_(values[0])
            module.bias.copy_(values[1])
        bn.running_mean.copy_(running_mean)
        bn.running_var.copy_(running_var)
    fused = fold.fold_bn(layer if prepare is None else prepare(layer), bn)
    return fused.weight.detach(), fused.bias.detach()


class FoldBatchNormOp(Op):
    """``f(weight, bias, gamma, beta, running_mean, running_var, eps) -> (weight, bias)``:
    the weight and bias of ``Linear`` or ``ConvNd`` followed by an eval-mode BatchNorm,
    folded into one layer (:func:`normcore.fold.fold_bn`)."""

    name = "fold_bn"
    abbr = "fold"
    call_text = "f(weight, bias, gamma, beta, running_mean, running_var, eps)"
    input_name = "weight"
    outputs = ("weight", "bias")
    ndims_allowed = (2, 3, 4)
    ndims_default = (2, 4)
    misconceptions = ("eps_outside_sqrt", "no_eps", "fold_no_mean", "fold_bias_unscaled",
                      "fold_no_sqrt")
    indexed_by_sample_and_channel = False
    shapes = {2: (4, 5), 3: (3, 2, 3), 4: (4, 3, 2, 2)}
    shapes32 = {2: (6, 3), 3: (5, 2, 3), 4: (5, 2, 3, 3)}

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        top = max(options["ndims"])
        plan = [(self.shapes[d], torch.float64, "regular", 1e-5) for d in options["ndims"]]
        plan.append((self.shapes32[top], torch.float32, "float32", 1e-5))
        plan.append((self.shapes[top], torch.float64, "nearzero", 1e-3))
        out = []
        for shape, dtype, kind, eps in plan:
            C = shape[0]
            args = {"weight": draw(gen, shape, dtype), "bias": draw(gen, (C,), dtype)}
            args["gamma"], args["beta"] = affine(gen, (C,), dtype)
            args["running_mean"] = (2.0 * draw(gen, (C,))).to(dtype)
            var = 0.5 + 1.5 * torch.rand(C, generator=gen, dtype=torch.float64)
            label = f"weight of shape {shape_text(shape)}, {dtype_text(dtype)}"
            if kind == "nearzero":
                var[1] = 1e-6
                label += (", eps=0.001; channel 1 has running_var 1e-6, so eps matters "
                          "there")
            args["running_var"] = var.to(dtype)
            out.append(Case(next(names), label, args, shape, dtype, eps, kind=kind,
                            options=options))
        return out

    def solution(self, options):
        def fold_bn(weight, bias, gamma, beta, running_mean, running_var, eps):
            C_out, C_in = weight.shape[:2]
            kernel = tuple(weight.shape[2:])
            kw = {"dtype": weight.dtype}
            layer = (torch.nn.Linear(C_in, C_out, **kw) if not kernel else
                     (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[len(kernel) - 1](
                         C_in, C_out, kernel, **kw))
            return fold_with_bn(layer, weight, bias, gamma, beta, running_mean, running_var,
                                eps)
        return fold_bn

    def call(self, fn, case):
        a = case.args
        return fn(a["weight"].clone(), a["bias"].clone(), a["gamma"].clone(), a["beta"].clone(),
                  a["running_mean"].clone(), a["running_var"].clone(), case.eps)

    def torch_kernels(self, case):
        a = case.args
        fuse = fusion.fuse_linear_bn_weights if a["weight"].dim() == 2 else \
            fusion.fuse_conv_bn_weights
        w, b = fuse(a["weight"], a["bias"], a["running_mean"], a["running_var"], case.eps,
                    a["gamma"], a["beta"])
        return [(w.detach(), b.detach())]

    def call_hint(self, options):
        shapes = {2: "(C_out, C_in)", 3: "(C_out, C_in, k)", 4: "(C_out, C_in, kH, kW)"}
        return ("The checker calls " + self.call_text + " with weight of shape "
                + " and ".join(shapes[d] for d in options["ndims"]) + ".")

    def expected_shapes(self, case):
        return (case.shape, (case.shape[0],))

    def shape_hint(self, i):
        return " (the shape of weight)" if i == 0 else " (one value per output channel)"

    def base_spec(self, options):
        return {"eps_mode": "inside", "eps": "given", "sqrt": True, "mean": True,
                "bias_scaled": True}

    def candidates(self, options, cases):
        return [variant("fold_no_mean", {"mean": False}),
                variant("fold_bias_unscaled", {"bias_scaled": False}),
                variant("fold_no_sqrt", {"sqrt": False}),
                variant("eps_outside_sqrt", {"eps_mode": "outside"}),
                variant("no_eps", {"eps": "none", "eps_mode": "inside"})]

    def evaluate(self, spec, case):
        a = case.args
        eps = case.eps if spec["eps"] == "given" else 0.0
        var = a["running_var"]
        if not spec["sqrt"]:
            std = var + eps
        elif spec["eps_mode"] == "outside":
            std = var.sqrt() + eps
        else:
            std = (var + eps).sqrt()
        scale = a["gamma"] / std                                        # s_c
        weight = a["weight"] * scale.reshape((-1,) + (1,) * (a["weight"].dim() - 1))
        mean = a["running_mean"] if spec["mean"] else torch.zeros_like(a["running_mean"])
        bias = a["bias"] * scale if spec["bias_scaled"] else a["bias"]
        return (weight, bias - scale * mean + a["beta"])               # s b - s mu + beta

    def context(self, options, cases):
        near = next(c for c in cases if c.kind == "nearzero")
        return {"norm": "BatchNorm", "eps_case": near.name,
                "eps_where": " (here `s = gamma / torch.sqrt(running_var + eps)`)"}

    def locate(self, case, i, idx):
        if i == 1:
            return f"output channel {idx[0]}"
        return locate_sample_channel(idx, "output channel", "input channel")


register(FoldBatchNormOp())


# =======================================================================================
# Chan's merge of two partial statistics
# =======================================================================================
add(Misconception(
    "chan_mean_unweighted", "merged mean not weighted by the counts",
    "merged mean (mean_a + mean_b) / 2 instead of weighting each part by its count",
    "You averaged the two means as `(mean_a + mean_b) / 2`.",
    "The two parts hold count_a and count_b values; the mean of their union weights each "
    "part's mean by its count: `mean_a + delta * count_b / count` with "
    "`delta = mean_b - mean_a` and `count = count_a + count_b` (K = K_A + K_B in the "
    "chapter). The plain average is right only when the counts are equal.",
    "`mean = mean_a + (mean_b - mean_a) * count_b / (count_a + count_b)`."))
add(Misconception(
    "chan_no_delta_term", "M2 of the union without the term of the means",
    "merged M2 = M2_a + M2_b: the delta^2 count_a count_b / count term is missing",
    "Your merged M2 is `m2_a + m2_b`.",
    "Each part's M2 sums the squared deviations from its own mean; the union's are from the "
    "merged mean, and the gap between the two means adds `delta^2 * count_a * count_b / count`. "
    "Without it the variance of two parts with different means comes out too small.",
    "`m2 = m2_a + m2_b + delta ** 2 * count_a * count_b / count`."))
add(Misconception(
    "chan_delta_weight", "the term of the means divided by the count squared",
    "delta^2 count_a count_b / count^2 instead of / count",
    "You weighted the term of the means by `count_a * count_b / count ** 2`.",
    "That is the term for the variance (divided by count), but M2 is a sum of squared deviations, "
    "not a mean: the term is `delta^2 * count_a * count_b / count`.",
    "`m2 = m2_a + m2_b + delta ** 2 * count_a * count_b / count`."))


class ChanMergeOp(Op):
    """``f(count_a, mean_a, m2_a, count_b, mean_b, m2_b) -> (mean, m2)``: the moments of
    the union of two parts, per channel (:func:`normcore.stats.chan_merge`)."""

    name = "chan_merge"
    abbr = "Chan"
    call_text = "f(count_a, mean_a, m2_a, count_b, mean_b, m2_b)"
    input_name = "mean_a"
    outputs = ("mean", "m2")
    ndims_allowed = ndims_default = (1,)
    misconceptions = ("chan_mean_unweighted", "chan_no_delta_term", "chan_delta_weight")
    indexed_by_sample_and_channel = False
    plan = (((1, 7), 3, torch.float64), ((30, 4), 4, torch.float64), ((5, 5), 3, torch.float64),
            ((12, 20), 5, torch.float32))

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        out = []
        for (count_a, count_b), C, dtype in self.plan:
            args = {}
            for part, count in (("a", count_a), ("b", count_b)):
                x = (structured(gen, (count, C), torch.float64) + 3 * draw(gen, (1,))).to(dtype)
                m = stats.moments(x, dim=0)
                args.update({f"count_{part}": count, f"mean_{part}": m.mean, f"m2_{part}": m.m2})
            label = (f"mean_a of shape {shape_text((C,))}, {dtype_text(dtype)}, "
                     f"count_a={count_a}, count_b={count_b}")
            out.append(Case(next(names), label, args, (C,), dtype, options=options))
        return out

    def solution(self, options):
        def chan_merge(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
            merged = stats.chan_merge(stats.Moments(count_a, mean_a, m2_a),
                                      stats.Moments(count_b, mean_b, m2_b))
            return merged.mean, merged.m2
        return chan_merge

    def call(self, fn, case):
        a = case.args
        return fn(a["count_a"], a["mean_a"].clone(), a["m2_a"].clone(), a["count_b"],
                  a["mean_b"].clone(), a["m2_b"].clone())

    def expected_shapes(self, case):
        return (case.shape, case.shape)

    def shape_hint(self, i):
        return " (one value per channel, the shape of mean_a)"

    def base_spec(self, options):
        return {"mean": "weighted", "delta": "1/n"}

    def candidates(self, options, cases):
        return [variant("chan_mean_unweighted", {"mean": "plain"}),
                variant("chan_no_delta_term", {"delta": "none"}),
                variant("chan_delta_weight", {"delta": "1/n^2"})]

    def evaluate(self, spec, case):
        a = case.args
        n_a, n_b = a["count_a"], a["count_b"]
        n = n_a + n_b
        delta = a["mean_b"] - a["mean_a"]
        mean = (a["mean_a"] + delta * (n_b / n) if spec["mean"] == "weighted"
                else (a["mean_a"] + a["mean_b"]) / 2)
        weight = {"1/n": n_a * n_b / n, "none": 0.0, "1/n^2": n_a * n_b / n ** 2}[spec["delta"]]
        return (mean, a["m2_a"] + a["m2_b"] + delta * delta * weight)

    def locate(self, case, i, idx):
        return f"channel {idx[0]}"


register(ChanMergeOp())
