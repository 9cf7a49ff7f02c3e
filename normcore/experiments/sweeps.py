r"""Named sweeps: the full runs behind a chapter's figure, their committed results, and the
reduced runs a chapter executes to check the trend.

A chapter that trains must run in a minute on two cores; the claim it makes deserves more
seeds than that allows.  So each training experiment is registered here as a :class:`Sweep`
with two sizes:

* the **full** sweep (``configs`` x ``seeds``), run once from the command line,
  ``python -m normcore.experiments run NAME [--workers K]``, whose results are committed as
  data, ``normcore/experiments/results/NAME.json``, with the command, the seeds, the torch
  version, the CPU kernels, the machine and the source that made them.  The chapter plots
  those (:func:`load_results` gives back the same :class:`~.runner.Results`, so
  ``.interval()``, ``.difference()`` and ``.table()`` work on them);
* the **reduced** sweep (``reduced_configs`` x ``reduced_seeds``, a part of the full one),
  what the chapter re-runs through :func:`~.runner.run` to assert the trend on this machine.

Every run goes through :func:`~.runner.run`, so both sizes share its cache: a full sweep
started after a build of the book trains only the runs the chapter did not, and an
interrupted sweep resumes where it stopped.  The results live inside the package (they are
package data of the wheel, see ``pyproject.toml``), so a chapter downloaded with the wheel
finds them.

Registering a sweep imports nothing: its experiment is named ``"module:ATTRIBUTE"`` and
imported when the sweep runs or its results load.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .runner import Experiment, Results, _source_hash, grid, run, start

__all__ = ["Sweep", "register", "get", "names", "results_path", "write_results",
           "load_results", "read_provenance", "provenance", "RESULTS_DIR", "FORMAT"]

#: Where the committed results of the full sweeps live (package data of the wheel).
RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: The format of a results file; a loader refuses another.
FORMAT = "normcore-sweep-results/1"
COMMAND = "python -m normcore.experiments"

_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def _configs(where: str, configs: Iterable[Mapping[str, Any]]) -> tuple[dict, ...]:
    out = []
    for c in configs:
        if not isinstance(c, Mapping):
            raise TypeError(f"{where}: each config must be a dict, got {c!r}")
        try:
            out.append(json.loads(json.dumps(dict(c))))
        except TypeError as err:
            raise TypeError(f"{where}: config {c!r} must hold JSON values only: {err}") from None
    if not out:
        raise ValueError(f"{where}: no configs")
    return tuple(out)


def _seeds(where: str, seeds: Iterable[int]) -> tuple[int, ...]:
    seeds = tuple(int(s) for s in seeds)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"{where}: needs at least two distinct seeds (an interval), got {seeds}")
    return seeds


@dataclass(frozen=True)
class Sweep:
    """A named experiment with its full and its reduced set of configs and seeds.

    Args:
        name: short, lower case (``group``); the command line and the results file use it.
        experiment: the :class:`~.runner.Experiment`, or ``"module:ATTRIBUTE"`` naming it
            (imported when first needed).
        configs, seeds: the full sweep, whose results are committed.
        reduced_configs, reduced_seeds: what the chapter runs; each a part of the full set,
            so that the two share the cache.
        description: one line: what is trained and what is measured.
        figure: where the results are shown (``"chapter 6, the G sweep"``).
    """

    name: str
    experiment: Experiment | str
    configs: tuple[Mapping[str, Any], ...]
    seeds: tuple[int, ...]
    reduced_configs: tuple[Mapping[str, Any], ...]
    reduced_seeds: tuple[int, ...]
    description: str
    figure: str = ""

    def __post_init__(self) -> None:
        where = f"Sweep({self.name!r})"
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"Sweep: name must be lower case letters, digits, '-' or '_', "
                             f"starting with a letter, got {self.name!r}")
        if not isinstance(self.experiment, (Experiment, str)) or (
                isinstance(self.experiment, str) and ":" not in self.experiment):
            raise TypeError(f"{where}: experiment must be an Experiment or 'module:ATTRIBUTE', "
                            f"got {self.experiment!r}")
        full = _configs(where, self.configs)
        reduced = _configs(f"{where} reduced", self.reduced_configs)
        seeds = _seeds(where, self.seeds)
        reduced_seeds = _seeds(f"{where} reduced", self.reduced_seeds)
        extra = [c for c in reduced if c not in full]
        if extra or not set(reduced_seeds) <= set(seeds):
            raise ValueError(f"{where}: the reduced sweep must be a part of the full one (so "
                             f"that they share the cache); configs not in the full sweep: "
                             f"{extra}, seeds not in it: {sorted(set(reduced_seeds) - set(seeds))}")
        for field, value in (("configs", full), ("reduced_configs", reduced), ("seeds", seeds),
                             ("reduced_seeds", reduced_seeds)):
            object.__setattr__(self, field, value)

    def get_experiment(self) -> Experiment:
        """The experiment, imported if it was given by name."""
        if isinstance(self.experiment, Experiment):
            return self.experiment
        module, _, attr = self.experiment.partition(":")
        found = getattr(importlib.import_module(module), attr)
        if not isinstance(found, Experiment):
            raise TypeError(f"sweep {self.name!r}: {self.experiment} is a "
                            f"{type(found).__name__}, not an Experiment")
        return found

    def size(self, reduced: bool = False) -> tuple[int, int]:
        """``(configs, seeds)`` of the full or the reduced sweep."""
        if reduced:
            return len(self.reduced_configs), len(self.reduced_seeds)
        return len(self.configs), len(self.seeds)

    def run(self, *, reduced: bool = False, seeds: Iterable[int] | None = None,
            workers: int | None = None, progress: bool | None = None) -> Results:
        """Run the full sweep, or the reduced one, through :func:`~.runner.run` (its cache,
        its worker processes); ``seeds`` replaces the sweep's own."""
        configs = self.reduced_configs if reduced else self.configs
        if seeds is None:
            seeds = self.reduced_seeds if reduced else self.seeds
        return run(self.get_experiment(), configs, seeds, workers=workers, progress=progress)

    def start(self, *, reduced: bool = False, seeds: Iterable[int] | None = None,
              workers: int | None = None) -> int:
        """Hand the runs not in the cache to worker processes (:func:`~.runner.start`) and
        return: a later :meth:`run` with the same arguments collects them."""
        configs = self.reduced_configs if reduced else self.configs
        if seeds is None:
            seeds = self.reduced_seeds if reduced else self.seeds
        return start(self.get_experiment(), configs, seeds, workers=workers)

    @property
    def results_path(self) -> Path:
        return results_path(self.name)

    def command(self) -> str:
        """The command line that makes the committed results."""
        return f"{COMMAND} run {self.name}"


