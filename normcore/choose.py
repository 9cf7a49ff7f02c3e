r"""Choosing a normalization: the book's layers side by side, as data, with the experiments
that check every entry (the chapter "Choosing a normalization").

The rows
--------
:data:`ROWS` has one :class:`Row` per layer: BatchNorm, LayerNorm, RMSNorm, InstanceNorm,
GroupNorm, Weight Standardization (WS) and Dynamic Tanh (DyT, Zhu et al. 2025,
:math:`y = \gamma \tanh(\alpha_{\mathrm{DyT}} x) + \beta`, no statistics at all).  What
:mod:`normcore.axes` knows is read from there and never restated: the set :math:`S_i` (the
roles it spans), whether the mean is subtracted, where :math:`\gamma, \beta` live.  From the
set follow the claims the table makes about each layer at PyTorch's defaults:

* **batch dependence**: in training, a sample's output depends on the other samples exactly
  when :math:`S_i` spans the batch (role ``N``);
* **train/eval difference** and **running buffers**: a statistic over the batch has to be
  replaced at inference by an estimate of the population's, which BatchNorm keeps in three
  buffers; every other layer computes the same function in both modes;
* **invariances**: a transformation of the input is removed exactly when it is the same on
  every element of each set and the layer removes its kind (a shift: it subtracts a mean; a
  scale: it divides by a spread), :func:`normcore.invariance.predicted_invariant`;
* **communication** in data-parallel training: only a set that spans the batch needs other
  devices' values (SyncBatchNorm exchanges :math:`2C + 1` numbers per layer in the forward
  pass and :math:`2C` in the backward pass, :mod:`normcore.sync`); the parameters' gradients
  are all-reduced like every parameter's, whatever the layer.

WS standardizes the *weight*: its set is LayerNorm's on the weight
:math:`(C_\text{out}, C_\text{in}, k_h, k_w)`, one filter's :math:`F` weights.  Seen from the
activations it convolves, a filter covers every input channel and position of its receptive
field in one sample, so it removes a shift that is the same over all of them (each standardized
filter sums to zero; without zero padding) and no scale (it divides by a spread of the
weight, not of the input).

The experiments
---------------
:func:`measure` runs, on one module, every experiment the table rests on, and
:func:`mismatches` compares what it found with a row's claims: the support of the Jacobian
:math:`\partial y_i / \partial x_k` (which elements share statistics, against the labels of
:mod:`normcore.axes`), a change of the other samples, train against eval mode, the buffers and
parameters, two shards against the whole batch (outputs and summed parameter gradients), and
the invariance table of :mod:`normcore.invariance`.  :func:`sync_exchange` counts the numbers
SyncBatchNorm's collectives carry.

The cost comes from the benchmark: ``benchmarks/speed.py --json normcore/cost.json`` measures
each layer at one size, with the command, the machine and the date (:func:`load_cost`).
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from unittest import mock

import torch
from torch import Tensor

from . import axes, invariance
from . import functional as F

__all__ = ["Row", "ROWS", "KEYS", "Measured", "make", "sets_by_jacobian", "expected_sets",
           "measure", "mismatches", "sync_exchange", "load_cost", "COST_FILE", "cost_ratio",
           "set_words", "CELL_CHARS", "table_cells", "table_markdown"]

#: Where the measured cost lives (written by ``benchmarks/speed.py --json``).
COST_FILE = "cost.json"


@dataclass(frozen=True)
class Row:
    """One layer of the table.  ``sets``: the :data:`normcore.axes.TABLE` key whose set the
    layer normalizes over (``None``: no set, DyT); ``on``: ``"activations"`` or ``"weight"``.
    ``parameters`` and ``buffers`` are the module's names at PyTorch's defaults; ``used`` is
    where it is used, in a few words (the chapter's section "Where each is used" cites the
    papers); ``notes`` qualify an invariance."""

    key: str
    title: str
    short: str
    sets: str | None
    on: str
    parameters: tuple[str, ...]
    buffers: tuple[str, ...] = ()
    used: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles its set spans, *as seen from its input* (WS: a filter's receptive field,
        LayerNorm's roles; DyT: none)."""
        return () if self.sets is None else axes.TABLE[self.sets].roles

    @property
    def centers(self) -> bool:
        """Whether it removes a shift of its input: a mean subtracted (WS: the filter's)."""
        return self.sets is not None and axes.TABLE[self.sets].centered

    @property
    def scales(self) -> bool:
        """Whether it divides by a spread of its input (not WS: that spread is the weight's)."""
        return self.sets is not None and self.on == "activations"

    @property
    def batch_dependent(self) -> bool:
        """In training, a sample's output depends on its batch-mates: the set spans ``N``."""
        return self.on == "activations" and "N" in self.roles

    @property
    def train_eval_differ(self) -> bool:
        """A batch statistic is replaced by a running estimate in eval mode."""
        return self.batch_dependent

    def invariant(self, transform: str, group_size: int | None = None) -> bool:
        """The table's claim for one of :data:`normcore.invariance.INPUT_TRANSFORMS`
        (GroupNorm: with ``group_size`` :math:`C/G` channels per group, more than one if
        not given)."""
        return invariance.predicted_invariant(self.roles, transform, centers=self.centers,
                                              scales=self.scales, group_size=group_size)


