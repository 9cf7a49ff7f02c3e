"""Checker op of the InstanceNorm chapter: ``adaptive_instance_norm`` (AdaIN).

``f(content, style, eps) -> y``: normalize each channel of each content sample with its own
mean and biased variance (eps inside the square root), then give it the mean and
``sqrt(var + eps)`` of the same channel of the same style sample
(:func:`normcore.functional.adaptive_instance_norm` with ``alpha = 1``).  The style may have
another spatial size; ``N`` and ``C`` agree.

Each mistake turns one knob of the statistics: the set they are taken over (InstanceNorm's,
BatchNorm's or LayerNorm's, from :func:`normcore.axes.layout`), the image they come from,
the variance's ``correction``, where eps goes.  A function that swaps content and style
returns a tensor of the style's shape; the shape check reports it, and its hint names the
swap.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as TF

from .. import axes, functional
from .catalogue import Misconception, add
from .inputs import SET_NAMES, Case, draw, structured
from .ops import Op, register
from .report import dtype_text, number, shape_text
from .variants import spatial_names, variant

add(Misconception(
    "adain_style_from_content", "style statistics taken from the content image",
    "scaled and shifted with the content's own mean and std instead of the style's (the "
    "output is the content, unchanged)",
    "You de-normalized with the content's own mean and standard deviation: your output is the "
    "content, unchanged (up to eps).",
    "AdaIN gives each channel of the content the statistics of the *style*: "
    "`std(style) * (content - mean(content)) / std(content) + mean(style)`. The content's "
    "statistics are only used to normalize it.",
    "Compute the mean and std of `style` over its own spatial dims, and use them for the "
    "scale and the shift."))
add(Misconception(
    "adain_stats_swapped", "content and style statistics swapped",
    "normalized the content with the style's statistics and de-normalized with the content's: "
    "std(x) * (x - mean(y)) / std(y) + mean(x)",
    "You normalized the content with the style's mean and std, and scaled and shifted it with "
    "the content's: `std(content) * (content - mean(style)) / std(style) + mean(content)`.",
    "Normalizing must use the statistics of the tensor being normalized (the content), so that "
    "x_hat has mean 0 and std 1; then the style's statistics are put in.",
    "`std(style) * (content - mean(content)) / std(content) + mean(style)`."))
add(Misconception(
    "adain_batch_set", "BatchNorm's set: statistics over the batch",
    "mean and std per channel over the batch and the positions (BatchNorm's set) instead of "
    "per sample and channel over the positions",
    "You computed each mean and std per channel over the whole batch and the positions, "
    "{batch_dims}, which is how BatchNorm groups the elements.",
    "AdaIN uses InstanceNorm's statistics: one mean and std per sample and channel, over the "
    "positions only, so that each sample gets the style of its own style image.",
    "Reduce over the spatial dims only, `dim=tuple(range(2, x.dim()))` with keepdim=True, "
    "for both images."))
add(Misconception(
    "adain_layer_set", "LayerNorm's set: statistics over all channels",
    "mean and std per sample over the channels and positions (LayerNorm's set) instead of "
    "per channel over the positions",
    "You computed each mean and std per sample over all channels and positions, "
    "{layer_dims}, which is how LayerNorm groups the elements.",
    "Style lives in the per-channel statistics: AdaIN gives each channel its own mean and std "
    "(InstanceNorm's set, over the positions only); one mean and std for all channels keeps "
    "the content's colour balance.",
    "Reduce over the spatial dims only, `dim=tuple(range(2, x.dim()))` with keepdim=True, "
    "for both images."))
add(Misconception(
    "adain_style_no_eps", "eps left out of the style's std",
    "scaled by sqrt(var(style)) instead of sqrt(var(style) + eps)",
    "You scaled by the style's std without eps, `sqrt(var(style))`.",
    "This exercise (and normcore.functional.adaptive_instance_norm) puts eps on both sides, "
    "`sqrt(var + eps)`, so that AdaIN(x, x) == x exactly. Set {eps_case} has a nearly "
    "constant style channel and eps = {eps_value}, where the two differ.",
    "Scale by `torch.sqrt(var_style + eps)`."))

_INPUT_SHAPES = {3: "(N, C, L)", 4: "(N, C, H, W)"}


class AdaINOp(Op):
    name = "adaptive_instance_norm"
    abbr = "AdaIN"
    call_text = "f(content, style, eps)"
    input_name = "content"
    ndims_allowed = (3, 4)
    ndims_default = (4,)
    misconceptions = ("adain_style_from_content", "adain_stats_swapped", "adain_batch_set",
                      "adain_layer_set", "unbiased_var", "eps_outside_sqrt", "no_eps",
                      "adain_style_no_eps")
    #: content shape, style shape, per rank: the first pair alike, the second not
    shapes = {3: [((2, 3, 6), (2, 3, 6)), ((3, 2, 5), (3, 2, 7))],
              4: [((2, 3, 4, 5), (2, 3, 4, 5)), ((3, 4, 3, 4), (3, 4, 5, 2))]}

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)

        def make(shape_x, shape_y, dtype, eps, kind, extra=""):
            x = structured(gen, shape_x, dtype)
            y = (3.0 + 2.0 * structured(gen, shape_y, torch.float64)).to(dtype)
            label = (f"content of shape {shape_text(shape_x)}, style {shape_text(shape_y)}, "
                     f"{dtype_text(dtype)}{extra}")
            return Case(next(names), label, {"content": x, "style": y}, shape_x, dtype, eps,
                        None, kind, options)

        out = [make(sx, sy, torch.float64, 1e-5, "regular")
               for d in options["ndims"] for sx, sy in self.shapes[d]]
        top = max(options["ndims"])
        out.append(make(*self.shapes[top][1], torch.float32, 1e-5, "float32"))
        # a nearly constant style channel and a large eps: only there does eps matter
        near = make(*self.shapes[top][0], torch.float64, 1e-3, "nearzero",
                    ", eps=0.001; channel 1 of style sample 0 is nearly constant (std 1e-3)")
        style = near.args["style"]
        style[0, 1] = 0.5 + 1e-3 * draw(gen, tuple(style[0, 1].shape))
        out.append(near)
        return out

    def solution(self, options) -> Callable:
        return lambda content, style, eps: functional.adaptive_instance_norm(
            content, style, eps=eps)

    def call(self, fn, case):
        return fn(case.args["content"].clone(), case.args["style"].clone(), case.eps)

    def torch_kernels(self, case):
        x, y = case.args["content"], case.args["style"]
        lay = axes.layout("instance", y.shape)
        var, mean = torch.var_mean(y, dim=lay.reduce_dims, correction=0, keepdim=True)
        return [(TF.instance_norm(x, eps=case.eps) * torch.sqrt(var + case.eps) + mean,)]

    def shape_hint(self, i):
        return (" (the shape of content: AdaIN keeps the content's positions and takes only "
                "the channel statistics of the style; an output of the style's shape means "
                "that content and style were swapped)")

    def call_hint(self, options):
        return ("The checker calls f(content, style, eps) with content and style of shape "
                + " and ".join(_INPUT_SHAPES[d] for d in options["ndims"])
                + " (the same N and C; the style's spatial size may differ).")

    # ---- the known mistakes -------------------------------------------------------------
    def base_spec(self, options):
        return {"set": "instance", "source": "right", "correction": 0, "eps_mode": "inside",
                "eps": "given", "style_eps": True}

    def candidates(self, options, cases):
        return [
            variant("adain_style_from_content", {"source": "content"}),
            variant("adain_stats_swapped", {"source": "stats_swapped"}),
            variant("adain_batch_set", {"set": "batch"}),
            variant("adain_layer_set", {"set": "layer"}),
            variant("unbiased_var", {"correction": 1}),
            variant("eps_outside_sqrt", {"eps_mode": "outside"}),
            # without eps, where eps would go does not matter: no_eps sets both knobs
            variant("no_eps", {"eps": "none", "eps_mode": "inside"}),
            variant("adain_style_no_eps", {"style_eps": False}),
        ]

    @staticmethod
    def _stats(t, spec, eps, with_eps=True):
        """Mean and std of ``t`` over ``spec["set"]``'s sets (keepdim)."""
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
        return mean, std                      # the view is the input's shape here

    def evaluate(self, spec, case):
        x, y = case.args["content"], case.args["style"]
        eps = {"given": case.eps, "none": 0.0}[spec["eps"]]
        mx, sx = self._stats(x, spec, eps)
        my, sy = self._stats(y, spec, eps, spec["style_eps"])
        if spec["source"] == "content":
            my, sy = mx, self._stats(x, spec, eps, spec["style_eps"])[1]
        elif spec["source"] == "stats_swapped":
            mx, sx, my, sy = (my, self._stats(y, spec, eps)[1],
                              mx, self._stats(x, spec, eps)[1])
        return ((sy * (x - mx) / sx + my).to(case.dtype),)

    # ---- words --------------------------------------------------------------------------
    def context(self, options, cases):
        near = next(c for c in cases if c.kind == "nearzero")
        spatial = spatial_names(max(options["ndims"]) - 2)
        return {
            "norm": "AdaIN", "eps_case": near.name, "eps_value": number(near.eps),
            "eps_where": " for both images",
            "batch_dims": "(" + ", ".join(["N"] + spatial) + ")",
            "layer_dims": "(" + ", ".join(["C"] + spatial) + ")",
            "unbiased_why": (
                "AdaIN, like InstanceNorm, uses the biased variance (divide by the number of "
                "positions n). The widely copied AdaIN code calls `x.var(dim=2)`, which is "
                "unbiased (n - 1); this exercise and normcore use the biased one, as every "
                "norm layer does. For a 4 x 5 feature map the stds differ by 2.6%."),
        }


register(AdaINOp())
