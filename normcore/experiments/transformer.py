r"""A tiny transformer on MNIST-1D, with its norm layers as a parameter (chapters 8 and 9).

The claims behind it: Zhu et al. (2025) observe that a trained transformer's LayerNorms map
their inputs to their outputs along tanh-like S-curves, and replace every LayerNorm by
DyT, :math:`\gamma \tanh(\alpha x) + \beta` with one learned scalar :math:`\alpha`; a later
study finds that DyT helps when data are scarce and hurts when they are not.  This is the
same model family in miniature, small enough to train in about a second on one CPU thread:

* the task (:func:`data`): MNIST-1D (:func:`normcore.datasets.mnist1d`), signals of length
  40 of the ten digits, padded, sheared, scaled, translated and blurred with correlated noise;
  4,000 signals to train (or the first ``n_train`` of them), 1,000 to test.  Where a digit
  sits in the signal varies by up to 48 of the template's samples, so no single position
  carries the class: the model has to compare positions, which is what attention does;
* the model (:class:`TinyTransformer`): the signal cut into ``T = 10`` overlapping patches
  of 8 samples every 4 (a ``Conv1d(1, C, 8, stride=4, padding=2)``, the tokens), a learned
  position embedding, ``M`` (2) layers of self-attention (2 heads) and a feed-forward network
  ``C -> 2C -> C`` (GELU), each in a residual connection with a norm placed **pre** (on the
  branch, with a final norm before the head) or **post** (after the addition); then the mean
  over the tokens and ``linear(C -> 10)``.  ``C = 32`` gives 17,770 parameters and the
  norms' own: 18,090 with LayerNorm (:math:`\gamma, \beta` of 5 norms), 17,930 with
  RMSNorm (no :math:`\beta`), 18,095 with DyT (one :math:`\alpha` more per norm);
* the norm (:data:`NORMS`): ``"layer"`` (:class:`normcore.nn.LayerNorm`), ``"rms"``
  (:class:`normcore.nn.RMSNorm`), ``"dyt"`` (:class:`normcore.nn.DyT`, with ``alpha0`` the
  initial :math:`\alpha`, 0.5 as in the paper) or ``"none"`` (the identity), at every place a
  norm stands, the final one included;
* training (:func:`train_model`): AdamW (learning rate ``lr`` 4e-3, no weight decay) with a
  cosine schedule to 0 over ``steps`` (300) steps of ``batch`` (64) signals drawn with
  replacement from the training set, the initial weights and the draws from the seed; the
  metrics are the accuracy and the loss on the 1,000 test signals, and the accuracy on the
  training signals (at most 1,000 of them), in eval mode.

So the configs of a sweep differ in the norm, ``alpha0`` or ``n_train`` only: at a given
seed, every norm starts from the same weights of the attention, the feed-forward networks,
the stem and the head (the norms' own parameters are created after them), and sees the same
batches when ``n_train`` is the same.  The chapter runs :data:`COMPARE` through
:func:`normcore.experiments.runner.run`.  :func:`norm_io` and :func:`tanh_fit` are the
S-curve observation: every norm's input and output on a batch, and the least-squares
:math:`\gamma \tanh(\alpha x) + \beta` through them against the best line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as TF

from .. import nn as ncnn
from .runner import Experiment
from .training import check_schedule, evaluate, train_cosine

__all__ = ["NORMS", "PLACEMENTS", "TinyTransformer", "data", "train_model", "trained",
           "norm_io", "tanh_fit", "TanhFit", "COMPARE"]

#: The norm layers a model can have; "none" puts the identity in their place.
NORMS = ("layer", "rms", "dyt", "none")
#: Where the norm stands: on the branch (Pre-LN) or after the addition (Post-LN).
PLACEMENTS = ("pre", "post")
NUM_CLASSES = 10
LENGTH = 40                         # MNIST-1D's signal length


def _check(where: str, norm: str, placement: str, C: int, M: int, heads: int) -> None:
    if norm not in NORMS:
        raise ValueError(f"{where}: unknown norm {norm!r}; choose one of "
                         + ", ".join(repr(n) for n in NORMS))
    if placement not in PLACEMENTS:
        raise ValueError(f"{where}: unknown placement {placement!r}; choose 'pre' (the norm "
                         "on the branch) or 'post' (after the residual addition)")
    if M < 1 or heads < 1 or C < heads or C % heads:
        raise ValueError(f"{where}: needs M >= 1 layers and a width C divisible by the "
                         f"number of heads, got M={M}, C={C}, heads={heads}")


def make_norm(norm: str, C: int, alpha0: float = 0.5) -> torch.nn.Module:
    """One norm layer over the last dim (``C``)."""
    if norm == "layer":
        return ncnn.LayerNorm(C)
    if norm == "rms":
        return ncnn.RMSNorm(C)
    if norm == "dyt":
        return ncnn.DyT(C, alpha_init_value=alpha0)
    return torch.nn.Identity()


class Block(torch.nn.Module):
    """Self-attention and a feed-forward network, each in a residual connection with a norm
    placed as ``placement`` says."""

    def __init__(self, C: int, heads: int):
        super().__init__()
        nn = torch.nn
        self.heads = heads
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ff = nn.Sequential(nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C))

    def add_norms(self, norm: str, placement: str, alpha0: float) -> None:
        C = self.proj.out_features
        self.placement = placement
        self.norm1 = make_norm(norm, C, alpha0)
        self.norm2 = make_norm(norm, C, alpha0)

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        N, T, C = h.shape
        q, k, v = self.qkv(h).view(N, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        out = TF.scaled_dot_product_attention(q, k, v)              # N, heads, T, C/heads
        return self.proj(out.transpose(1, 2).reshape(N, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.placement == "pre":                       # x + F(norm(x))
            x = x + self.attention(self.norm1(x))
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.attention(x))             # norm(x + F(x))
        return self.norm2(x + self.ff(x))


class TinyTransformer(torch.nn.Module):
    """Patches of an MNIST-1D signal as tokens, ``M`` transformer layers, a linear head.

    Args:
        norm: one of :data:`NORMS`, at every place a norm stands.
        placement: ``"pre"`` (with a final norm before the head) or ``"post"``.
        C: the width; ``M``: the number of layers; ``heads``: attention heads.
        alpha0: DyT's initial :math:`\alpha` (``norm="dyt"`` only).
    Shape:
        input ``(N, 1, 40)`` or ``(N, 40)``; output ``(N, 10)`` logits.
    """

    def __init__(self, norm: str = "layer", placement: str = "pre", C: int = 32, M: int = 2,
                 heads: int = 2, alpha0: float = 0.5):
        super().__init__()
        _check("TinyTransformer", norm, placement, C, M, heads)
        nn = torch.nn
        self.norm, self.placement = norm, placement
        self.stem = nn.Conv1d(1, C, 8, stride=4, padding=2)          # 10 tokens of 8 samples
        self.pos = nn.Parameter(0.02 * torch.randn(1, LENGTH // 4, C))
        self.blocks = nn.ModuleList([Block(C, heads) for _ in range(M)])
        self.head = nn.Linear(C, NUM_CLASSES)
        # the norms last: every norm starts from the same draw of the other weights
        for block in self.blocks:
            block.add_norms(norm, placement, alpha0)
        self.final = make_norm(norm if placement == "pre" else "none", C, alpha0)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The embedded patches plus the position embedding: ``(N, T, C)``."""
        if x.dim() == 2:
            x = x[:, None]
        return self.stem(x).transpose(1, 2) + self.pos

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.final(h).mean(1))


