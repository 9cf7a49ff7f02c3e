"""Checker op of BatchNorm's backward pass: ``batch_norm_backward``.

``f(dy, x, gamma, eps) -> (dx, dgamma, dbeta)`` of training-mode BatchNorm.  Each mistake
is autograd through :func:`normcore.functional.normalize` with a knob changed: the mean or
the variance detached (their gradient paths dropped), gamma left out of dx, dgamma from x,
the unbiased variance, another reduce set.  :class:`BatchNormBackwardOp` is written for any
norm with one gamma per channel (its ``norm``): GroupNorm's backward op
(:mod:`normcore.exercises.group`) extends it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from .. import axes, functional
from ..axes import Layout
from ..functional import normalize
from .forward import NORM_WHY
from .inputs import SET_NAMES, Case, affine, draw, structured
from .ops import Op, locate_sample_channel, register
from .report import dtype_text, shape_text
from .variants import knob_stats, role_layout, role_names, role_variants, spatial_names, \
    variant, wrong_axes_fields

_INPUT_SHAPES = {2: "(N, C)", 3: "(N, C, L)", 4: "(N, C, H, W)"}
#: The roles of the sums of dgamma and dbeta: every sample and position of the channel.
CHANNEL_SUM_ROLES = axes.TABLE["batch"].roles


def per_channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A ``(C,)`` tensor viewed to broadcast against an ``(N, C, *)`` input of ``ndim`` dims."""
    return t.view([1, -1] + [1] * (ndim - 2))


def autograd_grads(forward, dy, x, gamma) -> tuple[torch.Tensor, ...]:
    """``(dx, dgamma, dbeta)`` of ``y = forward(x, gamma, beta)`` at beta = 0 for the
    upstream gradient ``dy``, by autograd: the backward ops' references."""
    with torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)
        gamma = gamma.detach().clone().requires_grad_(True)
        beta = torch.zeros_like(gamma, requires_grad=True)
        grads = torch.autograd.grad(forward(x, gamma, beta), (x, gamma, beta), dy)
    return tuple(t.detach() for t in grads)


def backward_variant(spec: dict, lay: Layout, eps: float, dy, x0, gamma0):
    """``(dx, dgamma, dbeta)`` of ``y = normalize(x, lay, eps, gamma, beta)`` (gamma per
    channel) by autograd, with the knobs of ``spec`` turned: ``correction``; ``mean_grad``,
    ``var_grad`` (False: the statistic detached, its path dropped); ``dx_gamma``
    (``"inside"``; ``"none"``: dx as if gamma were 1; ``"outside"``: that dx times gamma,
    BatchNorm's form); ``dgamma`` (``"x_hat"``, or ``"x"``: the sums of ``dy * x``)."""
    def grads(with_gamma: bool):
        x = x0.clone().requires_grad_(True)
        gamma = gamma0.clone().requires_grad_(True)
        beta = torch.zeros_like(gamma, requires_grad=True)
        mean, var = knob_stats(x, lay, spec, spec["correction"])
        y = normalize(x, lay, eps, gamma if with_gamma else None, beta, mean=mean,
                      var=var).output
        return torch.autograd.grad(y, (x, gamma, beta), dy, allow_unused=True)

    with torch.enable_grad():
        dx, dgamma, dbeta = grads(True)
        if spec["dx_gamma"] != "inside":
            dx = grads(False)[0]
        if spec["dx_gamma"] == "outside":
            dx = dx * per_channel_view(gamma0, dx.dim())
    if spec["dgamma"] == "x":
        dims = [d for d in range(dy.dim()) if d != 1]
        dgamma = (dy * x0).sum(dim=dims)
    return (dx.detach(), dgamma.detach(), dbeta.detach())


