r"""What the minibatch does to BatchNorm: its size, and its make-up.  A 1-D CNN on MNIST-1D.

Two claims behind it.  Wu & He 2018 (Table 2): ResNet-50's ImageNet error with BN rises from
23.6 % at 32 images per GPU to 34.7 % at 2, while GN's stays at 24.0-24.2 %; BN's statistics
are taken per GPU.  Ioffe 2017 (Batch Renormalization): batches whose examples are not drawn
independently (his example: 16 labels, 2 images each) make a BN network depend on how its
batches are made, and Batch Renorm, which trains with the statistics used at inference, is
his remedy.

Every run takes ``steps`` Adam steps of ``batch`` (32) signals from the same initial weights;
the configs change one thing each:

* ``group``: the samples BN's statistics are taken over (the "images per GPU").  With
  ``group < batch`` BN splits each batch into ``batch / group`` *ghost batches* and
  normalizes each with its own statistics (:class:`GhostBatchNorm1d`), as that many devices
  without synchronized statistics would, while the optimizer still sees the whole batch:
  the optimization is held equal and only BN's statistics change.  LN, IN, GN never look
  across samples: their runs do not depend on ``group`` and are trained once;
* ``grouping``: the ghost batches are consecutive slices of the batch as drawn
  (``"random"``) or of the batch sorted by label (``"sorted"``): the same examples, the same
  gradient, but each of BN's sets holds only a class or two;
* ``sampling``: ``"iid"`` batches (the training set shuffled each epoch) or ``"sorted"``
  batches of ``classes`` (2) classes, ``batch / classes`` signals of each, the classes drawn
  afresh for every batch: then the optimizer's batches are not i.i.d. either;
* ``norm``: ``"bn"``, ``"brn"`` (Batch Renorm, :mod:`normcore.experiments.renorm`, with its
  warm-up :func:`~normcore.experiments.renorm.schedule`), ``"ln"`` (``GroupNorm(1, C)``:
  LayerNorm over channels and positions, as in the GN paper), ``"in"`` (``GroupNorm(C, C)``),
  ``"gn"`` (``GroupNorm(8, C)``) or ``"ws+gn"`` (GN after weight-standardized convolutions);
* ``net``: the lengths of the four ``conv1d - norm - ReLU`` blocks (:func:`cnn`),
  ``"strided"`` (40, 20, 10, 5 positions) or ``"flat"`` (40 throughout).

For a given seed, every config of one ``sampling`` draws the same batches in the same order.
The data: MNIST-1D (:func:`normcore.datasets.mnist1d`), 4,000 training and 1,000 test
signals of length 40, ten classes.  The metrics: ``test_accuracy`` (and ``test_error``) in
eval mode, with the running statistics; for BN and Batch Renorm also ``batch_accuracy``, the
test accuracy in training mode on test batches drawn and grouped as the training batches
were (the statistics the network trained with), ``population_accuracy``, in eval mode after
the running buffers are replaced by the statistics of the whole training set, and
``noise@l`` for each normalized layer ``l``: the root-mean-square difference between a value
normalized with its ghost batch's statistics and with the whole test set's, over ghost
batches made as in training.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as TF

from .. import axes, datasets
from .. import nn as ncnn
from .renorm import batch_renorm, schedule
from .runner import Experiment

__all__ = ["GhostBatchNorm1d", "cnn", "batches", "grouped", "trained", "NORMS", "NETS", "TRAIN"]

NORMS = ("bn", "brn", "ln", "in", "gn", "ws+gn")
#: The stride of each of the four convolutions.
NETS = {"strided": (1, 2, 2, 2), "flat": (1, 1, 1, 1)}
GN_GROUPS = 8
EPS = 1e-5


class GhostBatchNorm1d(torch.nn.Module):
    r"""BatchNorm (or Batch Renorm) whose training statistics come from ghost batches.

    In training, an input ``(N, C, L)`` with ``N = P * group`` is split into ``P``
    consecutive ghost batches of ``group`` samples; each is normalized with its own mean and
    biased variance over its ``group * L`` values per channel, as ``P`` devices without
    synchronized statistics would: by torch's fused ``batch_norm`` (the function
    :func:`normcore.functional.batch_norm` computes, about three times faster on these small
    tensors, which the chapter's time budget needs), or with ``renorm`` by
    :func:`normcore.experiments.renorm.batch_renorm` (its ``r`` and ``d``
    taken against the shared running buffers, its bounds set by :meth:`set_bounds`).  The
    running buffers are shared: each step moves them with the mean over the ghost batches
    of what each would have moved them by (as if the devices averaged their buffers after
    every step).  Eval mode normalizes with them.  ``group = N`` is plain BatchNorm (or
    Batch Renorm), buffers included.
    """

    def __init__(self, num_features: int, group: int, batch: int, renorm: bool = False,
                 momentum: float = 0.1, eps: float = EPS):
        super().__init__()
        if group < 2 or batch % group:
            raise ValueError(f"GhostBatchNorm1d: group ({group}) must be at least 2 and divide "
                             f"the batch ({batch}) into whole ghost batches; choose a divisor "
                             f"of {batch}")
        self.group, self.devices, self.renorm = group, batch // group, renorm
        self.momentum, self.eps = momentum, eps
        self.r_max, self.d_max = 1.0, 0.0
        self.weight = torch.nn.Parameter(torch.ones(num_features))
        self.bias = torch.nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        # BN tracks the unbiased variance; Batch Renorm the standard deviation sigma_B
        self.register_buffer("running_std" if renorm else "running_var",
                             torch.ones(num_features))

    def set_bounds(self, r_max: float, d_max: float) -> None:
        """Batch Renorm's clipping bounds for the next training steps."""
        self.r_max, self.d_max = float(r_max), float(d_max)

    def _spread(self) -> torch.Tensor:
        return self.running_std if self.renorm else self.running_var

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        N, C = x.shape[:2]
        affine = (1, C) + (1,) * (x.dim() - 2)
        if not self.training:
            if self.renorm:
                y = batch_renorm(x, self.running_mean, self.running_std, eps=self.eps)
            else:
                y = TF.batch_norm(x, self.running_mean, self.running_var, eps=self.eps)
            return y * self.weight.view(affine) + self.bias.view(affine)
        if N != self.group * self.devices:
            raise ValueError(f"GhostBatchNorm1d: built for batches of {self.group * self.devices}"
                             f" ({self.devices} ghost batches of {self.group}), got {N}")
        P, rest = self.devices, x.shape[2:]
        if P == 1:                                  # one ghost batch: BatchNorm, its buffers
            v, mean, spread = x, self.running_mean, self._spread()
        else:
            # (P * group, C, *) -> (group, P * C, *): each (ghost batch, channel) is a channel
            v = x.reshape(P, self.group, C, *rest).transpose(0, 1).reshape(self.group, P * C,
                                                                            *rest)
            mean, spread = self.running_mean.repeat(P), self._spread().repeat(P)  # per ghost
        if self.renorm:
            y = batch_renorm(v, mean, spread, training=True, r_max=self.r_max,
                             d_max=self.d_max, momentum=self.momentum, eps=self.eps)
        else:      # torch.nn.functional.batch_norm's op, without its checks of the arguments
            y = torch.batch_norm(v, None, None, mean, spread, True, self.momentum, self.eps,
                                 False)
        if P > 1:
            with torch.no_grad():                   # the shared buffers: the ghosts' mean
                torch.mean(mean.view(P, C), 0, out=self.running_mean)
                torch.mean(spread.view(P, C), 0, out=self._spread())
            y = y.reshape(self.group, P, C, *rest).transpose(0, 1).reshape(x.shape)
        return y * self.weight.view(affine) + self.bias.view(affine)


