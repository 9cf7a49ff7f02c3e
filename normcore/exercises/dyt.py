r"""Checker op of the chapter "Do we need normalization at all?": ``dyt`` (Dynamic Tanh).

``f(x, alpha, gamma, beta, channels_last) -> y``: :math:`y = \gamma \tanh(\alpha x) + \beta`
(:func:`normcore.functional.dyt`), with ``alpha`` the learned scalar (a tensor of shape
``(1,)``, as the paper's code keeps it) and gamma, beta of shape ``(C,)``: over the last dim
of a transformer's ``(N, T, C)`` input (``channels_last=True``) or one per channel of dim 1
of an ``(N, C, *)`` input (``channels_last=False``, the paper's ConvNeXt layout).

Each mistake turns one knob of the reference: where alpha goes (inside the tanh, outside
it, nowhere) and where gamma and beta go (the axis ``channels_last`` says, or always the
last dim, or always dim 1).  For the wrong axis to give numbers rather than a broadcasting
error, every test set of rank 3 or 4 has as many entries along dim 1 as along the last dim;
a function that broadcasts gamma along the wrong one runs, and is named.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .. import functional
from .catalogue import Misconception, add
from .inputs import SET_NAMES, Case, affine, draw
from .ops import Op, register
from .report import dtype_text, shape_text
from .variants import variant

add(Misconception(
    "dyt_no_alpha", "alpha left out of the tanh",
    "DyT: computed tanh(x) instead of tanh(alpha * x); the learned scale is missing",
    "You computed `tanh(x)`: alpha does not enter your output.",
    "alpha is DyT's one learned scale, and it belongs inside the tanh: `tanh(alpha * x)`. "
    "It decides which inputs fall on the nearly linear middle of the S and which saturate "
    "at +-gamma; without it the layer cannot adapt to the scale of its input (at alpha = "
    "0.5, an input of 1 gives tanh(0.5) = 0.46, not tanh(1) = 0.76).",
    "Multiply the input by alpha before the tanh: `gamma * torch.tanh(alpha * x) + beta` "
    "(alpha has shape (1,) and broadcasts over x)."))
add(Misconception(
    "dyt_alpha_outside", "alpha multiplies the tanh instead of its input",
    "DyT: computed alpha * tanh(x) instead of tanh(alpha * x)",
    "You multiplied the output of the tanh by alpha, `alpha * tanh(x)`, instead of its "
    "input.",
    "Outside the tanh, alpha is only a second gamma: it stretches the curve vertically and "
    "never changes where it bends. DyT's alpha scales the input, `tanh(alpha * x)`, and so "
    "chooses which inputs saturate, as a norm's 1 / std would.",
    "`gamma * torch.tanh(alpha * x) + beta`."))
add(Misconception(
    "dyt_affine_wrong_axis", "gamma and beta broadcast along the wrong axis",
    "DyT: gamma and beta applied along the last dim when channels_last=False, or along dim 1 "
    "when channels_last=True",
    "{did}",
    "gamma and beta have one entry per channel, and channels_last says where the channels "
    "are: the last dim of a transformer's (N, T, C) tokens (channels_last=True, "
    "`gamma * t + beta` broadcasts there by itself), or dim 1 of an (N, C, *) image "
    "(channels_last=False, the paper's `weight[:, None, None]` for ConvNeXt). On the other "
    "axis, each element gets the gamma of its position instead of its channel's.",
    "Broadcast along dim 1 only when channels_last is False: `shape = (-1,) if "
    "channels_last else (1, -1) + (1,) * (x.dim() - 2)`, then `gamma.view(shape) * "
    "torch.tanh(alpha * x) + beta.view(shape)`."))

#: What ``dyt_affine_wrong_axis`` says the student did, per variant.
WRONG_AXIS_DID = {
    "last": "You applied gamma and beta along the last dim of x whatever channels_last says "
            "(`gamma * torch.tanh(alpha * x) + beta` broadcasts over the last dim), so on "
            "the sets with channels_last=False, x of shape (N, C, *), they multiply "
            "positions instead of channels.",
    "channel": "You applied gamma and beta per entry of dim 1 whatever channels_last says "
               "(`gamma.view(1, -1, 1, ...)`), so on the sets with channels_last=True, x of "
               "shape (N, T, C), they multiply tokens instead of channels.",
}

#: rank -> the (shape, channels_last) of its float64 sets: dim 1 as long as the last dim, so
#: gamma broadcasts along either without an error (and the wrong one gives other numbers)
SHAPES = {2: [((4, 3), True)],
          3: [((2, 3, 3), True), ((3, 4, 4), False)],
          4: [((2, 3, 2, 3), False), ((2, 3, 2, 3), True)]}
#: the float32 set, of the highest rank tested
SHAPES32 = {2: ((5, 4), False), 3: ((2, 5, 5), False), 4: ((2, 4, 2, 4), True)}
_LAYOUT = {True: "(N, T, C)", False: "(N, C, *)"}


class DyTOp(Op):
    name = "dyt"
    abbr = "DyT"
    call_text = "f(x, alpha, gamma, beta, channels_last)"
    misconceptions = ("dyt_no_alpha", "dyt_alpha_outside", "dyt_affine_wrong_axis")
    indexed_by_sample_and_channel = False

    def cases(self, options):
        gen = torch.Generator().manual_seed(options["seed"])
        names = iter(SET_NAMES)
        plan = [(shape, last, torch.float64) for d in options["ndims"]
                for shape, last in SHAPES[d]]
        plan.append((*SHAPES32[max(options["ndims"])], torch.float32))
        out = []
        for shape, last, dtype in plan:
            C = shape[-1] if last else shape[1]
            x = 2.0 * draw(gen, shape, dtype)             # spread 2: part of it saturates
            alpha = (0.5 + torch.rand(1, generator=gen, dtype=torch.float64)).to(dtype)
            gamma, beta = affine(gen, (C,), dtype)
            label = (f"x of shape {shape_text(shape)}, {dtype_text(dtype)}, "
                     f"channels_last={last}")
            out.append(Case(next(names), label,
                            {"x": x, "alpha": alpha, "gamma": gamma, "beta": beta,
                             "channels_last": last}, shape, dtype, options=options))
        return out

    def solution(self, options) -> Callable:
        return lambda x, alpha, gamma, beta, channels_last: functional.dyt(
            x, alpha, gamma, beta, channels_last=channels_last)

    def call(self, fn, case):
        a = case.args
        return fn(a["x"].clone(), a["alpha"].clone(), a["gamma"].clone(), a["beta"].clone(),
                  a["channels_last"])

    def call_hint(self, options):
        return ("The checker calls f(x, alpha, gamma, beta, channels_last) with alpha of shape "
                "(1,), gamma and beta of shape (C,), and x of shape (N, T, C) or (N, C) "
                "(channels_last=True) or (N, C, L), (N, C, H, W) (channels_last=False).")

    # ---- the known mistakes -------------------------------------------------------------
    def base_spec(self, options):
        return {"alpha": "inside", "axis": "given"}

    def candidates(self, options, cases):
        return [
            variant("dyt_no_alpha", {"alpha": "none"}),
            variant("dyt_alpha_outside", {"alpha": "outside"}),
            variant("dyt_affine_wrong_axis", {"axis": "last"}, which="last"),
            variant("dyt_affine_wrong_axis", {"axis": "channel"}, which="channel"),
        ]

    def evaluate(self, spec, case):
        a = case.args
        x, alpha, gamma, beta = a["x"], a["alpha"], a["gamma"], a["beta"]
        last = {"given": a["channels_last"], "last": True, "channel": False}[spec["axis"]]
        if x.shape[-1 if last else 1] != gamma.shape[0]:
            return None                  # gamma does not broadcast along that axis here
        one = torch.ones_like(alpha)
        if spec["alpha"] == "none":                   # gamma tanh(x) + beta
            alpha = one
        elif spec["alpha"] == "outside":              # (alpha gamma) tanh(x) + beta
            alpha, gamma = one, alpha * gamma
        return (functional.dyt(x, alpha, gamma, beta, channels_last=last),)

    # ---- words --------------------------------------------------------------------------
    def render_fields(self, context, key, detail):
        if key == "dyt_affine_wrong_axis":
            return {"did": WRONG_AXIS_DID[detail["which"]]}
        return {}

    def locate(self, case, i, idx):
        return "index (" + ", ".join(map(str, idx)) + ")"


register(DyTOp())
