"""The picture of the chapter "Choosing a normalization": what each layer costs next to the
3x3 convolution before it, from the benchmark's committed times (:func:`normcore.choose.load_cost`).
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from .. import choose
from . import phone

__all__ = ["cost_figure", "COLORS"]

#: torch's bars and normcore's
COLORS = {"torch": "#1f5fa8", "normcore": "#c2410c"}


def cost_figure(cost: dict, keys: Sequence[str] = (*choose.KEYS, "batch eval"),
                kind: str = "fwd+bwd", narrow: bool = False) -> Figure:
    """Horizontal bars: each layer's time (``kind``, the fastest round) in % of the 3x3
    convolution's on the same tensor (its fastest round too), torch's and normcore's side by
    side, each labelled with its percentage at its end, and a thin line on to the median
    round's, ending in a tick; a layer normcore has no op for says so in place of its bar.
    ``narrow``: the phone layout."""
    names = {k: choose.ROWS[k].short if k in choose.ROWS else "BN, eval" for k in keys}
    if narrow:
        fig = phone.figure(4.6)
    else:
        fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.subplots()
    height = 0.38
    top = 0.0
    for who, shift in (("torch", -height / 2), ("normcore", height / 2)):
        for i, key in enumerate(keys):
            y = i + shift
            times = cost["times"][key][who]
            if times is None:
                ax.text(0.5, y, f"no {who} op", va="center", fontsize=9, color=COLORS[who])
                continue
            pct = 100 * choose.cost_ratio(cost, key, who, kind)
            median = pct * times[kind]["median"] / times[kind]["min"]
            top = max(top, median)
            ax.barh(y, pct, height=height, color=COLORS[who],
                    label=who if i == 0 else None)
            ax.plot([pct, median], [y, y], color="0.25", lw=1, marker="|", markevery=[1],
                    markersize=7, zorder=1,
                    label="on to the median round" if i == 0 and who == "torch" else None)
            # the label names the bar (its fastest round) and sits on the line at the bar's end
            ax.text(pct + 0.3, y, f"{pct:.0f}%", va="center", fontsize=9, zorder=3,
                    bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none"))
    ax.set_yticks(range(len(keys)), [names[k] for k in keys], fontsize=10)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.18)
    ax.tick_params(axis="x", labelsize=9)
    what = "forward + backward" if kind == "fwd+bwd" else "forward"
    sep = "\n" if narrow else " "
    ax.set_xlabel(f"{what} time,{sep}% of a 3×3 convolution's", fontsize=10)
    ax.set_title(f"Each layer's cost next to{sep}the convolution before it", fontsize=10.5)
    ax.spines[["top", "right"]].set_visible(False)
    if narrow:
        phone.legend_below(fig, ax, ncol=2)   # the median's line on a row of its own
    else:
        fig.legend(fontsize=10, frameon=False, loc="outside right center")
    return fig
