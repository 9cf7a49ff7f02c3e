"""normcore: normalization layers written from one formula and checked against PyTorch.

Modules: :mod:`~normcore.axes` (which elements share statistics), :mod:`~normcore.functional`
(the pure functions), :mod:`~normcore.stats` (variances, Chan's merge, running averages),
:mod:`~normcore.nn` (drop-in modules), :mod:`~normcore.grad` (hand-derived backward passes),
:mod:`~normcore.fold` (folding BN into the layer before it), :mod:`~normcore.exercises`
(checkers that name misconceptions), :mod:`~normcore.widgets` and :mod:`~normcore.viz`.
"""
from . import axes, functional, stats, nn, fold  # noqa: E402  (nn loads distributed)

__version__ = "0.1.0"
__all__ = ["axes", "functional", "stats", "nn", "fold"]