_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")

#: The seven layers, in the order of the table.
ROWS: dict[str, Row] = {r.key: r for r in (
    Row("batch", "BatchNorm", "BN", "batch", "activations", ("weight", "bias"), _BN_BUFFERS,
        used="CNNs, large batches"),
    Row("layer", "LayerNorm", "LN", "layer", "activations", ("weight", "bias"),
        used="transformers"),
    Row("rms", "RMSNorm", "RMSNorm", "rms", "activations", ("weight",), used="LLMs (LLaMA)"),
    Row("instance", "InstanceNorm", "IN", "instance", "activations", (),
        used="style transfer"),
    Row("group", "GroupNorm", "GN", "group", "activations", ("weight", "bias"),
        used="detection"),
    Row("ws", "Weight Standardization", "WS", "layer", "weight", ("weight", "bias"),
        used="with GN; NF-Nets", notes={"shift per sample": "without zero padding"}),
    Row("dyt", "Dynamic Tanh", "DyT", None, "activations", ("alpha", "weight", "bias"),
        used="in place of LN"),
)}
KEYS = tuple(ROWS)


# ---------------------------------------------------------------------------------------
# the modules, at PyTorch's defaults, with seeded parameters
# ---------------------------------------------------------------------------------------
def make(key: str, shape: Sequence[int], num_groups: int, dyt: Callable | None = None,
         dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.nn.Module:
    r"""The module of row ``key`` for inputs ``(N, C, H, W)`` of ``shape``, at the defaults of
    ``torch.nn`` (InstanceNorm without affine parameters, WS as a 3x3 convolution from ``C``
    to ``C`` channels without padding), in training mode, with parameters drawn from ``seed``
    so that no :math:`\gamma = 1, \beta = 0` hides anything.  DyT is
    :class:`normcore.nn.DyT` with :math:`\gamma, \beta` per channel (``channels_last=False``,
    the paper's layout for ``(N, C, H, W)``); ``dyt(C)``, if given, builds another module in
    its place (an experiment on a layer the table does not have)."""
    from . import nn as ncnn
    if key not in ROWS:
        raise ValueError(f"unknown row {key!r}; expected one of {', '.join(map(repr, KEYS))}")
    shape = tuple(shape)
    if len(shape) != 4:
        raise ValueError(f"an input of shape (N, C, H, W) is needed, got {shape}")
    C = shape[1]
    kw = dict(dtype=dtype)
    if key == "dyt" and dyt is not None:
        module = dyt(C).to(dtype)
    else:
        module = {
            "batch": lambda: ncnn.BatchNorm2d(C, **kw),
            "layer": lambda: ncnn.LayerNorm(shape[1:], **kw),
            "rms": lambda: ncnn.RMSNorm(shape[1:], **kw),
            "instance": lambda: ncnn.InstanceNorm2d(C, **kw),
            "group": lambda: ncnn.GroupNorm(num_groups, C, **kw),
            "ws": lambda: ncnn.WSConv2d(C, C, 3, **kw),
            "dyt": lambda: ncnn.DyT(C, channels_last=False, **kw),
        }[key]()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name == "bias":
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
            elif name == "weight" and key != "ws":
                p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=p.dtype))
    return module.train()


