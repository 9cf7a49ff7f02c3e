r"""Pre-LN against Post-LN, trained: the learning rate each tolerates, with and without warm-up.

The claim behind it (Xiong et al. 2020): a Post-LN transformer, whose LayerNorm follows each
residual addition, :math:`x_{l+1} = \mathrm{LN}(x_l + \mathcal{F}(x_l))`, needs a
learning-rate warm-up to train at a large learning rate, while a Pre-LN one,
:math:`x_{l+1} = x_l + \mathcal{F}(\mathrm{LN}(x_l))`, trains without it.  In miniature:

* the model and the data: :class:`~.transformer.TinyTransformer` on MNIST-1D (signals cut
  into ``T = 10`` patch tokens; where a digit sits varies, so the model has to compare
  positions), with LayerNorm, ``M = 12`` layers (deeper than chapter 9's two: Post-LN's trouble
  grows with depth) of width ``C = 16``, 2 heads;
* training (:func:`~.transformer.train_model`): AdamW (no weight decay) for ``steps`` (80)
  steps of ``batch`` (64) signals, the learning rate :math:`\eta` rising linearly from 0
  over ``warmup`` steps (0: none) and then falling along a cosine to 0
  (:func:`~.training.lr_factor`); the initial weights and the batches from the seed;
* the metrics (:func:`train`): ``train_loss``, the cross-entropy on the first 1,000
  training signals after the last step, in eval mode (the number the claim is about;
  :math:`\ln 10 \approx 2.30` is chance), ``test_accuracy`` on the 1,000 test signals, and
  the loss curve, ``loss@10`` ... ``loss@80``: the mean batch loss of each window of 10
  steps (rounded to 4 decimals, for a small results file).

At a given seed every config starts from the same weights (the placement does not change
what is drawn) and sees the same batches, so the configs differ only in the placement, the
learning rate and the warm-up.  The chapter runs :data:`TRAIN` through
:func:`normcore.experiments.runner.run`, by way of the sweep ``prepost``.
"""
from __future__ import annotations

from .runner import Experiment
from .transformer import train_model

__all__ = ["WINDOW", "train", "TRAIN"]

#: The loss curve's window: the mean batch loss over this many steps.
WINDOW = 10


def train(seed: int, placement: str, lr: float, warmup: int = 0, M: int = 12, C: int = 16,
          steps: int = 80, batch: int = 64) -> dict[str, float]:
    """Train one LayerNorm :class:`~.transformer.TinyTransformer`; its final ``train_loss``,
    ``test_accuracy``, ``test_loss`` and the windowed loss curve ``loss@t``."""
    if steps % WINDOW:
        raise ValueError(f"train: steps must be a multiple of {WINDOW} (the loss curve's "
                         f"window), got {steps}")
    losses: list[float] = []
    _, metrics = train_model(seed, "layer", placement, steps=steps, batch=batch, lr=lr,
                             C=C, M=M, warmup=warmup, losses=losses)
    out = {k: metrics[k] for k in ("train_loss", "test_accuracy", "test_loss")}
    for end in range(WINDOW, steps + 1, WINDOW):
        out[f"loss@{end}"] = round(sum(losses[end - WINDOW:end]) / WINDOW, 4)
    return out


#: The chapter's runs: configs ``{"placement", "lr", "warmup"}``.
TRAIN = Experiment("prepost.train", train,
                   held_equal="80 AdamW steps of batch 64 (a cosine to 0, after the warm-up "
                              "if any), the same initial weights and the same batches per "
                              "seed; M = 12 layers of width C = 16 with LayerNorm")