class BatchNormBackwardOp(Op):
    name = "batch_norm_backward"
    abbr = "BN-bwd"
    norm = "batch"
    call_text = "f(dy, x, gamma, eps)"
    outputs = ("dx", "dgamma", "dbeta")
    misconceptions = ("wrong_axes", "unbiased_var", "backward_stats_constant",
                      "backward_no_var_grad", "backward_no_mean_grad", "dgamma_uses_x",
                      "dx_without_gamma")
    #: input rank -> the shape of the float64 set, and of the float32 set (of the highest
    #: rank tested); see :meth:`_entry`
    shapes = {2: (4, 3), 3: (3, 4, 5), 4: (2, 3, 3, 2)}
    shapes32 = {2: (5, 4), 3: (2, 4, 6), 4: (3, 4, 2, 3)}

    def _entry(self, table: dict, ndim: int) -> tuple[tuple, int | None]:
        """``(shape, num_groups)`` of rank ``ndim`` in ``shapes`` or ``shapes32``."""
        return table[ndim], None

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        top = max(options["ndims"])
        plan = [(*self._entry(self.shapes, d), torch.float64, "regular")
                for d in options["ndims"]]
        plan.append((*self._entry(self.shapes32, top), torch.float32, "float32"))
        out = []
        for shape, groups, dtype, kind in plan:
            x = structured(gen, shape, dtype)
            gamma, _ = affine(gen, (shape[1],), dtype)
            dy = draw(gen, shape, dtype)
            label = f"x of shape {shape_text(shape)}, {dtype_text(dtype)}"
            if groups is not None:
                label += f", num_groups={groups}"
            out.append(Case(next(names), label, {"dy": dy, "x": x, "gamma": gamma}, shape,
                            dtype, groups=groups, kind=kind, options=options))
        return out

    # ---- the reference and the call -------------------------------------------------------
    def solution(self, options):
        def batch_norm_backward(dy, x, gamma, eps):
            return autograd_grads(lambda x, w, b: functional.batch_norm(
                x, None, None, w, b, training=True, eps=eps), dy, x, gamma)
        return batch_norm_backward

    def call(self, fn, case):
        a = case.args
        return fn(a["dy"].clone(), a["x"].clone(), a["gamma"].clone(), case.eps)

    def torch_kernels(self, case):
        a = case.args
        return [autograd_grads(lambda x, w, b: TF.batch_norm(
            x, None, None, w, b, training=True, eps=case.eps), a["dy"], a["x"], a["gamma"])]

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
                "dgamma": "x_hat", "dx_gamma": "inside"}

    def candidates(self, options, cases):
        bases = [axes.layout(self.norm, c.shape, c.groups) for c in cases]
        return [
            variant("backward_stats_constant", {"mean_grad": False, "var_grad": False}),
            variant("backward_no_var_grad", {"var_grad": False}),
            variant("backward_no_mean_grad", {"mean_grad": False}),
            variant("dx_without_gamma", {"dx_gamma": "none"}),
            variant("dgamma_uses_x", {"dgamma": "x"}),
            variant("unbiased_var", {"correction": 1}),
        ] + role_variants(bases)

    def _layout(self, spec, case) -> Layout | None:
        """The layout of ``spec``'s reduce set (``None``: it names no dim of this input)."""
        base = axes.layout(self.norm, case.shape, case.groups)
        return base if spec["reduce"] is None else role_layout(base, spec["reduce"][1])

    def evaluate(self, spec, case):
        lay = self._layout(spec, case)
        if lay is None:
            return None  # this reduce set names no dim of this input (e.g. (H, W) of (N, C))
        a = case.args
        return backward_variant(spec, lay, case.eps, a["dy"], a["x"], a["gamma"])

    # ---- words --------------------------------------------------------------------------
    def context(self, options, cases):
        shown = self.display_case(cases)
        shape = shown.shape
        names = ["N", "C"] + spatial_names(len(shape) - 2)
        base = axes.layout(self.norm, shape, shown.groups)
        return {
            "norm": axes.TITLES[self.norm], "names": names,
            "want": role_names(axes.TABLE[self.norm].roles, names),
            "sum_dims": role_names(CHANNEL_SUM_ROLES, names),
            "axes_why": NORM_WHY[self.norm] + " The sums in the gradient run over the same set.",
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
        return wrong_axes_fields(context["_layout"], detail["roles"], context["names"],
                                 self.norm)

    def locate(self, case, i, idx):
        return locate_sample_channel(idx) if i == 0 else f"channel {idx[0]}"


register(BatchNormBackwardOp())
