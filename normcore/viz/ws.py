r"""Pictures for the Weight Standardization chapter.

* :func:`filter_weights`: the seeded depthwise ``3 x 3`` filters the widget shows (4 output
  channels, fan-in :math:`F = 9`: small enough that the conventions differ visibly);
* :func:`standardize_figure`: each output channel's weights as a row of dots, raw
  (:math:`aW + c`) on the left and standardized on the right, with every row's mean and
  standard deviation written beside it.  The frames of the chapter's static-first widget:
  the left panel moves with the scale :math:`a` and the shift :math:`c`, the right panel does
  not; the convention changes the right panel's spread.

The standardized weights come from :func:`normcore.functional.weight_standardize`; nothing
is restated here.
"""
from __future__ import annotations

import torch
from matplotlib.figure import Figure

from .. import functional as F

__all__ = ["filter_weights", "standardize_figure"]

_COLORS = ("#1f77b4", "#d62728", "#2a7d2a", "#8c4bb4")


def filter_weights(seed: int = 7) -> torch.Tensor:
    """A seeded ``(4, 1, 3, 3)`` weight: torch's ``Conv2d`` initialization of a depthwise
    ``3 x 3`` conv (``groups = 4``), float64."""
    torch.manual_seed(seed)
    conv = torch.nn.Conv2d(4, 4, 3, groups=4, bias=False, dtype=torch.float64)
    return conv.weight.detach().clone()


def standardize_figure(scale: float, shift: float, convention: str,
                       weight: torch.Tensor | None = None) -> Figure:
    """Rows of dots: output channel ``c``'s raw weights ``scale * W_c + shift`` (left) and
    their standardization in ``convention`` (right)."""
    w = filter_weights() if weight is None else weight
    raw = scale * w + shift
    what = F.weight_standardize(raw, convention=convention)
    fig = Figure(figsize=(7.6, 2.9), layout="constrained")
    axes = fig.subplots(1, 2)
    c_out = w.shape[0]
    for ax, vals, title, lim in ((axes[0], raw, f"raw weights $aW + c$  (a = {scale:g}, "
                                  f"c = {shift:g})", (-2.2, 2.2)),
                                 (axes[1], what, f"standardized, '{convention}'", (-2.6, 2.6))):
        for c in range(c_out):
            v = vals[c].flatten()
            ax.plot(v.numpy(), [c] * v.numel(), "o", ms=5, color=_COLORS[c % 4], alpha=0.8)
            std = float(v.std(correction=0))
            ax.text(1.02, c, f"mean {round(float(v.mean()), 2) + 0.0:+.2f}\nstd {std:.3f}",
                    transform=ax.get_yaxis_transform(), va="center", fontsize=9)
        ax.set_xlim(*lim)
        ax.set_ylim(-0.6, c_out - 0.4)
        ax.set_yticks(range(c_out), [f"c = {c}" for c in range(c_out)])
        ax.invert_yaxis()
        ax.axvline(0, color="#888888", lw=0.8, zorder=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("weight value", fontsize=10)
        ax.tick_params(labelsize=9)
    return fig
