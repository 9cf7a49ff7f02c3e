r"""Pictures for the BatchNorm chapter.

* :func:`batch_dependence` / :func:`batch_dependence_figure`: one fixed sample, normalized in
  training mode together with different batch-mates.  Its BatchNorm output moves with the
  batch-mates (BN's statistics are taken over the batch); its LayerNorm output does not (LN's
  statistics are taken over the sample's own features).  The frames of the chapter's
  static-first widget.
* :func:`graph_figure`: the computational graph of the BN forward pass,
  :math:`x \to \mu \to \sigma^2 \to r \to \hat x \to y`, the map the backward pass walks.
* :func:`sigmoid_figure`: where normalized pre-activations land on a sigmoid.
* :func:`spread_figure`: how the spread of the batch statistics shrinks with the batch size.

Every figure is a plain :class:`matplotlib.figure.Figure` (not registered with pyplot), so a
notebook cell that returns one shows it exactly once, and
:func:`normcore.widgets.static_widget` can turn it into a PNG frame.

Which elements share statistics is not restated here: the BatchNorm and LayerNorm outputs
come from :func:`normcore.functional.batch_norm` and :func:`normcore.functional.layer_norm`,
which read it from :mod:`normcore.axes`.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import NamedTuple

import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.ticker import FuncFormatter, NullFormatter

from .. import functional as F
from . import phone

__all__ = [
    "POPULATION_MEAN", "POPULATION_STD", "SAMPLE_Z", "MAX_BATCH", "NUM_DRAWS",
    "BatchDependence", "batch_dependence", "batch_dependence_figure",
    "graph_figure", "sigmoid_figure", "spread_figure",
]

#: The population the batch-mates come from: feature ``c`` is N(mean[c], std[c]^2).
#: Deliberately different means and scales, so that normalizing matters.
POPULATION_MEAN = (2.0, -1.0, 0.5, 4.0, -3.0, 1.0)
POPULATION_STD = (1.0, 0.5, 2.0, 1.5, 1.0, 3.0)
#: The fixed sample, in population units: x_0 = mean + std * SAMPLE_Z.  Normalized with the
#: population statistics (what eval mode approximates) it is SAMPLE_Z itself (up to eps).
SAMPLE_Z = (1.2, -0.8, 0.3, -1.5, 0.6, 1.6)
#: Largest batch the widget offers; every draw is a pool of MAX_BATCH - 1 batch-mates and a
#: batch of size B uses the first B - 1 of them, so a larger batch extends a smaller one.
MAX_BATCH = 64
#: Default number of draws of the batch-mates.
NUM_DRAWS = 4

_BN_COLOR = "#1f77b4"
_LN_COLOR = "#d62728"
_POP_COLOR = "#222222"


class BatchDependence(NamedTuple):
    """One frame's numbers.

    ``batch``       ``(B, C)`` float64; row 0 is the fixed sample, rows 1.. its batch-mates
    ``bn``          ``(C,)`` the sample's BatchNorm output in training mode (batch statistics)
    ``ln``          ``(C,)`` the sample's LayerNorm output (its own statistics)
    ``population``  ``(C,)`` the sample normalized with the population mean and variance
    """

    batch: torch.Tensor
    bn: torch.Tensor
    ln: torch.Tensor
    population: torch.Tensor


def _check_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def _check_args(batch_size, draw, num_draws) -> tuple[int, int, int]:
    batch_size = _check_int(batch_size, "batch_size")
    draw = _check_int(draw, "draw")
    num_draws = _check_int(num_draws, "num_draws")
    if not 2 <= batch_size <= MAX_BATCH:
        raise ValueError(
            f"batch_size={batch_size} must be between 2 and {MAX_BATCH}: BatchNorm in training "
            f"mode needs at least 2 values per channel (a batch of 1 has variance 0)")
    if num_draws < 1:
        raise ValueError(f"num_draws={num_draws} must be at least 1")
    if not 0 <= draw < num_draws:
        raise ValueError(f"draw={draw} must be in range({num_draws})")
    return batch_size, draw, num_draws


def _population() -> tuple[torch.Tensor, torch.Tensor]:
    dt = torch.float64
    return torch.tensor(POPULATION_MEAN, dtype=dt), torch.tensor(POPULATION_STD, dtype=dt)


def batch_dependence(batch_size: int, draw: int, *, seed: int = 0, num_draws: int = NUM_DRAWS,
                     eps: float = 1e-5) -> BatchDependence:
    """The fixed sample normalized with batch-mates number ``draw``, in a batch of ``batch_size``.

    The batch-mates of draw ``d`` are drawn from the population with a generator seeded by
    ``seed * 1000 + d``; the fixed sample is the same for every draw, batch size and seed.
    """
    batch_size, draw, num_draws = _check_args(batch_size, draw, num_draws)
    seed = _check_int(seed, "seed")
    mean, std = _population()
    sample = mean + std * torch.tensor(SAMPLE_Z, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed * 1000 + draw)
    pool = mean + std * torch.randn(MAX_BATCH - 1, len(mean), generator=gen, dtype=torch.float64)
    batch = torch.cat([sample[None], pool[: batch_size - 1]])
    bn = F.batch_norm(batch, None, None, training=True, eps=eps)[0]
    ln = F.layer_norm(batch, (batch.shape[1],), eps=eps)[0]
    # eval-mode BN with the exact population statistics (what running stats estimate)
    population = F.batch_norm(sample[None], mean, std**2, training=False, eps=eps)[0]
    return BatchDependence(batch, bn, ln, population)


def batch_dependence_figure(batch_size: int, draw: int, *, seed: int = 0,
                            num_draws: int = NUM_DRAWS, panel: str = "both",
                            ylim: float = 3.0, width: float = 7.6,
                            narrow: bool = False) -> Figure:
    """One frame of the batch-dependence widget.

    ``panel="both"``: left, the sample's BatchNorm output (bars) for this draw, with its
    outputs under the other draws of the same batch size (grey dots) and its value with the
    population statistics (black ticks); right, its LayerNorm output.  ``panel="bn"`` or
    ``"ln"`` draws one side only (the ``"ln"`` figure is the same for every argument).
    ``narrow``: the layout for a phone's column, 3.7 inches wide (296 px at the widget's 80 dpi):
    the LayerNorm panel under the BatchNorm panel, the same text sizes.
    """
    if panel not in ("both", "bn", "ln"):
        raise ValueError(f"panel must be 'both', 'bn' or 'ln', got {panel!r}")
    batch_size, draw, num_draws = _check_args(batch_size, draw, num_draws)
    frame = batch_dependence(batch_size, draw, seed=seed, num_draws=num_draws)
    C = frame.bn.numel()
    xs = torch.arange(C).numpy()
    labels = [f"c={c}" for c in range(C)]

    panels = ["bn", "ln"] if panel == "both" else [panel]
    ratios = [1.55, 1.0] if panel == "both" else [1.0]
    # a fixed layout (not "constrained"): every frame has the same geometry, and drawing
    # twenty frames is a third faster
    if narrow:
        fig_w = 3.7
        fig = Figure(figsize=(fig_w, 3.0 * len(panels) + 0.2))
        axs = fig.subplots(len(panels), 1, squeeze=False, gridspec_kw={
            "left": 0.7 / fig_w, "right": 0.98, "bottom": 0.05 * 2 / len(panels),
            "top": 1 - 0.06 * 2 / len(panels), "hspace": 0.3})[:, 0]
    else:
        fig_w = width if panel == "both" else width * 0.55
        left = 0.7 / fig_w                                   # room for the y label, in inches
        fig = Figure(figsize=(fig_w, 3.0))
        axs = fig.subplots(1, len(panels), squeeze=False, gridspec_kw={
            "width_ratios": ratios, "left": left, "right": 0.99, "bottom": 0.1, "top": 0.89,
            "wspace": 0.12})[0]
    for ax, which in zip(axs, panels):
        ax.axhline(0, color="#999999", lw=0.8)
        ax.set_ylim(-ylim, ylim)
        ax.set_xticks(xs, labels, fontsize=9)
        ax.tick_params(axis="y", labelsize=9)
        ax.set_xlim(-0.6, C - 0.4)
        ax.grid(axis="y", color="#e5e5e5", lw=0.6)
        ax.set_axisbelow(True)
        if which == "bn":
            others = torch.stack([batch_dependence(batch_size, d, seed=seed,
                                                   num_draws=num_draws).bn
                                  for d in range(num_draws)])
            ax.bar(xs, frame.bn.clamp(-ylim, ylim).numpy(), width=0.55, color=_BN_COLOR,
                   label=f"this draw ({draw + 1} of {num_draws})")
            offs = torch.linspace(-0.18, 0.18, num_draws).numpy() if num_draws > 1 else [0.0]
            for d in range(num_draws):
                ax.scatter(xs + offs[d], others[d].clamp(-ylim, ylim).numpy(), s=9,
                           color="#8c8c8c", zorder=3, linewidths=0,
                           label="all draws" if d == 0 else None)
            ax.hlines(frame.population.numpy(), xs - 0.36, xs + 0.36, color=_POP_COLOR, lw=2,
                      zorder=4, label=r"population $\mu_{pop}, \sigma_{pop}$")
            ax.set_title(f"BatchNorm (train mode), batch size N = {batch_size}", fontsize=10)
            ax.set_ylabel(r"output for $x_0$", fontsize=9.5)
            ax.legend(fontsize=9, loc="lower left", ncol=2 if narrow else 3, frameon=False,
                      handlelength=1.0, handletextpad=0.4, columnspacing=0.8,
                      borderaxespad=0.2)
        else:
            ax.bar(xs, frame.ln.clamp(-ylim, ylim).numpy(), width=0.55, color=_LN_COLOR)
            ax.set_title("LayerNorm: same in every frame", fontsize=10)
            if panel == "ln" or narrow:
                ax.set_ylabel(r"output for $x_0$", fontsize=9.5)
    return fig


# ---------------------------------------------------------------------------------------
# the computational graph of the forward pass
# ---------------------------------------------------------------------------------------
#: node -> label: the forward pass of one channel, in the chapter's notation
_LABELS = {
    "x": r"$x_i$",
    "mu": r"$\mu=\frac{1}{K}\sum_k x_k$",
    "var": r"$\sigma^2=\frac{1}{K}\sum_k (x_k-\mu)^2$",
    "r": r"$r=(\sigma^2+\epsilon)^{-1/2}$",
    "xhat": r"$\hat x_i=(x_i-\mu)\,r$",
    "gb": r"$\gamma,\ \beta$",
    "y": r"$y_i=\gamma\hat x_i+\beta$",
    "L": r"$\mathcal{L}$",
}
#: (from, to): an arrow "is computed from"
_EDGES = [
    ("x", "mu"), ("x", "var"), ("mu", "var"), ("var", "r"),
    ("x", "xhat"), ("mu", "xhat"), ("r", "xhat"), ("xhat", "y"),
    ("gb", "y"), ("y", "L"),
]


class _GraphLayout(NamedTuple):
    """Where the graph's boxes stand: node -> (x, y, half-width) in data units, the boxes'
    half-height, and the arrows that do not go straight from box to box:
    (from, to) -> (the side it leaves by, the side it enters by, matplotlib connection style)."""

    nodes: dict
    half_height: float
    bends: dict
    fontsize: float
    rounding: float


#: left to right, 8.5 inches wide
_WIDE = _GraphLayout(
    {"x": (0.0, 0.0, 0.38), "mu": (2.0, 0.8, 1.0), "var": (4.45, 1.6, 1.55),
     "r": (7.75, 1.6, 1.2), "xhat": (7.75, 0.0, 1.1), "gb": (10.5, 1.6, 0.6),
     "y": (10.5, 0.0, 1.05), "L": (12.45, 0.0, 0.33)},
    0.3, {("x", "var"): ("top", "left", "arc3,rad=-0.35")}, 11.5, 0.12)
#: top to bottom, for a phone (in inches: 3.7 wide); the arrow x -> sigma^2 goes right,
#: then down
_ROW = 0.7
_NARROW = _GraphLayout(
    {"x": (0.3, 0.0, 0.2), "mu": (1.15, -_ROW, 0.46), "var": (2.75, -_ROW, 0.75),
     "r": (2.75, -2 * _ROW, 0.66), "xhat": (0.8, -2 * _ROW, 0.6), "gb": (2.4, -3 * _ROW, 0.26),
     "y": (0.8, -3 * _ROW, 0.54), "L": (0.8, -4 * _ROW, 0.2)},
    0.2, {("x", "var"): ("right", "top", "angle,angleA=0,angleB=90,rad=8")}, 11.0, 0.08)


def _side(layout: _GraphLayout, node: str, side: str) -> tuple[float, float]:
    x, y, w = layout.nodes[node]
    h = layout.half_height
    return {"top": (x, y + h), "left": (x - w, y), "right": (x + w, y), "bottom": (x, y - h)}[side]


def _anchor(layout: _GraphLayout, node: str, toward: str) -> tuple[float, float]:
    """Where the segment from ``node``'s centre toward ``toward``'s centre leaves its box."""
    x0, y0, w = layout.nodes[node]
    x1, y1 = layout.nodes[toward][:2]
    dx, dy = x1 - x0, y1 - y0
    t = min(w / abs(dx) if dx else float("inf"),
            layout.half_height / abs(dy) if dy else float("inf"))
    return x0 + t * dx, y0 + t * dy


def _draw_graph(ax, layout: _GraphLayout) -> None:
    h = layout.half_height
    for key, (x, y, w) in layout.nodes.items():
        fc, ec = (("#fff4e0", "#c98a1b") if key == "gb" else
                  ("#eeeeee", "#777777") if key == "L" else ("#e8f0fb", "#4a78b5"))
        ax.add_patch(FancyBboxPatch((x - w, y - h), 2 * w, 2 * h, fc=fc, ec=ec, lw=1.0, zorder=2,
                                    boxstyle=f"round,pad=0,rounding_size={layout.rounding}"))
        ax.text(x, y, _LABELS[key], ha="center", va="center", fontsize=layout.fontsize, zorder=3)
    for a, b in _EDGES:
        if (a, b) in layout.bends:
            leave, enter, style = layout.bends[a, b]
            start, end = _side(layout, a, leave), _side(layout, b, enter)
        else:
            start, end, style = _anchor(layout, a, b), _anchor(layout, b, a), "arc3,rad=0.0"
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11,
                                     color="#444444", lw=1.0, shrinkA=0, shrinkB=0,
                                     connectionstyle=style, zorder=1))


def graph_figure(width: float = 8.5, *, narrow: bool = False) -> Figure:
    r"""The forward graph of BatchNorm for one channel of :math:`K = |S_i|` values.

    Each node is one step of the forward pass; an arrow means "is computed from".  The
    backward pass visits the nodes from right to left; a node with several outgoing arrows
    (:math:`x_i`, :math:`\mu`) collects one gradient term per arrow.

    ``narrow``: the phone layout (:mod:`normcore.viz.phone`), the same nodes and arrows top
    to bottom, and the note under them on three lines.
    """
    terms = (r"a node with several outgoing arrows ($x_i$, $\mu$)", "adds up one term per arrow.")
    if narrow:
        fig = Figure(figsize=(phone.WIDTH, 4.0))
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, phone.WIDTH)
        ax.set_ylim(-3.75, 0.25)
        _draw_graph(ax, _NARROW)
        ax.text(phone.WIDTH / 2, -3.1, "forward: top to bottom.   backward: bottom to top;\n"
                + "\n".join(terms), ha="center", va="top", fontsize=10, color="#555555",
                linespacing=1.3)
    else:
        fig = Figure(figsize=(width, 2.65))
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(-0.5, 12.9)
        ax.set_ylim(-0.8, 2.0)
        _draw_graph(ax, _WIDE)
        ax.text(6.2, -0.62, "forward: left to right.   backward: right to left; " + " ".join(terms),
                ha="center", va="center", fontsize=10, color="#555555")
    ax.axis("off")
    return fig


# ---------------------------------------------------------------------------------------
# sigmoid and the near-linear range
# ---------------------------------------------------------------------------------------
def sigmoid_figure(normalized: torch.Tensor, restored: torch.Tensor,
                   width: float = 7.0, *, narrow: bool = False) -> Figure:
    """Pre-activations on a sigmoid: ``normalized`` (mean 0, variance 1) land on its
    near-linear middle (shaded: :math:`|t| < 2`); ``restored`` (after a scale gamma and shift
    beta) reach its bends.

    ``narrow``: the phone layout (:mod:`normcore.viz.phone`), the panels one above the other
    and the legend below them."""
    if narrow:
        fig = phone.figure(4.9)
        axs = fig.subplots(2, 1, sharex=True)
    else:
        fig = Figure(figsize=(width, 2.4), layout="constrained")
        axs = fig.subplots(1, 2, sharey=True)
    font = phone.FONT if narrow else 8.5
    grid = torch.linspace(-8, 8, 400, dtype=torch.float64)
    for ax, z, title, color in ((axs[0], normalized, r"normalized: $\hat x$", _BN_COLOR),
                                (axs[1], restored, r"after $\gamma\hat x+\beta$", _LN_COLOR)):
        z = z.detach().reshape(-1).to(torch.float64)
        ax.axvspan(-2, 2, color="#f0f0f0", zorder=0)
        ax.plot(grid.numpy(), torch.sigmoid(grid).numpy(), color="#888888", lw=1.2,
                label="sigmoid")
        near = torch.linspace(-2.2, 2.2, 2, dtype=torch.float64)
        ax.plot(near.numpy(), (0.5 + near / 4).numpy(), color="#888888", lw=0.8, ls="--",
                label="its tangent at 0")
        ax.scatter(z.numpy(), torch.sigmoid(z).numpy(), s=6, color=color, zorder=3,
                   label="pre-activations")
        ax.set_xlim(-8, 8)
        ax.set_ylim(-0.1, 1.1)
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=font)
        if not narrow or ax is axs[1]:
            ax.set_xlabel("pre-activation", fontsize=9)
    if narrow:
        axs[0].tick_params(labelbottom=True)
        phone.legend_below(fig, axs[0], ncol=2)
    else:
        axs[0].legend(fontsize=font, loc="upper left", frameon=False)
    return fig


# ---------------------------------------------------------------------------------------
# the noise of the batch statistics
# ---------------------------------------------------------------------------------------
def _minor_label(v: float, _pos) -> str:
    """Label the minor ticks 2, 3 and 5 of each decade of a log axis, no others."""
    if v <= 0:
        return ""
    lead = round(v / 10 ** math.floor(math.log10(v)))
    return f"{v:g}" if lead in (2, 3, 5) else ""


def spread_figure(batch_sizes: Sequence[int], mean_spread: Sequence[float],
                  var_spread: Sequence[float], width: float = 5.2, *,
                  narrow: bool = False) -> Figure:
    r"""Log-log plot of the spread (standard deviation over draws) of the batch mean and the
    batch variance against the batch size :math:`N`, with the :math:`1/\sqrt{N}` reference line.

    ``narrow``: the phone layout (:mod:`normcore.viz.phone`), the legend below the axes."""
    if not len(batch_sizes) == len(mean_spread) == len(var_spread) >= 1:
        raise ValueError(
            f"batch_sizes, mean_spread and var_spread must have the same length (at least 1), "
            f"got {len(batch_sizes)}, {len(mean_spread)} and {len(var_spread)}")
    fig = phone.figure(3.3) if narrow else Figure(figsize=(width, 2.8), layout="constrained")
    ax = fig.add_subplot()
    b = torch.tensor([float(v) for v in batch_sizes], dtype=torch.float64)
    for vals, label, color, marker in ((mean_spread, r"batch mean $\mu$", _BN_COLOR, "o"),
                                       (var_spread, r"batch variance $\sigma^2$", _LN_COLOR,
                                        "s")):
        v = torch.tensor([float(s) for s in vals], dtype=torch.float64)
        ax.loglog(b.numpy(), v.numpy(), marker=marker, color=color, label=label, ms=4)
    ref = float(mean_spread[-1]) * (b[-1] / b).sqrt()
    ax.loglog(b.numpy(), ref.numpy(), ls="--", color="#222222", lw=1, label=r"$\propto 1/\sqrt{N}$",
              zorder=3)
    ax.set_xticks([int(v) for v in batch_sizes], [str(int(v)) for v in batch_sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    ax.set_xlabel("batch size $N$", fontsize=9)
    ax.set_ylabel("spread over batches", fontsize=9)
    if narrow:
        ax.tick_params(which="both", labelsize=phone.FONT)
        phone.legend_below(fig, ax, ncol=2)
    else:
        ax.tick_params(which="both", labelsize=8.5)
        ax.legend(fontsize=8.5, frameon=False)
    return fig