def _norm(kind: str, C: int, group: int, batch: int) -> torch.nn.Module:
    if kind in ("bn", "brn"):
        return GhostBatchNorm1d(C, group, batch, renorm=kind == "brn")
    G = {"ln": 1, "in": C, "gn": GN_GROUPS, "ws+gn": GN_GROUPS}[kind]
    return ncnn.GroupNorm(G, C)


def cnn(norm: str, net: str = "strided", group: int = 32, batch: int = 32,
        width: int = 32) -> torch.nn.Sequential:
    """Four ``conv1d - norm - ReLU`` blocks (strides from ``NETS[net]``), global average
    pooling and a linear classifier of ten classes."""
    if norm not in NORMS:
        raise ValueError(f"cnn: unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
    if net not in NETS:
        raise ValueError(f"cnn: unknown net {net!r}; choose one of {', '.join(NETS)}")
    if width % GN_GROUPS:
        raise ValueError(f"cnn: width must be a multiple of {GN_GROUPS} (GN's groups), "
                         f"got {width}")
    nn = torch.nn
    conv = ncnn.WSConv1d if norm == "ws+gn" else nn.Conv1d
    layers: list[torch.nn.Module] = []
    for i, stride in enumerate(NETS[net]):
        k = 5 if i == 0 else 3
        layers += [conv(1 if i == 0 else width, width, k, stride=stride, padding=k // 2,
                        bias=False),
                   _norm(norm, width, group, batch), nn.ReLU()]
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(width, 10)]
    return nn.Sequential(*layers)