_REGISTRY: dict[str, Sweep] = {}


def register(sweep: Sweep, *, replace: bool = False) -> Sweep:
    """Add ``sweep`` to the registry (``replace=True`` to redefine a name)."""
    if not isinstance(sweep, Sweep):
        raise TypeError(f"register: expected a Sweep, got {type(sweep).__name__}")
    if sweep.name in _REGISTRY and not replace:
        raise ValueError(f"register: a sweep named {sweep.name!r} exists already; pick another "
                         "name or pass replace=True")
    _REGISTRY[sweep.name] = sweep
    return sweep


def names() -> list[str]:
    """The registered sweeps, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Sweep:
    """The sweep registered as ``name``; an error lists the names there are."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown sweep {name!r}; the registered sweeps are: "
                         + ", ".join(names())) from None


# --- committed results --------------------------------------------------------------------

def results_path(name: str) -> Path:
    """The committed results of sweep ``name``: ``normcore/experiments/results/<name>.json``."""
    return RESULTS_DIR / f"{name}.json"


def provenance(*, workers: int | None, wall_seconds: float, cached: int) -> dict[str, Any]:
    """What made a set of results: the software, the CPU kernels, the machine, the time."""
    import numpy

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_seconds": round(wall_seconds, 3), "cached_runs": cached,
            "workers": "auto" if workers is None else workers, "threads_per_run": 1,
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "numpy": numpy.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "normcore_source": _source_hash()}