def data(n_train: int = 4000) -> tuple[torch.Tensor, ...]:
    """MNIST-1D (:func:`normcore.datasets.mnist1d`, its default split): the first
    ``n_train`` training signals and labels, and the 1,000 test signals and labels."""
    from ..datasets import mnist1d

    d = mnist1d()
    if isinstance(n_train, bool) or not isinstance(n_train, int) \
            or not NUM_CLASSES <= n_train <= len(d.x):
        raise ValueError(f"data: n_train must be an int from {NUM_CLASSES} to {len(d.x)} "
                         f"(MNIST-1D's training signals), got {n_train!r}")
    return d.x[:n_train], d.y[:n_train], d.x_test, d.y_test


def train_model(seed: int, norm: str = "layer", placement: str = "pre", n_train: int = 4000,
                steps: int = 300, batch: int = 64, lr: float = 4e-3, C: int = 32, M: int = 2,
                heads: int = 2, alpha0: float = 0.5, warmup: int = 0,
                dtype: torch.dtype = torch.float32,
                losses: list[float] | None = None) -> tuple[TinyTransformer, dict[str, float]]:
    """Train a :class:`TinyTransformer` and return it (in eval mode) with its metrics:
    ``test_accuracy``, ``test_loss``, ``train_accuracy`` and ``train_loss`` (on the first
    1,000 training signals).  ``warmup``: steps of linear warm-up before the cosine
    (:func:`~.training.lr_factor`); ``losses``, if a list, receives every step's batch loss."""
    _check("train_model", norm, placement, C, M, heads)
    check_schedule("train_model", steps, warmup)
    x, y, x_test, y_test = data(n_train)
    x, x_test = x.to(dtype), x_test.to(dtype)
    torch.manual_seed(seed)
    net = TinyTransformer(norm, placement, C, M, heads, alpha0).to(dtype)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0, fused=True)
    curve = train_cosine(net, opt, x, y, steps, batch, seed, warmup)   # cosine from lr to 0
    if losses is not None:
        losses.extend(curve)
    test_accuracy, test_loss = evaluate(net, x_test, y_test)
    train_accuracy, train_loss = evaluate(net, x[:1000], y[:1000])
    return net, {"test_accuracy": test_accuracy, "test_loss": test_loss,
                 "train_accuracy": train_accuracy, "train_loss": train_loss}


