r"""One way to run an experiment: configs and seeds in, results as data out, cached on disk.

Every training run behind a chapter's claim goes through :func:`run`:

* an :class:`Experiment` names a function ``fn(seed, **config) -> {metric: float}`` defined
  at the top level of a module (so that worker processes can import it);
* :func:`run` calls it for every config (a dict of JSON values) and every seed, each run on
  one thread with the caller's random state left untouched, so a run gives the same numbers
  in this process, in a worker process and on a second call;
* the results are cached on disk, one JSON file a run, keyed by the experiment, its
  config, the seed, the torch version, the CPU kernels torch dispatches to
  (``torch.backends.cpu.get_cpu_capability()``), which of normcore's implementations runs
  (:func:`normcore.dispatch.kernels_enabled`) and a hash of normcore's source: a rebuild
  retrains nothing, and a changed config or a changed line of the package retrains;
* runs not in the cache are spread over worker processes when the first one shows that the
  rest take long enough to pay for starting them; the processes are kept for the next call
  (:mod:`~normcore.experiments.workers`), and :func:`start` hands runs to them ahead of
  the :func:`run` that collects them, so that they train while the caller does other work;
* :class:`Results` gives per-seed values, the mean with a 95% Student-*t* interval
  (:func:`interval`), and the interval of a paired difference between two configs run on
  the same seeds, the statistic a comparative claim is asserted on.

The cache lives in ``$NORMCORE_CACHE`` (default ``~/.cache/normcore``, or under
``$XDG_CACHE_HOME``); ``NORMCORE_CACHE=off`` turns it off, and ``NORMCORE_REFRESH=1`` runs
everything again and overwrites what is stored.  Progress: a live line in a notebook, a
``tqdm`` bar on a terminal.  The line a notebook keeps is the same whether the runs were
trained or read from the cache, so the stored output does not depend on the cache.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import importlib
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import torch

from .. import dispatch
from . import workers as _workers

__all__ = ["Experiment", "Interval", "Results", "interval", "run", "start", "cache_dir",
           "grid"]

LEVEL = 0.95
#: Starting a worker process (Python, torch, normcore) costs about this many seconds.
WORKER_START_SECONDS = 3.0


@dataclass(frozen=True)
class Experiment:
    """A named function ``fn(seed, **config)`` that returns ``{metric: number}``.

    ``fn`` must be defined at the top level of an importable module; ``held_equal`` says in
    words what every config of the experiment shares (``"384 optimizer steps"``), and is
    printed with its tables.
    """

    name: str
    fn: Callable[..., Mapping[str, float]]
    held_equal: str = ""

    def __post_init__(self) -> None:
        qual = getattr(self.fn, "__qualname__", "")
        if getattr(self.fn, "__module__", "__main__") in ("__main__", None) or "<" in qual:
            raise ValueError(
                f"Experiment {self.name!r}: fn must be defined at the top level of a module "
                f"(worker processes import it by name), got {self.fn!r}; move it into a "
                "module such as normcore.experiments.<topic>")

    @property
    def target(self) -> str:
        return f"{self.fn.__module__}:{self.fn.__qualname__}"


# --- statistics ---------------------------------------------------------------------------

@cache
def _t_quantile(level: float, df: int) -> float:
    from scipy import stats  # Student t quantiles: scipy's are exact, ours would not be

    return float(stats.t.ppf(0.5 + level / 2, df))


@dataclass(frozen=True)
class Interval:
    """Per-seed values, their mean and its ``level`` confidence interval (Student *t*)."""

    values: tuple[float, ...]
    mean: float
    low: float
    high: float
    level: float = LEVEL

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def above(self, x: float) -> bool:
        """The whole interval lies above ``x`` (for a difference: "better", with x = 0)."""
        return self.low > x

    def below(self, x: float) -> bool:
        return self.high < x

    def within(self, delta: float) -> bool:
        """The whole interval lies inside ``[-delta, delta]`` ("matches within delta")."""
        return -delta <= self.low and self.high <= delta

    def format(self, digits: int = 3) -> str:
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def __str__(self) -> str:
        return self.format()


def interval(values: Iterable[float], level: float = LEVEL) -> Interval:
    """The mean of ``values`` with its ``level`` Student-*t* confidence interval.

    The interval is ``mean +- t_{(1+level)/2, n-1} s / sqrt(n)``, with ``s`` the sample
    standard deviation; it needs at least two values.
    """
    vals = tuple(float(v) for v in values)
    if len(vals) < 2:
        raise ValueError(f"interval: needs at least 2 values (seeds), got {len(vals)}; "
                         "run more seeds")
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"interval: values must be finite, got {vals}")
    if not 0 < level < 1:
        raise ValueError(f"interval: level must lie in (0, 1), got {level}")
    n = len(vals)
    mean = math.fsum(vals) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    h = _t_quantile(level, n - 1) * sd / math.sqrt(n)
    return Interval(vals, mean, mean - h, mean + h, level)


# --- results as data ----------------------------------------------------------------------

def _match(config: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    return all(k in config and config[k] == v for k, v in where.items())


@dataclass(frozen=True)
class Results:
    """The runs of one :func:`run` call: ``records`` is a list of ``(config, seed, metrics)``."""

    experiment: Experiment
    configs: tuple[Mapping[str, Any], ...]
    seeds: tuple[int, ...]
    records: tuple[tuple[Mapping[str, Any], int, Mapping[str, float]], ...] = field(repr=False)
    cached: int = 0           # runs read from the cache
    seconds: float = 0.0      # what the call took

    def config(self, **where: Any) -> Mapping[str, Any]:
        """The config equal to ``where``, or else the one config whose items include ``where``
        (an error if none or several): ``{"norm": "bn"}`` names ``{"norm": "bn"}`` even
        beside ``{"norm": "bn", "net": "flat"}``."""
        exact = [c for c in self.configs if dict(c) == where]
        found = exact or [c for c in self.configs if _match(c, where)]
        if len(found) != 1:
            raise KeyError(f"{self.experiment.name}: {len(found)} configs match {where}; "
                           f"the configs are {list(self.configs)}")
        return found[0]

    def values(self, metric: str, **where: Any) -> tuple[float, ...]:
        """``metric`` of the config matching ``where``, one value per seed, in seed order."""
        cfg = self.config(**where)
        by_seed = {s: m for c, s, m in self.records if c == cfg}
        if metric not in by_seed[self.seeds[0]]:
            raise KeyError(f"{self.experiment.name}: no metric {metric!r}; it returns "
                           f"{sorted(by_seed[self.seeds[0]])}")
        return tuple(by_seed[s][metric] for s in self.seeds)

    def interval(self, metric: str, **where: Any) -> Interval:
        """The mean of ``metric`` over the seeds, with its 95% interval."""
        return interval(self.values(metric, **where))

    def difference(self, metric: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> Interval:
        """The paired difference ``a - b`` seed by seed (same seeds, same data), with its
        95% interval: "a is better" is ``.above(0)``, "a matches b within d" ``.within(d)``."""
        va, vb = self.values(metric, **a), self.values(metric, **b)
        return interval(x - y for x, y in zip(va, vb))

    def table(self, metric: str, label: Callable[[Mapping[str, Any]], str] | None = None,
              digits: int = 3, seed_digits: int = 2) -> str:
        """One row per config: its label, the per-seed values (``seed_digits`` decimals, so
        that eight seeds fit a page's column), the mean and its 95% interval."""
        label = label or (lambda c: " ".join(f"{k}={v}" for k, v in c.items()))
        names = [label(c) for c in self.configs]
        width = max(len(n) for n in names + ["config"])
        w = seed_digits + 3
        seeds = " ".join(f"{'s' + str(s):>{w}}" for s in self.seeds)
        head = f"{'config':{width}} {seeds}   mean [{int(LEVEL * 100)}% int.]"
        rows = [head]
        for name, cfg in zip(names, self.configs):
            iv = self.interval(metric, **cfg)
            per_seed = " ".join(f"{v:{w}.{seed_digits}f}" for v in iv.values)
            rows.append(f"{name:{width}} {per_seed}   {iv.format(digits)}")
        return "\n".join(rows)

    def summary(self) -> str:
        """How many runs, how many of them read from the cache, and the seconds it took."""
        n = len(self.records)
        return (f"{n} runs ({len(self.configs)} configs x {len(self.seeds)} seeds), "
                f"{self.cached} read from the cache, in {self.seconds:.1f} s")


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the values of ``axes``, as configs: ``grid(G=(1, 2), lr=(0.1,))``."""
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


# --- the cache ----------------------------------------------------------------------------

def cache_dir() -> Path | None:
    """Where results are stored, or ``None`` when ``NORMCORE_CACHE=off``."""
    where = os.environ.get("NORMCORE_CACHE", "")
    if where.lower() in ("off", "0", "no", "false"):
        return None
    if where:
        return Path(where)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "normcore"


@lru_cache(maxsize=1)
def _source_hash() -> str:
    """A hash of every ``.py`` file of normcore: a changed line of the package retrains."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _key(experiment: Experiment, config: Mapping[str, Any], seed: int) -> tuple[str, dict]:
    ident = {"experiment": experiment.name, "fn": experiment.target, "config": config,
             "seed": seed, "torch": torch.__version__,
             "cpu": torch.backends.cpu.get_cpu_capability(), "normcore": _source_hash(),
             "path": "kernels" if dispatch.kernels_enabled() else "reference"}
    blob = json.dumps(ident, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24], ident


def _check_config(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise TypeError(f"run({name!r}): each config must be a dict, got {config!r}")
    try:
        return json.loads(json.dumps(dict(config)))
    except TypeError as err:
        raise TypeError(f"run({name!r}): config {config!r} must hold JSON values only "
                        f"(numbers, strings, bools, None, lists): {err}") from None


# --- running ------------------------------------------------------------------------------

@contextlib.contextmanager
def one_thread():
    """torch on one thread inside the block (as every run is), the thread count restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _call(target: str, config: Mapping[str, Any], seed: int,
          kernels: bool | None = None) -> dict[str, float]:
    """One run on one thread, the caller's random state restored afterwards, with the
    compiled kernels switched as in the caller (``kernels``; a worker process has its own
    switch)."""
    module, _, qual = target.partition(":")
    fn = importlib.import_module(module)
    for part in qual.split("."):
        fn = getattr(fn, part)
    if kernels is None:
        kernels = dispatch.kernels_enabled()
    with one_thread(), torch.random.fork_rng(devices=[]), dispatch.use_kernels(kernels):
        out = fn(seed=seed, **config)
    metrics = {}
    for k, v in dict(out).items():
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"{target}(seed={seed}, {config}) returned {k}={v}")
        metrics[k] = v
    return metrics


class _Progress:
    """A live line in a notebook (its final text does not depend on the cache), a tqdm
    bar on a terminal, nothing otherwise."""

    def __init__(self, title: str, total: int, show: bool | None, summary: str = ""):
        self.title, self.total, self.done, self.cached = title, total, 0, 0
        self.summary = summary or f"{total} runs"
        self.start = time.perf_counter()
        self.handle = self.bar = None
        kernel = "ipykernel" in sys.modules and getattr(_ipython(), "kernel", None) is not None
        if show is False:
            return
        if kernel:
            from IPython.display import display
            self.handle = display(self._final(), display_id=True)
        elif show or sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=title, unit="run", leave=False)

    def _final(self):
        from IPython.display import Pretty
        return Pretty(f"{self.title}: {self.summary}")

    def step(self, cached: bool = False, n: int = 1) -> None:
        self.done += n
        self.cached += n if cached else 0
        if self.bar is not None:
            self.bar.update(n)
        elif self.handle is not None:
            from IPython.display import Pretty
            from tqdm import tqdm
            meter = tqdm.format_meter(self.done, self.total, time.perf_counter() - self.start,
                                      unit="run", prefix=self.title)
            self.handle.update(Pretty(f"{meter} ({self.cached} from the cache)"))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.handle is not None:
            self.handle.update(self._final())


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _jobs(experiment: Experiment, configs: Iterable[Mapping[str, Any]], seeds: Iterable[int],
          workers: int | None) -> tuple[tuple[dict, ...], tuple[int, ...]]:
    """The checked configs and seeds of a call to :func:`run` or :func:`start`."""
    if not isinstance(experiment, Experiment):
        raise TypeError(f"run: expected an Experiment, got {type(experiment).__name__}")
    cfgs = tuple(_check_config(experiment.name, c) for c in configs)
    seeds = tuple(int(s) for s in seeds)
    if not cfgs:
        raise ValueError(f"run({experiment.name!r}): no configs")
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"run({experiment.name!r}): needs at least two distinct seeds for an "
                         f"interval, got {seeds}")
    if len({json.dumps(c, sort_keys=True) for c in cfgs}) != len(cfgs):
        raise ValueError(f"run({experiment.name!r}): a config is listed twice: {cfgs}")
    if workers is not None and workers < 1:
        raise ValueError(f"run: workers must be >= 1 or None, got {workers}")

    return cfgs, seeds


def run(experiment: Experiment, configs: Iterable[Mapping[str, Any]], seeds: Iterable[int],
        *, workers: int | None = None, progress: bool | None = None) -> Results:
    """Run ``experiment`` for every config and seed; results from the cache where stored.

    Args:
        experiment: what to run.
        configs: dicts of JSON values, passed to ``fn`` as keyword arguments.
        seeds: at least two distinct integers; every config runs on every seed, so two
            configs can be compared seed by seed (:meth:`Results.difference`).
        workers: worker processes for the runs not in the cache; ``None`` takes those an
            earlier call started, or else decides from the time the first run takes and the
            number of cores; ``1`` runs in this process.  Runs handed over by :func:`start`
            are collected from the processes that have them.
        progress: ``None`` shows it in a notebook or on a terminal, ``False`` never.
    Returns:
        :class:`Results`.
    """
    cfgs, seeds = _jobs(experiment, configs, seeds, workers)
    start = time.perf_counter()
    store = cache_dir()
    refresh = os.environ.get("NORMCORE_REFRESH", "") not in ("", "0")
    folder = None if store is None else store / "experiments" / experiment.name
    jobs = [(c, s) for c in cfgs for s in seeds]
    found: dict[int, dict[str, float]] = {}
    bar = _Progress(experiment.name, len(jobs), progress,
                    f"{len(cfgs)} config{'s' * (len(cfgs) > 1)} x {len(seeds)} seeds"
                    f" = {len(jobs)} runs")
    keys = [_key(experiment, c, s) for c, s in jobs]
    for i, (key, _) in enumerate(keys):
        path = None if folder is None else folder / f"{key}.json"
        if path is not None and not refresh and path.exists():
            try:
                found[i] = json.loads(path.read_text())["metrics"]
                bar.step(cached=True)
            except (ValueError, KeyError):
                pass   # a damaged file: run again and overwrite

    def store_one(i: int, metrics: dict[str, float]) -> None:
        found[i] = metrics
        bar.step()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            key, ident = keys[i]
            tmp = folder / f"{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({**ident, "metrics": metrics}, sort_keys=True))
            tmp.replace(folder / f"{key}.json")

    todo = [i for i in range(len(jobs)) if i not in found]
    computed = len(todo)
    try:
        # runs handed over by start(): collected from the processes that have them
        started = {i: fut for i in todo if (fut := _workers.take(keys[i][0])) is not None}
        todo = [i for i in todo if i not in started]
        if started:                   # the rest go there too (or here, if they are gone)
            workers = _workers.kept() or 1
        elif workers is None:
            workers = _workers.kept()         # kept from an earlier call: no start to pay
        if workers is None and todo:
            t0 = time.perf_counter()
            first = todo.pop(0)
            store_one(first, _call(experiment.target, *jobs[first]))
            seconds = time.perf_counter() - t0
            cores = os.cpu_count() or 1
            pays = seconds * len(todo) / cores + WORKER_START_SECONDS < seconds * len(todo)
            workers = min(cores, len(todo)) if pays and len(todo) > 1 else 1
        futures = {fut: i for i, fut in started.items()}
        if workers is not None and workers > 1 and todo:
            executor = _workers.pool(workers)
            futures.update({executor.submit(_call, experiment.target, *jobs[i],
                                            dispatch.kernels_enabled()): i for i in todo})
            todo = []
        try:
            for i in todo:                                       # in this process
                store_one(i, _call(experiment.target, *jobs[i]))
            for fut in cf.as_completed(futures):
                store_one(futures[fut], fut.result())
        except BaseException as err:
            for fut in futures:
                fut.cancel()
            if isinstance(err, cf.process.BrokenProcessPool):
                _workers.shutdown()               # a worker died: start afresh next time
            raise
    finally:
        bar.close()
    records = tuple((jobs[i][0], jobs[i][1], found[i]) for i in range(len(jobs)))
    return Results(experiment, cfgs, seeds, records, cached=len(jobs) - computed,
                   seconds=time.perf_counter() - start)


def start(experiment: Experiment, configs: Iterable[Mapping[str, Any]], seeds: Iterable[int],
          *, workers: int | None = None) -> int:
    """Hand the runs of ``experiment`` not in the cache to worker processes and return at
    once: the :func:`run` with these configs and seeds (later, in this process) collects them.

    A notebook starts its later sweeps before it draws its figures, and they train meanwhile.
    ``workers``: ``None`` takes the kept processes, or one per core.  Returns how many runs
    were handed over (none on a single core: :func:`run` trains them then).
    """
    cfgs, seeds = _jobs(experiment, configs, seeds, workers)
    store = cache_dir()
    refresh = os.environ.get("NORMCORE_REFRESH", "") not in ("", "0")
    folder = None if store is None else store / "experiments" / experiment.name
    keys = [(_key(experiment, c, s)[0], c, s) for c in cfgs for s in seeds]
    todo = [(key, c, s) for key, c, s in keys
            if folder is None or refresh or not (folder / f"{key}.json").exists()]
    cores = os.cpu_count() or 1
    workers = workers or _workers.kept() or min(cores, len(todo))
    if workers < 2 or not todo:
        return 0
    for key, c, s in todo:
        _workers.submit(key, _call, experiment.target, c, s, dispatch.kernels_enabled(),
                        workers=workers)
    return len(todo)