def write_results(sweep: Sweep, results: Results, path: str | os.PathLike, *, command: str,
                  reduced: bool = False, workers: int | None = None) -> Path:
    """Write ``results`` of ``sweep`` as JSON at ``path``: the records and what made them."""
    exp = results.experiment
    doc = {"format": FORMAT, "sweep": sweep.name, "command": command, "reduced": reduced,
           "experiment": {"name": exp.name, "target": exp.target, "held_equal": exp.held_equal},
           "configs": list(results.configs), "seeds": list(results.seeds),
           "made": provenance(workers=workers, wall_seconds=results.seconds,
                              cached=results.cached),
           "records": [{"config": c, "seed": s, "metrics": m} for c, s, m in results.records]}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return path


def _read(name: str, path: str | os.PathLike | None) -> tuple[dict, Path]:
    where = Path(path) if path is not None else results_path(name)
    if not where.is_file():
        how = f"{COMMAND} run {name}" + (f" --out {where}" if path is not None else "")
        raise FileNotFoundError(f"no results of sweep {name!r} at {where}; make them with: {how}")
    doc = json.loads(where.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{where}: not a results file of format {FORMAT!r} "
                         f"(format {doc.get('format')!r})")
    return doc, where


def load_results(name: str, path: str | os.PathLike | None = None) -> Results:
    """The committed results of sweep ``name`` (or the file at ``path``) as
    :class:`~.runner.Results`: per-seed values, intervals and tables of the stored runs."""
    doc, _ = _read(name, path)
    info = doc["experiment"]
    module, _, qual = info["target"].partition(":")
    fn = importlib.import_module(module)
    for part in qual.split("."):
        fn = getattr(fn, part)
    experiment = Experiment(info["name"], fn, info.get("held_equal", ""))
    records = tuple((r["config"], int(r["seed"]), r["metrics"]) for r in doc["records"])
    return Results(experiment, tuple(doc["configs"]), tuple(doc["seeds"]), records,
                   cached=doc["made"].get("cached_runs", 0),
                   seconds=doc["made"].get("wall_seconds", 0.0))


