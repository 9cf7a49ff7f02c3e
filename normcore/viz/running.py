r"""Pictures for the running-statistics chapter.

* :func:`simulation_figure`: one run of :func:`normcore.experiments.simulate_running_stats`
  in three panels over the training steps: the running mean and the running variance
  against the population values and the per-batch values, and the gap between train-mode
  and eval-mode outputs on held-out data.  The frames of the chapter's simulator widget;
  :func:`simulation_png` renders one frame as a small PNG.
* :func:`ema_weights_figure`: the weight :math:`\alpha(1-\alpha)^j` that the running
  statistic gives the batch :math:`j` steps back, for several momenta :math:`\alpha`.

Text in the figures is at least 9 pt: shown at 80 px per inch (the static widget's ``dpi``)
that is at least 10 px on the page.

The numbers all come from the simulation (which uses :class:`normcore.nn.BatchNorm1d` and
:mod:`normcore.stats`) or from the EMA formula of :mod:`normcore.stats`; nothing here
recomputes a statistic.  Every figure is a plain :class:`matplotlib.figure.Figure` (not
registered with pyplot), so a cell that returns one shows it once.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from matplotlib.figure import Figure

from .. import stats
from ..experiments.running import RunningSimulation
from ..widgets import figure_to_png
from . import phone

__all__ = ["simulation_figure", "simulation_png", "ema_weights_figure", "title", "COLORS"]

#: One color per curve, shared by the figures and the chapter's prose.
COLORS = {
    "population": "#222222",
    "batch": "#9a9a9a",
    "running": "#1f77b4",
    "biased": "#ff7f0e",
    "train_eval": "#9467bd",
    "eval_ideal": "#2ca02c",
    "shift": "#d62728",
}


def _limits(sim: RunningSimulation) -> tuple[tuple[float, float], tuple[float, float]]:
    """Axis limits from the populations only (not the data), so frames compare at a glance."""
    pops = (sim.before, sim.after)
    lo = min(p.mean - 2.5 * p.std for p in pops)
    hi = max(p.mean + 2.5 * p.std for p in pops)
    vmax = 2.5 * max(p.var for p in pops)
    return (min(lo, sim.initial_mean) - 0.25, hi + 0.25), (0.0, vmax)


def title(sim: RunningSimulation) -> str:
    """The frame's title in the book's notation: momentum alpha, batch size N."""
    a = "None (cumulative)" if sim.momentum is None else f"{sim.momentum:g}"
    s = f"shift after step {sim.shift_step}" if sim.shift else "no shift"
    return f"momentum \u03b1 = {a}, batch size N = {sim.batch_size}, {s}"


def simulation_figure(sim: RunningSimulation, channel: int = 0, *,
                      figsize: tuple[float, float] | None = None, narrow: bool = False) -> Figure:
    """Three panels over the steps of one simulation (``channel`` of it).

    ``narrow``: the layout for a phone's column (3.7 inches wide, 296 px at the widget's 80 dpi):
    the legend in one column and the title on two lines, the same text sizes. ``figsize``
    defaults to (7.2, 5.9), or (3.7, 7.4) when narrow.

    1. mean: the per-batch means (grey dots), the population mean (black, dashed), and
       ``running_mean`` (blue);
    2. variance: the per-batch unbiased variances (grey dots; values above the axis are
       drawn on its top edge), the population variance, ``running_var`` (blue), and the
       buffer of a layer that stores the *biased* variance (orange);
    3. the root-mean-square gap on held-out data between train-mode and eval-mode outputs
       (purple), and between eval-mode outputs and the population-normalized ideal (green);
       these two are over every channel.

    The axis limits depend on the populations only, so all frames of a grid share them.
    """
    if not isinstance(sim, RunningSimulation):
        raise TypeError(f"simulation_figure: expected a RunningSimulation, got {type(sim).__name__}")
    if isinstance(channel, bool) or not isinstance(channel, numbers.Integral) \
            or not 0 <= channel < sim.channels:
        raise ValueError(f"simulation_figure: channel must be an int in [0, {sim.channels}), "
                         f"got {channel!r}")
    c = int(channel)
    t = sim.step.numpy()
    t0 = torch.cat([torch.zeros(1, dtype=torch.int64), sim.step]).numpy()  # with the initial value
    (mlo, mhi), (vlo, vhi) = _limits(sim)

    if figsize is None:
        figsize = (3.7, 7.4) if narrow else (7.2, 5.9)
    fig = Figure(figsize=figsize)
    axes = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1, 0.8]})
    if narrow:
        fig.subplots_adjust(left=0.2, right=0.96, top=0.785, bottom=0.065, hspace=0.12)
    else:
        fig.subplots_adjust(left=0.11, right=0.985, top=0.835, bottom=0.075, hspace=0.12)
    dot = dict(s=3, color=COLORS["batch"], linewidths=0, zorder=1)
    pop = dict(color=COLORS["population"], lw=1.3, ls="--", zorder=3, drawstyle="steps-pre")

    ax = axes[0]
    ax.scatter(t, sim.batch_mean[:, c].numpy().clip(mlo, mhi), label="per-batch value", **dot)
    ax.plot(t, sim.true_mean.numpy(), label="population value", **pop)
    ax.plot(t0, torch.cat([torch.tensor([sim.initial_mean], dtype=torch.float64),
                           sim.running_mean[:, c]]).numpy(),
            color=COLORS["running"], lw=1.6, zorder=4, label="running_mean / running_var")
    ax.set_ylim(mlo, mhi)
    ax.set_ylabel("mean")

    ax = axes[1]
    ax.scatter(t, sim.batch_var_unbiased[:, c].numpy().clip(vlo, vhi), **dot)
    ax.plot(t, sim.true_var.numpy(), **pop)
    init_v = torch.tensor([sim.initial_var], dtype=torch.float64)
    ax.plot(t0, torch.cat([init_v, sim.running_var_biased[:, c]]).numpy(),
            color=COLORS["biased"], lw=1.2, zorder=3, label="running_var if the biased var were stored")
    ax.plot(t0, torch.cat([init_v, sim.running_var[:, c]]).numpy(),
            color=COLORS["running"], lw=1.6, zorder=4)
    ax.set_ylim(vlo, vhi)
    ax.set_ylabel("variance")

    ax = axes[2]
    ax.plot(t, sim.gap_train_eval.numpy(), color=COLORS["train_eval"], lw=1.4,
            label="train-mode vs eval-mode output")
    ax.plot(t, sim.gap_eval_ideal.numpy(), color=COLORS["eval_ideal"], lw=1.4,
            label="eval-mode vs ideal output")
    ax.set_yscale("log")
    ax.set_ylim(0.005, 4)
    ax.set_ylabel("RMS gap on\nheld-out data")
    ax.set_xlabel("training step")
    ax.set_xlim(0, sim.steps)

    for ax in axes:
        ax.grid(True, lw=0.4, alpha=0.5)
        ax.tick_params(labelsize=9, length=2)
        ax.yaxis.label.set_size(9.5)
        if sim.shift:
            ax.axvline(sim.shift_step + 0.5, color=COLORS["shift"], lw=1, ls=":", zorder=2)
    axes[2].xaxis.label.set_size(9.5)
    if sim.shift:
        axes[0].annotate("shift", (sim.shift_step + 4, mhi), va="top", fontsize=9,
                         color=COLORS["shift"], xycoords="data")
    handles = []
    labels = []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, loc="upper center", ncol=1 if narrow else 2, fontsize=9,
               frameon=False, bbox_to_anchor=(0.55, 0.945) if narrow else (0.53, 0.965),
               handlelength=1.6, columnspacing=1.5, markerscale=2.5, labelspacing=0.3)
    head = title(sim)
    fig.suptitle(head.replace("batch size", "\nbatch size") if narrow else head, fontsize=10,
                 y=0.997 if narrow else 0.995)
    return fig


def simulation_png(sim: RunningSimulation, *, dpi: int = 80, colors: int | None = 64) -> bytes:
    """:func:`simulation_figure` as a small PNG (adaptive palette of ``colors`` colors).

    The chapter's widget passes the Figure itself to ``static_widget``, which renders it at
    twice ``dpi`` for HiDPI screens."""
    return figure_to_png(simulation_figure(sim), dpi=dpi, colors=colors)


def ema_weights_figure(momenta: Sequence[float] = (0.01, 0.1, 0.5), lags: int = 60, *,
                       figsize: tuple[float, float] | None = None, narrow: bool = False) -> Figure:
    r"""The weight :math:`\alpha(1-\alpha)^j` of the batch :math:`j` steps back, one curve per
    momentum :math:`\alpha`.

    The weights are read off :func:`normcore.stats.ema_update_` itself: feed a running value
    of 0 a single 1 followed by zeros, and the running value after :math:`j` more steps is
    the weight that the update gives a value :math:`j` steps old.

    ``figsize`` defaults to (6.4, 2.6), or (3.7, 3.3) when ``narrow``: the phone layout
    (:mod:`normcore.viz.phone`), the legend below the axes.
    """
    if isinstance(lags, bool) or not isinstance(lags, numbers.Integral) or lags < 1:
        raise ValueError(f"ema_weights_figure: lags must be a positive int, got {lags!r}")
    momenta = list(momenta)
    if not momenta:
        raise ValueError("ema_weights_figure: give at least one momentum")
    if figsize is None:
        figsize = (phone.WIDTH, 3.3) if narrow else (6.4, 2.6)
    fig = Figure(figsize=figsize, layout="constrained" if narrow else None)
    ax = fig.subplots()
    if not narrow:
        fig.subplots_adjust(left=0.14, right=0.98, top=0.95, bottom=0.2)
    for m in momenta:
        stats.check_momentum(m)
        if m is None:
            raise ValueError("ema_weights_figure: momentum=None has weights 1/t that depend on "
                             "the step t; draw numbers only")
        r = torch.zeros(1, dtype=torch.float64)
        w = []
        for j in range(lags):
            stats.ema_update_(r, torch.ones(1) if j == 0 else torch.zeros(1), m)
            w.append(float(r))
        ax.plot(range(lags), w, marker="o", ms=2.5, lw=1.2, label=f"momentum \u03b1 = {m:g}")
    ax.set_yscale("log")
    ax.set_ylim(1e-4, 1)
    ax.set_xlabel("age of the batch statistic (steps back)", fontsize=9)
    ax.set_ylabel("weight in the\nrunning value", fontsize=9)
    ax.tick_params(labelsize=phone.FONT if narrow else 8)
    ax.grid(True, lw=0.4, alpha=0.5)
    if narrow:
        phone.legend_below(fig, ax, ncol=2)
    else:
        ax.legend(fontsize=8, frameon=False)
    return fig