# ---------------------------------------------------------------------------------------
# the experiments
# ---------------------------------------------------------------------------------------
def sets_by_jacobian(fn: Callable[[Tensor], Tensor], x: Tensor, tol: float = 1e-12) -> Tensor:
    """``same[i, k]``: whether output ``i`` of ``fn`` depends on input ``k`` (the Jacobian
    entry is nonzero): for a normalization, whether ``k`` is in :math:`S_i`."""
    jac = torch.autograd.functional.jacobian(fn, x)
    return jac.reshape(x.numel(), x.numel()).abs() > tol


def expected_sets(row: Row, shape: Sequence[int], num_groups: int) -> Tensor:
    """What :mod:`normcore.axes` says :func:`sets_by_jacobian` finds: ``same[i, k]`` when
    ``i`` and ``k`` share a set (DyT: only ``k = i``)."""
    numel = math.prod(shape)
    if row.sets is None:
        return torch.eye(numel, dtype=torch.bool)
    G = num_groups if row.sets == "group" else None
    labels = axes.stat_groups(row.sets, tuple(shape), G).flatten()
    return labels[:, None] == labels[None, :]


def _change(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max())


@dataclass
class Measured:
    """What the experiments found for one module (the largest changes are floats)."""

    sets_match: bool               # the Jacobian's support is the set of axes
    set_sizes: tuple[int, ...]     # how many inputs each output depends on (distinct counts)
    batch_change: float            # sample 0's output, other batch-mates
    train_eval_change: float       # train mode against eval mode
    buffers: tuple[str, ...]
    parameters: dict[str, tuple[int, ...]]
    shard_change: float            # two shards against the whole batch: outputs
    shard_grad_change: float       # ... the summed gradients of the parameters
    invariances: invariance.InvarianceTable


def _other_mates(x: Tensor, gen: torch.Generator) -> Tensor:
    out = x.clone()
    out[1:] = 1.0 + 3.0 * torch.randn(out[1:].shape, generator=gen, dtype=x.dtype)
    return out


def _param_grads(module: torch.nn.Module, x: Tensor, dy: Tensor) -> dict[str, Tensor]:
    if not any(True for _ in module.parameters()):
        return {}
    module.zero_grad()
    (module(x) * dy).sum().backward()
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def measure(row: Row, x: Tensor, num_groups: int, dyt: Callable | None = None,
            small: tuple[int, ...] = (3, 4, 2, 2), seed: int = 1) -> Measured:
    """Every experiment of the table on the module of ``row`` (:func:`make`) for inputs like
    ``x``.  ``small`` is the shape of the input (WS: of the weight) whose Jacobian gives the
    sets; ``dyt`` as in :func:`make`."""
    gen = torch.Generator().manual_seed(seed)
    module = make(row.key, x.shape, num_groups, dyt, x.dtype)
    # S_i: which inputs each output depends on, on a small input (WS: on a small weight)
    small_x = torch.randn(small, generator=gen, dtype=x.dtype)
    fn = F.weight_standardize if row.key == "ws" else make(row.key, small, num_groups, dyt,
                                                           x.dtype)
    support = sets_by_jacobian(fn, small_x)
    sets_match = torch.equal(support, expected_sets(row, small, num_groups))
    set_sizes = tuple(sorted(set(support.sum(1).tolist())))
    with torch.no_grad():
        batch_change = _change(module(x)[0], module(_other_mates(x, gen))[0])
        for _ in range(3):                                   # move any running estimates
            module(2.0 + 3.0 * torch.randn(x.shape, generator=gen, dtype=x.dtype))
        y_train = module.train()(x)
        y_eval = module.eval()(x)
        module.train()
        train_eval_change = _change(y_train, y_eval)
        half = x.shape[0] // 2
        whole = module(x)
        shards = torch.cat([module(x[:half]), module(x[half:])])
        shard_change = _change(whole, shards)
    # data parallel: what an all-reduce of the shards' parameter gradients gives
    dy = torch.randn(whole.shape, generator=gen, dtype=x.dtype)
    g_whole = _param_grads(module, x, dy)
    g_parts = [_param_grads(module, x[s], dy[s]) for s in (slice(None, half), slice(half, None))]
    shard_grad_change = max((_change(g_whole[n], g_parts[0][n] + g_parts[1][n])
                             for n in g_whole), default=0.0)
    module.zero_grad()
    with torch.no_grad():
        table = invariance.invariance_table(
            {row.key: module}, invariance.input_transforms(x.shape, gen, x.dtype), x)
    return Measured(sets_match, set_sizes, batch_change, train_eval_change,
                    tuple(n for n, _ in module.named_buffers()),
                    {n: tuple(p.shape) for n, p in module.named_parameters()},
                    shard_change, shard_grad_change, table)


