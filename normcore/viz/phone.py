"""The phone layout of the chapters' matplotlib figures (the ``narrow=True`` of a figure
function, shown by :func:`normcore.images.responsive_figure` on a phone).

A phone layout is :data:`WIDTH` inches wide: :data:`normcore.images.NARROW_WIDTH_PX` px at
the book's 80 px per inch, about the text column of a 390 px phone.  Its text is at least
:data:`FONT` pt, 10 px there.  Its panels are stacked, and its legend stands below them
(:func:`legend_below`), where it can hide no data; the layout is matplotlib's
"constrained" one, which keeps every label inside the figure.
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.legend import Legend

from ..images import NARROW_WIDTH_PX

__all__ = ["WIDTH", "FONT", "figure", "legend_below"]

#: the width of a phone layout, in inches (NARROW_WIDTH_PX at 80 px per inch)
WIDTH = NARROW_WIDTH_PX / 80
#: the smallest font of a phone layout, in pt: 10 px at 80 px per inch
FONT = 9.0


def figure(height: float) -> Figure:
    """An empty phone layout, ``height`` inches tall, that keeps its text inside."""
    return Figure(figsize=(WIDTH, height), layout="constrained")


def legend_below(fig: Figure, axes: Axes | Sequence[Axes], ncol: int = 1,
                 fontsize: float = FONT) -> Legend:
    """The legend of ``axes`` (the entries of all of them, each label once) under the
    figure's panels, ``ncol`` entries a row."""
    handles, labels = [], []
    for ax in ([axes] if isinstance(axes, Axes) else axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=fontsize,
                      frameon=False, handlelength=1.5, handletextpad=0.5, columnspacing=1.0)
