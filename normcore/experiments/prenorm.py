r"""Post-LN, Pre-LN and DeepNorm at initialization: the gradient norm of each layer.

The claim behind it (Xiong et al. 2020): at initialization, the gradients of a Post-LN
transformer's parameters are largest for the layers near the output, while Pre-LN's do not
grow with depth; DeepNorm (Wang et al. 2022) keeps Post-LN but up-weights the residual by
``alpha`` and scales the branch's initial weights by ``beta``.  In miniature:

* the model (:class:`Layer`): ``L`` transformer layers of width ``C``, each with
  self-attention (2 heads, no biases) and a feed-forward network ``C -> 4C -> C``, each of
  the two wrapped in a residual connection and a :class:`normcore.nn.LayerNorm`, in one of
  the :data:`MODES`; weights drawn from ``N(0, 1/C)`` as in Xiong et al.'s analysis, Pre-LN
  with a final LayerNorm before the head;
* the measurement (:func:`grad_norms`): a batch of 16 sequences of 8 tokens and random
  targets of 10 classes, a linear head and a cross-entropy loss, one backward pass; the norm
  of the gradient of each layer's feed-forward parameters, and per-seed summaries of the
  profile (last layer over first, largest over smallest, the mean over the layers).

Everything runs in float64, so the numbers are the same on every CPU to the digits printed.
The seed draws the weights, the inputs and the targets (:func:`initialize`), in an order that
does not depend on the mode: at a given seed every mode starts from the same weights
(DeepNorm's branch weights then multiplied by ``beta``), the same input batch and the same
targets.  The chapter runs :data:`GRADS` through :func:`normcore.experiments.runner.run`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from .. import nn as ncnn
from .runner import Experiment

__all__ = ["MODES", "Layer", "initialize", "grad_norms", "GRADS"]

#: Where the LayerNorm sits, and where DeepNorm's alpha multiplies.
MODES = ("Post-LN", "Pre-LN", "DeepNorm", "DeepNorm (alpha on F)")


def _check(name: str, mode: str, L: int, C: int) -> None:
    if mode not in MODES:
        raise ValueError(f"{name}: unknown mode {mode!r}; choose one of "
                         + ", ".join(repr(m) for m in MODES))
    if L < 1 or C < 2 or C % 2:
        raise ValueError(f"{name}: needs L >= 1 layers and an even width C >= 2 "
                         f"(2 attention heads), got L={L}, C={C}")


class Layer(torch.nn.Module):
    """One transformer layer: attention and feed-forward, each with a residual connection
    and a LayerNorm placed as ``mode`` says."""

    def __init__(self, C: int, mode: str, alpha: float = 1.0, beta: float = 1.0,
                 dtype=torch.float64):
        super().__init__()
        _check("Layer", mode, 1, C)
        nn = torch.nn
        self.attn = nn.MultiheadAttention(C, 2, bias=False, batch_first=True, dtype=dtype)
        self.ff = nn.Sequential(nn.Linear(C, 4 * C, dtype=dtype), nn.ReLU(),
                                nn.Linear(4 * C, C, dtype=dtype))
        self.norms = nn.ModuleList([ncnn.LayerNorm(C, dtype=dtype),
                                    ncnn.LayerNorm(C, dtype=dtype)])
        self.mode, self.alpha = mode, alpha
        with torch.no_grad():
            attn, ff = self.attn, self.ff
            for weight in (attn.in_proj_weight, attn.out_proj.weight,
                           ff[0].weight, ff[2].weight):
                weight.normal_(0.0, C ** -0.5)                  # N(0, 1/C)
            ff[0].bias.zero_()
            ff[2].bias.zero_()
            # DeepNorm's beta: the value and output projections, the FFN
            for weight in (attn.in_proj_weight[2 * C:], attn.out_proj.weight,
                           ff[0].weight, ff[2].weight):
                weight.mul_(beta)

    def branch(self, j: int, h: torch.Tensor) -> torch.Tensor:
        """Sublayer ``j``: 0 is self-attention, 1 the feed-forward network F."""
        if j == 0:
            return self.attn(h, h, h, need_weights=False)[0]
        return self.ff(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for j, norm in enumerate(self.norms):
            if self.mode == "Pre-LN":                 # x + F(LN(x))
                x = x + self.branch(j, norm(x))
            elif self.mode == "DeepNorm (alpha on F)":  # LN(x + alpha F(x))
                x = norm(x + self.alpha * self.branch(j, x))
            else:                                     # LN(alpha x + F(x)); Post-LN: alpha = 1
                x = norm(self.alpha * x + self.branch(j, x))
        return x


def initialize(seed: int, mode: str, L: int = 8, C: int = 32, alpha: float = 1.0,
               beta: float = 1.0) -> tuple[list[Layer], torch.nn.Linear, torch.Tensor,
                                           torch.Tensor]:
    """The ``L`` layers, the linear head, the inputs ``(16, 8, C)`` and the targets ``(128,)``
    of one run, all float64 and drawn from ``seed`` in the same order for every mode."""
    _check("initialize", mode, L, C)
    torch.manual_seed(seed)
    layers = [Layer(C, mode, alpha, beta) for _ in range(L)]
    head = torch.nn.Linear(C, 10, dtype=torch.float64)
    inputs = torch.randn(16, 8, C, dtype=torch.float64)
    targets = torch.randint(0, 10, (16 * 8,))
    return layers, head, inputs, targets


def grad_norms(seed: int, mode: str, L: int = 8, C: int = 32, alpha: float = 1.0,
               beta: float = 1.0) -> dict[str, float]:
    """The gradient norm of each layer's feed-forward parameters, ``layer1`` ... ``layerL``,
    and three summaries of the profile: ``last_over_first``, ``spread`` (largest over
    smallest) and ``mean`` (over the layers)."""
    _check("grad_norms", mode, L, C)
    layers, head, h, target = initialize(seed, mode, L, C, alpha, beta)
    for layer in layers:
        h = layer(h)
    if mode == "Pre-LN":
        h = TF.layer_norm(h, (C,))                    # Pre-LN's final LayerNorm
    TF.cross_entropy(head(h).reshape(-1, 10), target).backward()
    norms = [float(torch.cat([p.grad.flatten() for p in layer.ff.parameters()]).norm())
             for layer in layers]
    out = {f"layer{i + 1}": v for i, v in enumerate(norms)}
    out["last_over_first"] = norms[-1] / norms[0]
    out["spread"] = max(norms) / min(norms)
    out["mean"] = sum(norms) / L
    return out


#: The chapter's measurement: configs ``{"mode", "L", "alpha", "beta"}``.
GRADS = Experiment("prenorm.grad_norms", grad_norms,
                   held_equal="at each seed the same initial weights (DeepNorm's scaled by "
                              "beta), input batch and targets; L = 8, C = 32, weights from "
                              "N(0, 1/C), float64")