#: Below this a change is "none" (float64 rounding), above ``CHANGED`` a real one.
SAME, CHANGED = 1e-9, 1e-3


def _verdict(change: float, what: str) -> bool:
    """True if ``change`` is a real change, False if none; ValueError in between."""
    if change < SAME:
        return False
    if change > CHANGED:
        return True
    raise ValueError(f"{what}: a change of {change:.3g} is neither none (< {SAME:g}) nor "
                     f"clearly one (> {CHANGED:g})")


def mismatches(row: Row, found: Measured, shape: Sequence[int], num_groups: int) -> list[str]:
    """Every claim of ``row`` that the experiments contradict, in words (empty: all hold)."""
    bad = []
    if not found.sets_match:
        bad.append("the Jacobian's support is not the set of normcore.axes")
    for what, change, claim in (
            ("batch dependence", found.batch_change, row.batch_dependent),
            ("train/eval difference", found.train_eval_change, row.train_eval_differ),
            ("shards differ from the whole batch", found.shard_change, row.batch_dependent),
            ("summed shard gradients differ", found.shard_grad_change, row.batch_dependent)):
        if _verdict(change, f"{row.title}, {what}") != claim:
            bad.append(f"{what}: claimed {claim}, measured a change of {change:.3g}")
    if found.buffers != row.buffers:
        bad.append(f"buffers: claimed {row.buffers}, found {found.buffers}")
    if tuple(found.parameters) != row.parameters:
        bad.append(f"parameters: claimed {row.parameters}, found {tuple(found.parameters)}")
    elif row.sets is not None and row.on == "activations" and row.parameters:
        affine = axes.layout(row.sets, tuple(shape), num_groups if row.sets == "group" else None)
        for name in ("weight", "bias"):
            if name in found.parameters and found.parameters[name] != affine.affine_shape:
                bad.append(f"{name} has shape {found.parameters[name]}, axes says "
                           f"{affine.affine_shape} (one per {axes.AFFINE[row.sets]})")
    for t in invariance.INPUT_TRANSFORMS:
        if found.invariances.invariant(row.key, t) != row.invariant(t):
            bad.append(f"invariance to {t!r}: claimed {row.invariant(t)}")
    return bad


