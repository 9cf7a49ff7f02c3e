"""Pictures of the book, one module per chapter, imported on first use.

* :mod:`normcore.viz.cube`: the N x C x (H·W) cube of the Group Normalization paper's
  Figure 2 as a hand-written SVG, with the set :math:`S_i` of a chosen element highlighted
  (read from :func:`normcore.axes.stat_groups`);
* :mod:`normcore.viz.batch`: the BatchNorm chapter's figures and batch-dependence frames;
* :mod:`normcore.viz.running`: the running-statistics chapter's simulator frames;
* :mod:`normcore.viz.ws`: the Weight Standardization chapter's widget frames (SVG).
* :mod:`normcore.viz.phone`: the phone layout of the chapters' matplotlib figures (their
  ``narrow=True``): its width, its smallest font, and the legend below the panels.

Each picture module reads which elements share statistics from :mod:`normcore.axes`, or gets
its numbers from :mod:`normcore.functional`; none of them restates the norms.  A module is
imported when it is first named (``normcore.viz.running``), so ``import normcore.viz`` does
not load matplotlib for a chapter that draws SVG only.
"""
from __future__ import annotations

import importlib
import pkgutil

from .._extras import require

require(__name__)   # without normcore[book]: an ImportError that names it

#: the cube's names, re-exported for ``from normcore.viz import cube_svg``
_CUBE_NAMES = ("SetStatistics", "cube_panels_svg", "cube_svg", "set_statistics")


def __getattr__(name: str):
    if name in _CUBE_NAMES:
        return getattr(importlib.import_module(f"{__name__}.cube"), name)
    if name in {m.name for m in pkgutil.iter_modules(__path__)}:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(_CUBE_NAMES) + [m.name for m in pkgutil.iter_modules(__path__)])


__all__ = list(_CUBE_NAMES)
