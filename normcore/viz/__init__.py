"""Pictures of the book.

* :mod:`normcore.viz.cube`: the N x C x (H·W) cube of the Group Normalization paper's
  Figure 2 as a hand-written SVG, with the set :math:`S_i` of a chosen element highlighted
  (read from :func:`normcore.axes.stat_groups`).

Each picture module reads which elements share statistics from :mod:`normcore.axes`, or gets
its numbers from :mod:`normcore.functional`; none of them restates the norms.
"""
from .cube import SetStatistics, cube_panels_svg, cube_svg, set_statistics  # noqa: F401
from . import running  # noqa: F401  (the running-statistics chapter: simulator frames, EMA weights)
from . import batch  # noqa: F401  (the BatchNorm chapter: batch-dependence frames, figures)