def sync_exchange(shape: Sequence[int] = (4, 6, 4, 4)) -> tuple[int, int]:
    """The numbers SyncBatchNorm's collectives carry for one layer and one step, counted on
    :func:`normcore.sync.sync_batch_norm` in a world of one process: ``(forward, backward)``,
    the ``all_gather`` of each rank's moments and the ``all_reduce`` of two sums."""
    import torch.distributed as dist

    from . import sync
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with mock.patch.object(dist, "all_gather", wraps=dist.all_gather) as gather, \
                mock.patch.object(dist, "all_reduce", wraps=dist.all_reduce) as reduce:
            x = torch.randn(tuple(shape), dtype=torch.float64, requires_grad=True)
            y = sync.sync_batch_norm(x)
            forward = sum(call.args[1].numel() for call in gather.call_args_list)
            y.sum().backward()
            backward = sum(call.args[0].numel() for call in reduce.call_args_list)
    finally:
        if created:
            dist.destroy_process_group()
    return forward, backward


# ---------------------------------------------------------------------------------------
# the cost, from the benchmark
# ---------------------------------------------------------------------------------------
def load_cost(path=None) -> dict:
    """The benchmark's measurements (``benchmarks/speed.py --json``): the command, machine,
    date, the input's shape and, per row and reference, torch's and normcore's times."""
    if path is None:
        text = resources.files("normcore").joinpath(COST_FILE).read_text(encoding="utf-8")
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    data = json.loads(text)
    missing = {"command", "machine", "date", "shape", "times"} - set(data)
    if missing:
        raise ValueError(f"{path or COST_FILE}: no {sorted(missing)}; write it with "
                         f"python benchmarks/speed.py --json")
    return data


# ---------------------------------------------------------------------------------------
# the table, in MyST markdown
# ---------------------------------------------------------------------------------------
def set_words(row: Row, tex: bool = True) -> str:
    """The set :math:`S_i` in words, from :mod:`normcore.axes` (WS: read on the weight);
    ``tex=False``: without math markup, for printing."""
    if row.sets is None:
        return "$x_i$ alone: no statistics" if tex else "x_i alone: no statistics"
    if row.on == "weight":
        fan_in = "$F = C_\\text{in} k_h k_w$" if tex else "F = C_in k_h k_w"
        return f"one filter's {fan_in} weights: {ROWS[row.sets].short}'s set, on the weight"
    words = axes.roles_words(row.roles)
    return words + ("" if row.centers else " (no mean subtracted)")


def cost_ratio(cost: dict, key: str, who: str = "torch", kind: str = "fwd+bwd",
               reference: str = "conv3x3") -> float:
    """``key``'s time over the reference's (torch's), on the least disturbed runs (min)."""
    mine = cost["times"][key][who]
    if mine is None:
        raise ValueError(f"the benchmark has no {who} time for {key!r}")
    return mine[kind]["min"] / cost["times"][reference]["torch"][kind]["min"]


#: The longest entry of the table, markup aside: a word, a symbol, a number, a short phrase;
#: whatever needs a sentence is a numbered note under the table.
CELL_CHARS = 20
# (one formula per symbol: a narrow column may break the line between them)
_ROLE_SYMBOLS = {"N": "$N$", "C": "$C$", "G": "$C/G$", "S": "$H$, $W$"}
_AFFINE_WORDS = {"channel": "channel", "normalized_shape": "element"}
_PARAM_SYMBOLS = {"alpha": "$\\alpha_{\\mathrm{DyT}}$", "weight": "$\\gamma$", "bias": "$\\beta$"}
_SUP = "<sup>{}</sup>"
_SOFT_HYPHENS = {"RMSNorm": "RMS&shy;Norm", "transformers": "trans&shy;formers"}


