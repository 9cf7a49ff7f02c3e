"""Checker ops of the four forward norms: ``batch_norm``, ``layer_norm``, ``instance_norm``,
``group_norm``.

One class, :class:`NormOp`, serves all four: they differ only in the set :math:`S_i`
(read from :mod:`normcore.axes`), in gamma and beta's shape, and in the group count that
GroupNorm takes.  Each mistake is the reference :func:`normcore.functional.normalize`
with one knob changed: the reduce set, ``correction``, ``eps_mode``, the eps used, the
variance formula (:func:`normcore.stats.var_naive`), the affine map, the group order.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as TF

from .. import axes, functional, stats
from ..axes import Layout
from ..functional import normalize
from .inputs import SET_NAMES, Case, affine, draw, large_mean, structured
from .ops import Op, register
from .report import dtype_text, number, shape_text
from .variants import role_layout, role_names, role_variants, spatial_names, variant, \
    wrong_axes_fields

#: Why each norm's set is what it is, in words (the "wrong_axes" report; the set itself, in
#: :func:`normcore.axes.describe`'s words, follows in the report).
NORM_WHY = {
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

#: What ``affine_per_group`` says for each way of applying one gamma per group.
AFFINE_PICKS = {
    "first_G": "channel c of group g used gamma[g] and beta[g], the first num_groups entries",
    "first_of_group": "every channel used the gamma and beta of its group's first channel",
    "group_mean": "every channel used the average gamma and beta of its group",
}

_INPUT_SHAPES = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)"}


class NormOp(Op):
    """``f(x, gamma, beta, eps) -> y`` (GroupNorm: ``f(x, num_groups, gamma, beta, eps)``),
    training mode.

    ``shapes``, ``shapes32``, ``shapes_big``: input rank -> the shape of the float64 sets,
    of the float32 set and of the large-mean set (GroupNorm: ``(shape, num_groups)``).
    ``set1``: the nearly constant set of the eps test, in words ("channel 1").  The set
    :math:`S_i` itself, and the roles a mistake reduces over, come from
    :data:`normcore.axes.TABLE`.
    """

    misconceptions = ("wrong_axes", "unbiased_var", "eps_outside_sqrt", "no_eps", "fixed_eps",
                      "naive_var", "no_affine")

    def __init__(self, name, abbr, norm, ndims, shapes, shapes32, shapes_big, set1):
        self.name, self.abbr, self.norm = name, abbr, norm
        self.ndims_allowed = self.ndims_default = ndims
        self.shapes, self.shapes32, self.shapes_big = shapes, shapes32, shapes_big
        self.set1 = set1
        self.grouped = norm == "group"
        self.call_text = ("f(x, num_groups, gamma, beta, eps)" if self.grouped
                          else "f(x, gamma, beta, eps)")
        if self.grouped:
            self.misconceptions = ("wrong_axes", "group_size_as_num_groups", "strided_groups",
                                   "affine_per_group") + NormOp.misconceptions[1:]

    # ---- inputs -------------------------------------------------------------------------
    def _shape_and_groups(self, entry):
        return entry if self.grouped else (entry, None)

    def _case(self, gen, name, label, shape, groups, dtype, eps, kind, options, x=None):
        lay = axes.layout(self.norm, shape, groups)
        if x is None:
            x = structured(gen, shape, dtype)
        gamma, beta = affine(gen, lay.affine_shape, dtype)
        return Case(name, label, {"x": x, "gamma": gamma, "beta": beta}, shape, dtype, eps,
                    groups, kind, options)

    def _label(self, shape, dtype, groups, extra=""):
        s = f"x of shape {shape_text(shape)}, {dtype_text(dtype)}"
        if groups is not None:
            s += f", num_groups={groups}"
        return s + extra

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        ndims = options["ndims"]
        names = iter(SET_NAMES)
        out = []
        for d in ndims:
            shape, G = self._shape_and_groups(self.shapes[d])
            out.append(self._case(gen, next(names), self._label(shape, torch.float64, G), shape,
                                  G, torch.float64, 1e-5, "regular", options))
        top = max(ndims)
        shape, G = self._shape_and_groups(self.shapes32[top])
        out.append(self._case(gen, next(names), self._label(shape, torch.float32, G), shape, G,
                              torch.float32, 1e-5, "float32", options))
        # one set nearly constant (std 1e-4) and a large eps: only there does eps matter
        shape, G = self._shape_and_groups(self.shapes[top])
        x = structured(gen, shape, torch.float64)
        mask = axes.stat_groups(self.norm, shape, G) == 1
        x[mask] = 0.5 + 1e-4 * draw(gen, (int(mask.sum()),))
        extra = (f", eps=0.001; {self.set1} is nearly constant (std 1e-4), so eps "
                 f"matters there")
        out.append(self._case(gen, next(names), self._label(shape, torch.float64, G, extra),
                              shape, G, torch.float64, 1e-3, "nearzero", options, x=x))
        # large mean, small spread, float32: E[x^2] - E[x]^2 loses every digit
        d = 3 if 3 in ndims else top
        shape, G = self._shape_and_groups(self.shapes_big[d])
        extra = ", values near 4096 with a spread of about 0.4 (large mean, small spread)"
        out.append(self._case(gen, next(names), self._label(shape, torch.float32, G, extra),
                              shape, G, torch.float32, 1e-5, "largemean", options,
                              x=large_mean(gen, shape)))
        return out

    # ---- the reference and the call -------------------------------------------------------
    def solution(self, options) -> Callable:
        if self.norm == "batch":
            return lambda x, gamma, beta, eps: functional.batch_norm(
                x, None, None, gamma, beta, training=True, eps=eps)
        if self.norm == "layer":
            return lambda x, gamma, beta, eps: functional.layer_norm(
                x, x.shape[1:], gamma, beta, eps)
        if self.norm == "instance":
            return lambda x, gamma, beta, eps: functional.instance_norm(
                x, weight=gamma, bias=beta, eps=eps)
        return lambda x, num_groups, gamma, beta, eps: functional.group_norm(
            x, num_groups, gamma, beta, eps)

    def torch_kernels(self, case):
        x, g, b, eps = case.args["x"], case.args["gamma"], case.args["beta"], case.eps
        per_channel = [1, -1] + [1] * (x.dim() - 2)
        if self.norm == "batch":
            return [(TF.batch_norm(x, None, None, g, b, training=True, eps=eps),)]
        if self.norm == "layer":
            return [(TF.layer_norm(x, x.shape[1:], g, b, eps),)]
        if self.norm == "instance":
            return [(TF.instance_norm(x, weight=g, bias=b, eps=eps),)]
        # GroupNorm's own kernel, and each group as a LayerNorm of a view (ex-gn-via-ln)
        rows = x.reshape(x.shape[0], case.groups, -1)
        via_ln = TF.layer_norm(rows, rows.shape[-1:], eps=eps).reshape(x.shape)
        return [(TF.group_norm(x, case.groups, g, b, eps),),
                (via_ln * g.view(per_channel) + b.view(per_channel),)]

    def call(self, fn, case):
        a = {k: v.clone() for k, v in case.args.items()}
        if self.grouped:
            return fn(a["x"], case.groups, a["gamma"], a["beta"], case.eps)
        return fn(a["x"], a["gamma"], a["beta"], case.eps)

    def call_hint(self, options):
        return ("The checker calls " + self.call_text + " with x of shape "
                + " and ".join(_INPUT_SHAPES[d] for d in options["ndims"]) + ".")

    # ---- variants -----------------------------------------------------------------------
    def base_spec(self, options):
        return {"reduce": None, "order": "contiguous", "correction": 0, "eps_mode": "inside",
                "eps": "given", "var": "two_pass", "affine": "per_channel"}

    def candidates(self, options, cases):
        bases = [axes.layout(self.norm, c.shape, c.groups) for c in cases]
        out = role_variants(bases)
        if self.grouped:
            out.append(variant("group_size_as_num_groups", {"reduce": ("swap",)}))
            out.append(variant("strided_groups", {"order": "strided"}))
            for pick in AFFINE_PICKS:
                out.append(variant("affine_per_group", {"affine": pick}, pick=pick))
        out += [
            variant("unbiased_var", {"correction": 1}),
            variant("eps_outside_sqrt", {"eps_mode": "outside"}),
            # without eps, where eps would go does not matter: no_eps sets both knobs
            variant("no_eps", {"eps": "none", "eps_mode": "inside"}),
            variant("fixed_eps", {"eps": "fixed"}),
            variant("naive_var", {"var": "naive"}),
            variant("no_affine", {"affine": "none"}),
        ]
        return out

    def _layout(self, spec, case) -> Layout | None:
        base = axes.layout(self.norm, case.shape, case.groups)
        reduce = spec["reduce"]
        if reduce is None:
            return base
        if reduce[0] == "swap":
            return axes.layout("group", case.shape, case.shape[1] // case.groups)
        return role_layout(base, reduce[1])

    def _affine_params(self, spec, case):
        gamma, beta = case.args["gamma"], case.args["beta"]
        how = spec["affine"]
        if how == "none":
            return None, None
        if how == "per_channel":
            return gamma, beta
        C, G = case.shape[1], case.groups
        size = C // G
        group = torch.arange(C) // size
        if how == "first_G":          # gamma[g] for every channel of group g
            return gamma[group], beta[group]
        if how == "first_of_group":   # the gamma of the group's first channel
            return gamma[group * size], beta[group * size]
        # the group's average gamma
        return gamma.view(G, size).mean(1)[group], beta.view(G, size).mean(1)[group]

    def evaluate(self, spec, case):
        x = case.args["x"]
        lay = self._layout(spec, case)
        if lay is None:
            return None  # this reduce set names no dim of this input (e.g. (H, W) of (N, C))
        eps = {"given": case.eps, "none": 0.0, "fixed": 1e-5}[spec["eps"]]
        w, b = self._affine_params(spec, case)
        perm = None
        if spec["order"] == "strided":
            perm = strided_order(case.shape[1], case.groups)
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
    def context(self, options, cases):
        shown = self.display_case(cases)
        shape, G = shown.shape, shown.groups
        names = ["N", "C"] + spatial_names(len(shape) - 2)
        ctx = {"norm": axes.TITLES[self.norm], "shape": shape_text(shape), "names": names,
               "want": role_names(axes.TABLE[self.norm].roles, names)}
        lay = axes.layout(self.norm, shape, G)
        if self.grouped:
            fix = (f"reshape x to `(N, num_groups, -1)` (here {shape_text((shape[0], G, -1))}), "
                   f"take the mean and variance over the last dim with keepdim=True, normalize, "
                   f"and reshape back to x.shape")
            ctx.update(C=shape[1], G=G, CG=shape[1] // G)
        else:
            general = {"batch": "(0, *range(2, x.dim()))", "layer": "tuple(range(1, x.dim()))",
                       "instance": "tuple(range(2, x.dim()))"}[self.norm]
            fix = (f"for x of shape {shape_text(shape)} that is "
                   f"`x.mean(dim={shape_text(lay.reduce_dims)}, keepdim=True)`; in general "
                   f"`dim = {general}`")
        ctx["axes_why"] = (f"{NORM_WHY[self.norm]} For x of shape {shape_text(shape)}: "
                           f"{axes.describe(self.norm, shape, G)}.")
        ctx["axes_fix"] = fix
        ctx["unbiased_why"] = unbiased_why(ctx["norm"])
        near = next(c for c in cases if c.kind == "nearzero")
        big = next(c for c in cases if c.kind == "largemean")
        ctx["eps_case"], ctx["eps_value"], ctx["eps_where"] = near.name, number(near.eps), ""
        ctx["big_case"] = big.name
        big_lay = axes.layout(self.norm, big.shape, big.groups)
        ctx["big_var"] = number(float(torch.var_mean(
            big.args["x"].double().reshape(big_lay.view_shape), dim=big_lay.reduce_dims,
            correction=0)[0].mean()), 2)
        ctx["affine_hint"] = (
            "gamma and beta have shape x.shape[1:] and broadcast as they are"
            if self.norm == "layer" else
            "with gamma and beta reshaped to broadcast over the channel dim: "
            "`gamma.view(1, -1, *[1] * (x.dim() - 2))`")
        ctx["_layout"] = lay
        return ctx

    def render_fields(self, context, key, detail):
        if key == "affine_per_group":
            return {"pick": AFFINE_PICKS[detail["pick"]]}
        if key != "wrong_axes":
            return {}
        return wrong_axes_fields(context["_layout"], detail["roles"], context["names"],
                                 self.norm)


for _op in (
    NormOp("batch_norm", "BN", "batch", (2, 3, 4),
           {2: (4, 3), 3: (3, 4, 5), 4: (2, 3, 3, 2)},
           {2: (5, 4), 3: (2, 4, 6), 4: (3, 4, 2, 3)},
           {2: (8, 4), 3: (4, 4, 8), 4: (2, 4, 4, 4)},
           "channel 1"),
    NormOp("layer_norm", "LN", "layer", (2, 3, 4),
           {2: (3, 5), 3: (2, 3, 4), 4: (2, 3, 2, 3)},
           {2: (4, 6), 3: (3, 4, 5), 4: (2, 4, 3, 2)},
           {2: (4, 32), 3: (4, 4, 8), 4: (2, 4, 4, 2)},
           "sample 1"),
    NormOp("instance_norm", "IN", "instance", (3, 4),
           {3: (2, 3, 4), 4: (2, 3, 3, 2)},
           {3: (3, 4, 5), 4: (2, 4, 2, 3)},
           {3: (4, 4, 8), 4: (2, 4, 4, 4)},
           "channel 1 of sample 0"),
    NormOp("group_norm", "GN", "group", (2, 3, 4),
           {2: ((3, 6), 3), 3: ((2, 6, 4), 3), 4: ((2, 6, 2, 3), 2)},
           {2: ((4, 8), 4), 3: ((2, 8, 3), 2), 4: ((2, 8, 2, 2), 4)},
           {2: ((4, 8), 2), 3: ((4, 8, 4), 2), 4: ((2, 8, 2, 4), 2)},
           "group 1 of sample 0"),
):
    register(_op)
del _op


def strided_order(C: int, G: int) -> torch.Tensor:
    """The channels in the order that makes the strided groups (channel c in group c % G)
    contiguous: 0, G, 2G, ..., then 1, G + 1, ...  GroupNorm of ``x[:, order]``, put back
    with ``argsort(order)``, is the strided grouping of ``x``."""
    return torch.tensor(sorted(range(C), key=lambda ch: (ch % G, ch)))


def unbiased_why(title: str, running_var: bool = True) -> str:
    """Why the normalization divides by n, not n - 1 (the ``unbiased_var`` message)."""
    stored = (" The unbiased (n - 1) variance only goes into running_var, as an estimate for "
              "eval mode." if running_var else "")
    return (f"{title} normalizes with the biased variance, the plain mean of the squared "
            f"deviations (divide by n): it describes the values being normalized.{stored} The "
            f"difference is largest for small sets: for n = 4 the unbiased std is 15% larger "
            f"(sqrt(4/3)), so the output is 13% too small (sqrt(3/4)).")