def read_provenance(name: str, path: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The ``made`` block and the command of a results file, or ``None`` if there is none."""
    try:
        doc, where = _read(name, path)
    except FileNotFoundError:
        return None
    return {**doc["made"], "command": doc["command"], "path": str(where),
            "runs": len(doc["records"]), "reduced": doc.get("reduced", False)}


# --- the book's sweeps --------------------------------------------------------------------

register(Sweep(
    "toy", "normcore.experiments.toy:NOISY_MEAN",
    configs=grid(mu=(0.0, 0.5), n=(16,)), seeds=range(5),
    reduced_configs=grid(mu=(0.0, 0.5), n=(16,)), reduced_seeds=range(3),
    description="a toy for the tests: the mean of n normal draws (microseconds a run)"))

_DEEP = dict(alpha=(2 * 8) ** 0.25, beta=(8 * 8) ** -0.25)     # DeepNorm's for 8 layers
_PRENORM = [dict(mode=m, L=8, **kw) for m, kw in (
    ("Post-LN", {}), ("Pre-LN", {}), ("DeepNorm", _DEEP), ("DeepNorm (alpha on F)", _DEEP))]
register(Sweep(
    "prenorm", "normcore.experiments.prenorm:GRADS",
    configs=_PRENORM, seeds=range(32), reduced_configs=_PRENORM, reduced_seeds=range(8),
    description="Post-LN, Pre-LN and DeepNorm: each layer's gradient norm at initialization "
                "(float64, no training; milliseconds a run)",
    figure="chapter 4, the gradient norm of each layer (Xiong et al. 2020)"))

register(Sweep(
    "group", "normcore.experiments.group:SWEEP",
    configs=grid(G=(1, 2, 4, 8, 16), steps=[150], batch=[32]), seeds=range(32),
    reduced_configs=grid(G=(1, 2, 4, 8, 16), steps=[150], batch=[32]), reduced_seeds=range(8),
    description="GroupNorm at each number of groups G (16 channels): a small CNN, 150 Adam "
                "steps on stripe images; test accuracy and loss",
    figure="chapter 6, the G sweep (Wu & He 2018, Table 3)"))

_WS_CHAPTER = [dict(norm="ws+gn", batch_size=2, epochs=3), dict(norm="bn", batch_size=2, epochs=3),
               dict(norm="gn", batch_size=2, epochs=3), dict(norm="bn", batch_size=32, epochs=3),
               dict(norm="bn", batch_size=32, epochs=48)]
register(Sweep(
    "ws", "normcore.experiments.ws:TRAIN",
    configs=grid(norm=("bn", "gn", "ws+gn"), batch_size=(2, 4, 8, 16, 32), epochs=(3,))
    + grid(norm=("bn", "gn", "ws+gn"), batch_size=(32,), epochs=(48,)),   # 384 steps, as N = 2
    seeds=range(32), reduced_configs=_WS_CHAPTER, reduced_seeds=range(8),
    description="BN, GN and WS + GN at batch sizes 2 to 32 (3 epochs), and at 32 for 48 epochs "
                "(the steps of N = 2): a tiny CNN on stripe images; test accuracy",
    figure="chapter 7, WS + GN at a batch of 2 (Qiao et al. 2019)"))

register(Sweep(
    "speedup", "normcore.experiments.speedup:TRAIN",
    configs=grid(bn=(False, True), lr=(0.3, 1.0, 3.0, 10.0)), seeds=range(10),
    reduced_configs=grid(bn=(False, True), lr=(3.0,)), reduced_seeds=range(5),
    description="a sigmoid MLP (3 x 100) with and without BN on the digits, 1500 SGD steps of "
                "60 images: test accuracy every 10 steps, one unit's input percentiles",
    figure="chapter 8, BatchNorm speeds up training (Ioffe & Szegedy 2015, Fig. 1)"))

# the chapter's reduced sweeps share BN at N = 8 (random ghost batches) and GN: the noniid
# one trains only the two runs the smallbatch one lacks
_SMALL_REDUCED = [dict(norm="bn", group=2), dict(norm="bn", group=8), dict(norm="gn", group=32)]
register(Sweep(
    "smallbatch", "normcore.experiments.minibatch:TRAIN",
    configs=grid(norm=("bn",), group=(2, 4, 8, 16, 32))
    + grid(norm=("ln", "in", "gn", "ws+gn"), group=(32,))
    + grid(norm=("bn",), group=(2, 32), net=("flat",)) + [dict(norm="gn", group=32, net="flat")],
    seeds=range(10), reduced_configs=_SMALL_REDUCED, reduced_seeds=range(5),
    description="a 1-D CNN on MNIST-1D, 600 Adam steps of 32: BN over ghost batches of 2 to 32 "
                "signals, LN, IN, GN, WS + GN; strided and flat nets; test accuracy",
    figure="chapter 8, small batches (Wu & He 2018, Table 2)"))

_NONIID_REDUCED = [dict(norm="bn", group=8, grouping="sorted"),
                   dict(norm="brn", group=8, grouping="sorted")]
register(Sweep(
    "noniid", "normcore.experiments.minibatch:TRAIN",
    configs=[dict(norm="bn", group=8), dict(norm="brn", group=8)]      # grouping "random"
    + grid(norm=("bn", "brn"), group=(8,), grouping=("sorted",))
    + [dict(norm="bn", group=32), dict(norm="gn", group=32)]
    + grid(norm=("bn", "brn"), group=(32,), sampling=("sorted",))
    + [dict(norm="gn", group=32, sampling="sorted")],
    seeds=range(10),
    reduced_configs=_NONIID_REDUCED, reduced_seeds=range(5),
    description="the 1-D CNN on MNIST-1D: BN and Batch Renorm over ghost batches of 8 formed at "
                "random or sorted by class; class-sorted training batches for BN, Batch Renorm "
                "and GN; eval-mode, batch-mode and population-statistics accuracy",
    figure="chapter 8, non-i.i.d. batches (Ioffe 2017)"))

_T4000 = [dict(norm=n, n_train=4000) for n in ("layer", "rms", "none")] \
    + [dict(norm="dyt", alpha0=a, n_train=4000) for a in (0.5, 1.0, 2.0, 4.0)]
_TSIZES = [dict(norm="layer", n_train=n) for n in (250, 1000)] \
    + [dict(norm="dyt", alpha0=a, n_train=n) for n in (250, 1000) for a in (0.5, 4.0)]
register(Sweep(
    "transformer", "normcore.experiments.transformer:COMPARE",
    configs=_T4000 + _TSIZES, seeds=range(10),
    reduced_configs=[c for c in _T4000 if c["norm"] == "layer" or c.get("alpha0") in (0.5, 4.0)],
    reduced_seeds=range(5),
    description="a tiny transformer on MNIST-1D with LayerNorm, RMSNorm, DyT (initial alpha 0.5 "
                "to 4) or no norm, on 4,000 training signals, and LayerNorm against DyT on 250 "
                "and 1,000: 300 AdamW steps; test accuracy",
    figure="chapter 9, DyT against LayerNorm (Zhu et al. 2025) and the data regime"))

_NF = [dict(kind=k, steps=s, lr=lr) for k in ("bn", "nf") for s, lr in ((100, 0.05), (300, 0.05),
                                                                       (100, 0.2))]
register(Sweep(
    "nfnet", "normcore.experiments.nfnet:TRAIN",
    configs=_NF, seeds=range(10),
    reduced_configs=[dict(kind=k, steps=100, lr=0.05) for k in ("bn", "nf")],
    reduced_seeds=range(5),
    description="a small pre-activation ResNet on the 8 x 8 digits with BatchNorm or "
                "normalizer-free (Scaled WS, alpha and beta), 100 or 300 SGD steps at "
                "learning rate 0.05, and 100 at 0.2; test accuracy",
    figure="chapter 9, normalizer-free ResNets (Brock et al. 2021)"))

_PREPOST_HIGH = 0.01          # where Post-LN without warm-up fails and warm-up rescues it
register(Sweep(
    "prepost", "normcore.experiments.prepost:TRAIN",
    configs=grid(placement=("pre", "post"), warmup=(0, 20),
                 lr=(0.0025, 0.005, 0.01, 0.02, 0.04)),
    seeds=range(10),
    reduced_configs=[dict(placement="post", warmup=0, lr=_PREPOST_HIGH),
                     dict(placement="post", warmup=20, lr=_PREPOST_HIGH),
                     dict(placement="pre", warmup=0, lr=_PREPOST_HIGH)],
    reduced_seeds=range(5),
    description="a tiny transformer on MNIST-1D (12 layers, LayerNorm) with Pre-LN or "
                "Post-LN, learning rates 0.0025 to 0.04, with and without 20 steps of "
                "warm-up: 80 AdamW steps; final training loss and test accuracy",
    figure="chapter 8, Pre-LN against Post-LN, trained (Xiong et al. 2020)"))

# WS + GN at a real micro-batch: the optimizer's batch is 1 or 2 signals.  Equal steps (600,
# and 200 for the chapter's reduced sweep), and equal examples: WS + GN and GN for 3,200 steps
# of 2 (the 6,400 signals of 200 steps of 32), BN at 32 for 38 steps (1,216 signals, about the
# 1,200 of 600 steps of 2)
_WSM_REDUCED = [dict(norm="ws+gn", batch=2, steps=200), dict(norm="bn", batch=32, steps=200)]
register(Sweep(
    "wsmicro", "normcore.experiments.wsmicro:TRAIN",
    configs=_WSM_REDUCED
    + grid(norm=("ws+gn", "gn", "bn"), batch=(2,), steps=(600,))
    + [dict(norm="ws+gn", batch=2, steps=600, lr=7.5e-4), dict(norm="ws+gn", batch=1, steps=600)]
    + grid(norm=("bn", "ws+gn"), batch=(32,), steps=(600,)) + [dict(norm="bn", batch=64, steps=600)]
    + grid(norm=("ws+gn", "gn"), batch=(2,), steps=(3200,)) + [dict(norm="bn", batch=32, steps=38)],
    seeds=range(10), reduced_configs=_WSM_REDUCED, reduced_seeds=range(5),
    description="the 1-D CNN on MNIST-1D with WS + GN, GN or BN at a real micro-batch of 1 or 2 "
                "signals against BN (and WS + GN) at 32 and 64: equal Adam steps (200, 600), "
                "and equal examples (3,200 steps of 2, 38 of 32); test accuracy",
    figure="chapter 8, WS + GN at micro-batch (Qiao et al. 2019)"))