class _Notes:
    """The notes under the table: a mark per distinct text, numbered by :func:`table_cells`
    in reading order (line by line)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, cell: str, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"{cell}\0{self.texts.index(text)}\0"


def _cells(row: Row, note: _Notes, cost: dict | None) -> dict[str, str]:
    """Row ``row``'s column of the table: short entries, the rest in ``note``s."""
    yes = {True: "yes", False: "no"}
    ws, dyt = row.on == "weight", row.sets is None
    if dyt:
        sets = "$x_i$ alone"
    elif ws:
        sets = note("a filter", "WS: one filter of the weight $(C_\\text{out}, C_\\text{in}, "
                    "k_h, k_w)$, its $C_\\text{in} k_h k_w$ weights, LN's set on the weight; it "
                    "subtracts the filter's mean and divides by the filter's spread, not by a "
                    "spread of its input")
    else:
        sets = ", ".join(_ROLE_SYMBOLS[r] for r in ("N", "C", "G", "S") if r in row.roles)
    if ws:
        affine = grads = note("the conv's", "WS has no $\\gamma, \\beta$ of its own: the "
                              "convolution's weight and bias are its parameters")
    elif not row.parameters:
        affine = grads = note("none", "`affine=False`, PyTorch's default for IN; with "
                              "`affine=True`, one $\\gamma$ and one $\\beta$ per channel")
    else:
        affine = ("channel, and $\\alpha_{\\mathrm{DyT}}$" if dyt else
                  _AFFINE_WORDS[axes.AFFINE[row.sets]]
                  + ("" if "bias" in row.parameters else " ($\\gamma$ only)"))
        grads = ", ".join(_PARAM_SYMBOLS[p] for p in row.parameters)
    cells = {
        "$S_i$ spans": sets,
        "subtracts a mean": yes[row.centers],
        "divides by a spread": yes[row.scales],
        "$\\gamma, \\beta$: one per": affine,
        "depends on the batch (training)": yes[row.batch_dependent],
        "train ≠ eval mode": yes[row.train_eval_differ],
        "running buffers": (note(str(len(row.buffers)), ", ".join(f"`{b}`" for b in row.buffers))
                            if row.buffers else "none"),
        "**does not see its input's**": ""}
    for t in invariance.INPUT_TRANSFORMS:
        cells[t] = note(yes[row.invariant(t)], f"{row.short}: {row.notes[t]}") \
            if t in row.notes else yes[row.invariant(t)]
    cells["**data-parallel training**"] = ""
    cells["sent for $S_i$"] = note("$2C+1$ / $2C$", (
        "SyncBN's exchange per layer and step, forward / backward; without SyncBN, nothing: "
        "each device normalizes its own share of the batch")) if row.batch_dependent else "none"
    cells["gradients all-reduced"] = grads
    if cost is not None:
        cells["**time, % of a 3×3 conv**"] = ""
        for who in ("torch", "normcore"):
            cells[who] = (f"{100 * cost_ratio(cost, row.key, who):.0f}%"
                          if cost["times"][row.key][who] else "no op")
    cells["{ref}`used in <choose-used>`"] = row.used
    return cells


def table_cells(cost: dict | None = None, rows: Sequence[str] = KEYS
                ) -> tuple[dict[str, list[str]], list[str]]:
    """The table as data: for each line's title, its entries (one per row of ``rows``), and
    the notes their marks number from 1."""
    note = _Notes()
    columns = [_cells(ROWS[k], note, cost) for k in rows]
    order: list[int] = []                       # the notes in reading order

    def number(match: re.Match) -> str:
        if int(match[1]) not in order:
            order.append(int(match[1]))
        return _SUP.format(order.index(int(match[1])) + 1)

    lines = {title: [re.sub("\0(\\d+)\0", number, c[title]) for c in columns]
             for title in columns[0]}
    return lines, [note.texts[i] for i in order]


def table_markdown(cost: dict | None = None, rows: Sequence[str] = KEYS) -> str:
    """The chapter's table in MyST markdown: one column per layer, one line per property,
    and the numbered notes under it."""
    lines, notes = table_cells(cost, rows)

    def line(title: str, cells: Sequence[str]) -> str:
        text = "| " + " | ".join([title, *cells]) + " |"
        for word, where in _SOFT_HYPHENS.items():       # the narrowest column may break it
            text = text.replace(word, where)
        return text

    out = [line("", [ROWS[k].short for k in rows]), "|" + "---|" * (len(rows) + 1)]
    out += [line(title, cells) for title, cells in lines.items()]
    out += [""] + [f"{i}. {text}" for i, text in enumerate(notes, 1)]
    return "\n".join(out).rstrip()
