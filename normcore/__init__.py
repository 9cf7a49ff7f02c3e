"""normcore: normalization layers written from one formula and checked against PyTorch.

The layers, each importing only from those above it:

* :mod:`~normcore.axes`: which elements share statistics (THE table), and
  :mod:`~normcore.stats`: variances, Chan's merge, running averages;
* :mod:`~normcore._checks`: argument validation, one message per mistake;
* :mod:`~normcore.core`: the numeric core, the formula in named steps (the reference);
* :mod:`~normcore.dispatch`: which implementation runs a call, the reference or the compiled
  kernels (:class:`use_kernels` switches them, :func:`explain` says why);
  :mod:`~normcore.loops` and :mod:`~normcore.positions`: the kernels' loops (numba, the
  extra ``normcore[fast]``), :mod:`~normcore.kernels`: run on the views they read;
* :mod:`~normcore.grad`: hand-derived backward passes (autograd Functions),
  :mod:`~normcore.frozen`: BN and IN with the running statistics, and
  :mod:`~normcore.grad_dyt`: Dynamic Tanh's formula and backward;
* :mod:`~normcore.functional`: the public ops, with ``torch.nn.functional``'s signatures;
* :mod:`~normcore.sync`: synchronized statistics; :mod:`~normcore.nn`: drop-in modules;
  :mod:`~normcore.fold`: folding BN into the layer before it;
* the book's tools: :mod:`~normcore.launch` (process launcher), :mod:`~normcore.data`
  (seeded inputs), :mod:`~normcore.experiments`, :mod:`~normcore.invariance` (what leaves a
  layer's output unchanged, by experiment), :mod:`~normcore.choose` (every layer side by side,
  each claim checked), :mod:`~normcore.exercises` (checkers that name misconceptions),
  :mod:`~normcore.widgets` and :mod:`~normcore.viz`.

The library is what ``import normcore`` loads: the layers above up to :mod:`~normcore.nn`
and :mod:`~normcore.fold`, which need only torch.  It imports none of the book's tools; those
are imported by name, and the ones that need more than torch (matplotlib, ipywidgets, SciPy,
nbformat, ...) say so with an ``ImportError`` that names the extra ``normcore[book]`` and how
to install it (:mod:`normcore._extras`).
"""
from . import axes, functional, stats, nn, fold
from .dispatch import explain, kernels_enabled, use_kernels

__version__ = "0.1.0"
__all__ = ["axes", "functional", "stats", "nn", "fold", "use_kernels", "kernels_enabled",
           "explain"]