def batches(y: torch.Tensor, batch: int, sampling: str, gen: torch.Generator,
            classes: int = 2) -> Iterator[torch.Tensor]:
    """Endless batches of indices into ``y``: ``"iid"`` walks through a fresh permutation
    each epoch; ``"sorted"`` draws ``classes`` distinct labels for each batch and
    ``batch / classes`` samples of each (without replacement within the batch)."""
    if sampling == "iid":
        while True:
            order = torch.randperm(len(y), generator=gen)
            for i in range(0, len(y) - batch + 1, batch):
                yield order[i:i + batch]
    elif sampling == "sorted":
        labels = int(y.max()) + 1
        if batch % classes or not 1 <= classes <= labels:
            raise ValueError(f"batches: a sorted batch of {batch} holds `classes` labels in "
                             f"equal shares; classes must divide {batch} and lie in "
                             f"1..{labels}, got {classes}")
        members = [torch.nonzero(y == c).flatten() for c in range(labels)]
        per = batch // classes
        while True:
            chosen = torch.randperm(labels, generator=gen)[:classes]
            yield torch.cat([members[c][torch.randperm(len(members[c]), generator=gen)[:per]]
                             for c in chosen.tolist()])
    else:
        raise ValueError(f"batches: sampling must be 'iid' or 'sorted', got {sampling!r}")


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _batch_norms(model: torch.nn.Module) -> list[GhostBatchNorm1d]:
    return [m for m in model if isinstance(m, GhostBatchNorm1d)]


def _set_population_statistics(model: torch.nn.Sequential, x: torch.Tensor) -> None:
    """Replace each BN layer's buffers by the mean and variance of its input over ``x``, the
    layers before it in eval mode with their new buffers (one pass, layer by layer)."""
    h = x
    with torch.no_grad():
        for m in model:
            if isinstance(m, GhostBatchNorm1d):
                dims = axes.reduce_dims("batch", h.shape)       # every sample and position
                var, mean = torch.var_mean(h, dim=dims, correction=0)
                m.running_mean.copy_(mean)
                if m.renorm:
                    m.running_std.copy_(torch.sqrt(var + m.eps))
                else:
                    m.running_var.copy_(var)
            h = m(h)


def grouped(idx: torch.Tensor, y: torch.Tensor, grouping: str) -> torch.Tensor:
    """The batch ``idx`` in the order BN splits it into ghost batches: as drawn
    (``"random"``), or sorted by label (``"sorted"``), so that each ghost batch holds as few
    classes as the batch allows."""
    if grouping == "random":
        return idx
    if grouping == "sorted":
        return idx[torch.argsort(y[idx], stable=True)]
    raise ValueError(f"grouped: grouping must be 'random' or 'sorted', got {grouping!r}")