def trained(seed: int, norm: str, **config) -> dict[str, float]:
    """:func:`train_model` as an experiment: its metrics, and for DyT the learned
    :math:`\alpha` of each DyT layer after training (``alpha1`` ... in the order of
    :func:`norm_io`) and their mean ``alpha``."""
    net, metrics = train_model(seed, norm, **config)
    if norm == "dyt":
        alphas = [float(m.alpha.detach()) for m in _norm_layers(net)]
        metrics.update({f"alpha{i + 1}": a for i, a in enumerate(alphas)})
        metrics["alpha"] = sum(alphas) / len(alphas)
    return metrics


#: The chapter's runs: configs ``{"norm", ...}`` (and ``alpha0``, ``n_train``, ``steps``).
COMPARE = Experiment("transformer.compare", trained,
                     held_equal="300 AdamW steps of batch 64 (cosine learning rate from 4e-3), "
                                "the same initial weights outside the norms and the same "
                                "batches per seed, the same 1,000 test signals")


# --- the S-curves ---------------------------------------------------------------------------

def norm_io(model: TinyTransformer, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every norm layer's input and output ``(N, T, C)`` on the batch ``x``, in the order
    the forward pass meets them (the final norm last)."""
    found: list[tuple[torch.Tensor, torch.Tensor]] = []
    norms = _norm_layers(model)
    hooks = [m.register_forward_hook(lambda m, i, o: found.append((i[0].detach(), o.detach())))
             for m in norms]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return found


def _norm_layers(model: TinyTransformer) -> list[torch.nn.Module]:
    layers = [m for b in model.blocks for m in (b.norm1, b.norm2)] + [model.final]
    return [m for m in layers if not isinstance(m, torch.nn.Identity)]


@dataclass(frozen=True)
class TanhFit:
    """The least-squares ``gamma * tanh(alpha * x) + beta`` through points ``(x, y)``, and
    the share of the variance of ``y`` it explains (``r2``) beside the best line's."""

    gamma: float
    alpha: float
    beta: float
    r2: float
    r2_line: float

    @property
    def unexplained_ratio(self) -> float:
        """The line's unexplained variance over the tanh's: how many times more it leaves."""
        return (1 - self.r2_line) / (1 - self.r2)


def tanh_fit(x: torch.Tensor, y: torch.Tensor) -> TanhFit:
    """Fit ``y ~ gamma tanh(alpha x) + beta`` and ``y ~ a x + b`` by least squares, in
    float64.  For a given ``alpha`` the best ``gamma`` and ``beta`` are linear least squares;
    ``alpha`` is found on a log grid and refined by golden-section search, so the fit is
    deterministic (no starting point, no random restarts)."""
    x = x.detach().reshape(-1).double()
    y = y.detach().reshape(-1).double()
    if x.numel() != y.numel() or x.numel() < 3:
        raise ValueError(f"tanh_fit: needs x and y of the same size, at least 3 points; got "
                         f"{x.numel()} and {y.numel()}")
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0:
        raise ValueError("tanh_fit: y is constant; there is no variance to explain")

    def lstsq(feature: torch.Tensor) -> tuple[float, float, float]:
        A = torch.stack([feature, torch.ones_like(feature)], 1)
        coef = torch.linalg.lstsq(A, y[:, None]).solution[:, 0]
        return float(coef[0]), float(coef[1]), float(((A @ coef - y) ** 2).sum())

    scale = float(x.abs().max())
    if scale == 0:
        raise ValueError("tanh_fit: x is all zeros")

    def sse(log_alpha: float) -> float:
        return lstsq(torch.tanh(math.exp(log_alpha) * x))[2]

    grid = [math.log(1e-3 / scale) + i * math.log(1e5) / 60 for i in range(61)]
    best = min(range(61), key=lambda i: sse(grid[i]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, 60)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):                                    # golden-section on log alpha
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if sse(a) < sse(b):
            hi = b
        else:
            lo = a
    alpha = math.exp((lo + hi) / 2)
    gamma, beta, err = lstsq(torch.tanh(alpha * x))
    _, _, err_line = lstsq(x)
    return TanhFit(gamma, alpha, beta, 1 - err / total, 1 - err_line / total)