def _noise(z: torch.Tensor, ghosts: torch.Tensor) -> float:
    """RMS of (z - mu_B) / sigma_B - (z - mu) / sigma over the ghost batches ``ghosts``
    (rows of sample indices into ``z``), with mu, sigma^2 those of all of ``z`` (per
    channel, biased)."""
    dims = axes.reduce_dims("batch", z.shape)       # every sample and position
    var, mean = torch.var_mean(z, dim=dims, correction=0, keepdim=True)
    pop = (z - mean) / torch.sqrt(var + EPS)
    zb = z[ghosts]                                  # (ghosts, group, C, L)
    per_ghost = tuple(d + 1 for d in axes.reduce_dims("batch", zb.shape[1:]))
    vb, mb = torch.var_mean(zb, dim=per_ghost, correction=0, keepdim=True)
    return float(((zb - mb) / torch.sqrt(vb + EPS) - pop[ghosts]).pow(2).mean().sqrt())


def trained(seed: int, norm: str, group: int = 32, grouping: str = "random",
            sampling: str = "iid", net: str = "strided", steps: int = 600, batch: int = 32,
            classes: int = 2, lr: float = 3e-3, width: int = 32) -> dict[str, float]:
    """Train :func:`cnn` with Adam for ``steps`` batches of ``batch`` signals drawn by
    ``sampling``, BN's statistics over ghost batches of ``group`` formed by ``grouping``;
    the metrics above."""
    if norm not in ("bn", "brn") and (group != batch or grouping != "random"):
        raise ValueError(f"trained: only BN and Batch Renorm split their batch; run {norm!r} "
                         f"with group = batch = {batch} and grouping 'random' (got "
                         f"group={group}, grouping={grouping!r})")
    data = datasets.mnist1d()
    torch.manual_seed(seed)                    # the initial weights: the same for every config
    model = cnn(norm, net, group, batch, width)
    # foreach: one call per step for all the tensors, the same numbers as the loop over them
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    draw = batches(data.y, batch, sampling, torch.Generator().manual_seed(1000 + seed), classes)
    bns = _batch_norms(model)
    for t in range(steps):
        for m in bns:
            m.set_bounds(*schedule(t, steps))          # used by Batch Renorm only
        idx = grouped(next(draw), data.y, grouping)
        loss = TF.cross_entropy(model(data.x[idx]), data.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    out = {"test_accuracy": _accuracy(model, data.x_test, data.y_test)}
    out["test_error"] = 1.0 - out["test_accuracy"]
    if not bns:
        return out
    # test batches made as the training batches were, from a generator of their own
    test_draw = batches(data.y_test, batch, sampling, torch.Generator().manual_seed(2000 + seed),
                        classes)
    order = [grouped(next(test_draw), data.y_test, grouping)
             for _ in range(len(data.y_test) // batch)]
    inputs: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda m, args, y: inputs.append(args[0].detach()))
             for m in bns]
    _accuracy(model, data.x_test, data.y_test)
    for h in hooks:
        h.remove()
    ghosts = torch.cat([ix.view(-1, group) for ix in order])    # BN's sets, as in training
    for i, z in enumerate(inputs, start=1):
        out[f"noise@{i}"] = _noise(z, ghosts)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()                                        # the statistics it trained with
    with torch.no_grad():
        correct = sum(int((model(data.x_test[ix]).argmax(1) == data.y_test[ix]).sum())
                      for ix in order)
    out["batch_accuracy"] = correct / (len(order) * batch)
    model.load_state_dict(state)
    model.eval()
    _set_population_statistics(model, data.x)
    out["population_accuracy"] = _accuracy(model, data.x_test, data.y_test)
    return out


#: The chapter's runs: configs ``{"norm", "group", "sampling"}`` (and ``net``, ``steps``).
TRAIN = Experiment("minibatch.cnn", trained,
                   held_equal="600 Adam steps of 32 signals and the same initial weights per "
                              "seed; the same batches for every config of one sampling")
