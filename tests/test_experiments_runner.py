"""normcore.experiments.runner: seeds, intervals, the disk cache, worker processes."""
from __future__ import annotations

import json
import math
import os
import time

import pytest
import torch
from scipy import stats

from normcore.experiments import runner, toy, workers
from normcore.experiments.runner import Experiment, interval, run
import contextlib


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMCORE_CACHE", str(tmp_path))
    monkeypatch.delenv("NORMCORE_REFRESH", raising=False)
    return tmp_path


def test_interval_is_students_t():
    vals = [0.61, 0.72, 0.55, 0.80, 0.67]
    iv = interval(vals)
    mean = sum(vals) / 5
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / 4)
    h = 2.7764451051977987 * sd / math.sqrt(5)          # t_{0.975, 4}
    assert iv.values == tuple(vals) and iv.n == 5
    assert math.isclose(iv.mean, mean) and math.isclose(iv.half_width, h)
    lo, hi = stats.t.interval(0.95, 4, loc=mean, scale=stats.sem(vals))
    assert math.isclose(iv.low, lo) and math.isclose(iv.high, hi)
    assert iv.above(0.5) and not iv.above(0.6) and iv.below(0.9)
    assert interval([-0.01, 0.02, 0.0, 0.01]).within(0.05)
    assert not interval([-0.01, 0.08, 0.0, 0.01]).within(0.05)
    assert str(iv) == f"{mean:.3f} [{lo:.3f}, {hi:.3f}]"


@pytest.mark.parametrize("bad, words", [([1.0], "at least 2"), ([1.0, float("nan")], "finite")])
def test_interval_rejects_what_has_no_interval(bad, words):
    with pytest.raises(ValueError, match=words):
        interval(bad)


def test_a_95_interval_covers_the_mean_about_95_times_in_100():
    gen = torch.Generator().manual_seed(0)
    draws = torch.randn(2000, 5, generator=gen, dtype=torch.float64)
    covered = sum(interval(row.tolist()).low <= 0 <= interval(row.tolist()).high
                  for row in draws)
    assert 0.935 < covered / 2000 < 0.965


def test_run_gives_per_seed_values_intervals_and_paired_differences(cache):
    configs = runner.grid(mu=(0.0, 0.5), n=(64,))
    res = run(toy.NOISY_MEAN, configs, seeds=range(6), workers=1)
    a = res.values("mean", mu=0.5)
    assert len(a) == 6
    # the same seed draws the same noise: the paired difference is exactly mu
    diff = res.difference("mean", {"mu": 0.5}, {"mu": 0.0})
    assert all(math.isclose(d, 0.5) for d in diff.values)
    assert diff.half_width < 1e-12 and diff.above(0.49)
    assert res.interval("mean", mu=0.5).mean == pytest.approx(sum(a) / 6)
    table = res.table("mean").splitlines()
    assert len(table) == 3 and "95% int." in table[0] and "mu=0.5 n=64" in table[2]
    assert res.summary().startswith("12 runs (2 configs x 6 seeds), 0 read from the cache")
    with pytest.raises(KeyError, match="2 configs match"):
        res.values("mean", n=64)
    with pytest.raises(KeyError, match="no metric"):
        res.values("accuracy", mu=0.0)


def test_a_config_equal_to_the_query_wins_over_the_ones_that_include_it(cache):
    """{"mu": 0.0} names that config, not also {"mu": 0.0, "n": 8}; a query that only some
    configs include still has to name one of them."""
    configs = [{"mu": 0.0}, {"mu": 0.0, "n": 8}, {"mu": 0.5, "n": 8}]
    res = run(toy.NOISY_MEAN, configs, seeds=range(3), workers=1)
    assert res.config(mu=0.0) == {"mu": 0.0}
    assert res.config(mu=0.0, n=8) == {"mu": 0.0, "n": 8}
    assert res.values("mean", mu=0.0) != res.values("mean", mu=0.0, n=8)    # 16 draws, not 8
    assert len(res.table("mean").splitlines()) == 4               # every row found
    with pytest.raises(KeyError, match="2 configs match"):
        res.config(n=8)


def test_a_second_run_reads_the_cache_and_a_changed_config_runs(cache):
    first = run(toy.NOISY_MEAN, [{"mu": 1.0}], seeds=(3, 4), workers=1)
    again = run(toy.NOISY_MEAN, [{"mu": 1.0}], seeds=(3, 4), workers=1)
    assert (first.cached, again.cached) == (0, 2)
    assert again.values("calls", mu=1.0) == first.values("calls", mu=1.0)   # not called
    files = list((cache / "experiments" / "toy.noisy_mean").glob("*.json"))
    assert len(files) == 2
    stored = json.loads(files[0].read_text())
    assert {"experiment", "config", "seed", "torch", "cpu", "normcore", "metrics"} <= set(stored)
    assert stored["torch"] == torch.__version__
    other = run(toy.NOISY_MEAN, [{"mu": 2.0}], seeds=(3, 4), workers=1)
    assert min(other.values("calls", mu=2.0)) > max(first.values("calls", mu=1.0))
    assert other.values("mean", mu=2.0) == pytest.approx([v + 1 for v in first.values("mean", mu=1.0)])


def test_refresh_and_off_run_again(cache, monkeypatch):
    first = run(toy.NOISY_MEAN, [{}], seeds=(0, 1), workers=1)
    monkeypatch.setenv("NORMCORE_REFRESH", "1")
    again = run(toy.NOISY_MEAN, [{}], seeds=(0, 1), workers=1)
    assert min(again.values("calls")) > max(first.values("calls"))
    assert again.values("mean") == first.values("mean")
    monkeypatch.delenv("NORMCORE_REFRESH")
    monkeypatch.setenv("NORMCORE_CACHE", "off")
    assert runner.cache_dir() is None
    off = run(toy.NOISY_MEAN, [{}], seeds=(0, 1), workers=1)
    assert min(off.values("calls")) > max(again.values("calls"))
    assert not list(cache.glob("**/*.tmp"))


def test_a_damaged_cache_file_is_run_again(cache):
    run(toy.NOISY_MEAN, [{"mu": 3.0}], seeds=(0, 1), workers=1)
    for f in (cache / "experiments" / "toy.noisy_mean").glob("*.json"):
        f.write_text("{not json")
    res = run(toy.NOISY_MEAN, [{"mu": 3.0}], seeds=(0, 1), workers=1)
    assert all(math.isfinite(v) for v in res.values("mean", mu=3.0))


def test_runs_leave_the_callers_random_state_and_threads_alone(cache):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    res = run(toy.NOISY_MEAN, [{"mu": 4.0}], seeds=(0, 1), workers=1)
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads
    assert res.values("threads", mu=4.0) == (1.0, 1.0)       # each run on one thread


def test_worker_processes_give_the_same_numbers(cache, monkeypatch):
    monkeypatch.setenv("NORMCORE_CACHE", "off")
    here = run(toy.NOISY_MEAN, runner.grid(mu=(0.0, 1.0)), seeds=(0, 1, 2), workers=1)
    there = run(toy.NOISY_MEAN, runner.grid(mu=(0.0, 1.0)), seeds=(0, 1, 2), workers=2)
    for mu in (0.0, 1.0):
        assert there.values("mean", mu=mu) == here.values("mean", mu=mu)
    pids = set(there.values("pid", mu=0.0) + there.values("pid", mu=1.0))
    assert len(pids - {float(os.getpid())}) >= 1               # some ran elsewhere


def test_worker_processes_are_kept_for_the_next_run(cache, monkeypatch):
    """A second run uses the processes the first started (it pays for no start), until the
    environment they inherited changes or they are shut down."""
    monkeypatch.setenv("NORMCORE_CACHE", "off")
    workers.shutdown()
    try:
        first = run(toy.NOISY_MEAN, runner.grid(mu=(0.0, 1.0)), seeds=(0, 1), workers=2)
        kept = workers._KEPT["pool"]
        pids = set(kept._processes)
        again = run(toy.NOISY_MEAN, [{"mu": 2.0}], seeds=(0, 1, 2))    # workers=None
        assert workers._KEPT["pool"] is kept
        assert {int(p) for p in again.values("pid", mu=2.0)} <= pids    # none here, none new
        assert again.values("mean", mu=2.0)[:2] == tuple(
            m + 2.0 for m in first.values("mean", mu=0.0))
        monkeypatch.setenv("NORMCORE_TEST_SETTING", "1")         # what a worker inherits
        run(toy.NOISY_MEAN, [{"mu": 3.0}], seeds=(0, 1), workers=2)
        assert workers._KEPT["pool"] is not kept and kept._processes is None   # replaced
    finally:
        workers.shutdown()
    assert not workers._KEPT


def _sigint_handler(_):
    import signal
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_kept_workers_ignore_interrupts_and_a_broken_pool_is_replaced(cache, monkeypatch):
    """Jupyter interrupts a kernel's whole process group: the workers must not die of it; and
    a pool whose worker died anyway is not kept."""
    import signal

    monkeypatch.setenv("NORMCORE_CACHE", "off")
    workers.shutdown()
    try:
        pool = workers.pool(2)
        assert all(pool.map(_sigint_handler, range(4)))            # SIG_IGN in each worker
        assert workers.kept() == 2
        for pid in list(pool._processes):                          # the workers die
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60       # the pool notices in its own thread
        while workers.kept() is not None and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                pool.submit(_sigint_handler, 0).result(timeout=5)
        assert workers.kept() is None                              # broken: not kept
        res = run(toy.NOISY_MEAN, [{"mu": 0.0}], seeds=(0, 1), workers=2)
        assert workers._KEPT["pool"] is not pool and len(res.records) == 2
    finally:
        workers.shutdown()


def test_started_runs_train_in_the_background_and_run_collects_them(cache, monkeypatch):
    workers.shutdown()
    configs = runner.grid(mu=(0.0, 1.0), sleep=(0.5,))
    try:
        assert runner.start(toy.NOISY_MEAN, configs, seeds=(0, 1, 2)) == 6    # returns at once
        assert len(workers._STARTED) == 6
        res = run(toy.NOISY_MEAN, configs, seeds=(0, 1, 2), progress=False)
        assert not workers._STARTED and res.cached == 0
        pids = {int(p) for c in configs for p in res.values("pid", **c)}
        assert pids <= set(workers._KEPT["pool"]._processes)        # made there, not here
        here = run(toy.NOISY_MEAN, configs, seeds=(0, 1, 2), workers=1)   # from the cache
        assert here.cached == 6 and here.records == res.records
        assert runner.start(toy.NOISY_MEAN, configs, seeds=(0, 1, 2)) == 0  # nothing to do
        monkeypatch.setenv("NORMCORE_CACHE", "off")
        fresh = run(toy.NOISY_MEAN, configs, seeds=(0, 1, 2), workers=1)
        for c in configs:
            assert fresh.values("mean", **c) == res.values("mean", **c)
    finally:
        workers.shutdown()
    with pytest.raises(ValueError, match="two distinct seeds"):
        runner.start(toy.NOISY_MEAN, configs, seeds=(0,))


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(configs=[{"mu": 0.0}], seeds=(0,)), ValueError, "two distinct seeds"),
    (dict(configs=[{"mu": 0.0}], seeds=(1, 1)), ValueError, "two distinct seeds"),
    (dict(configs=[], seeds=(0, 1)), ValueError, "no configs"),
    (dict(configs=[{"mu": 0.0}, {"mu": 0.0}], seeds=(0, 1)), ValueError, "listed twice"),
    (dict(configs=[{"mu": torch.tensor(0.0)}], seeds=(0, 1)), TypeError, "JSON values"),
    (dict(configs=[("mu", 0.0)], seeds=(0, 1)), TypeError, "must be a dict"),
    (dict(configs=[{}], seeds=(0, 1), workers=0), ValueError, "workers must be"),
])
def test_bad_arguments_are_named(cache, kwargs, error, words):
    with pytest.raises(error, match=words):
        run(toy.NOISY_MEAN, **kwargs)


def test_an_experiment_needs_an_importable_function():
    with pytest.raises(ValueError, match="top level of a module"):
        Experiment("local", lambda seed: {"x": 1.0})
    with pytest.raises(TypeError, match="expected an Experiment"):
        run(toy.noisy_mean, [{}], (0, 1))


def test_a_run_that_returns_nan_is_an_error(cache):
    with pytest.raises(ValueError, match="returned mean=nan"):
        run(toy.NOISY_MEAN, [{"mu": float("nan")}], seeds=(0, 1), workers=1)


def test_a_notebook_keeps_the_same_line_whether_trained_or_cached(cache, monkeypatch):
    import types

    import ipykernel  # noqa: F401  (the runner looks for a kernel)
    import IPython.display

    shown = []

    class Handle:
        def __init__(self, obj):
            shown.append(["display", obj.data])

        def update(self, obj):
            shown.append(["update", obj.data])

    monkeypatch.setattr(runner, "_ipython", lambda: types.SimpleNamespace(kernel=object()))
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id: Handle(obj))
    for _ in range(2):                      # trained, then read from the cache
        shown.clear()
        run(toy.NOISY_MEAN, runner.grid(mu=(0.0, 7.0)), seeds=(0, 1, 2), workers=1)
        assert shown[0][0] == "display" and shown[-1][0] == "update"
        assert shown[0][1] == shown[-1][1] == "toy.noisy_mean: 2 configs x 3 seeds = 6 runs"
        assert any("6/6" in text for _, text in shown[1:-1])       # the live progress
    assert any("6 from the cache" in text for _, text in shown)


def test_the_cache_key_names_which_implementation_ran():
    """A result computed by the compiled kernels is not served to a run by the reference (the
    two differ in the last bits), and a worker runs with the caller's switch."""
    import normcore
    from normcore.experiments import runner
    exp = runner.Experiment("key", runner._call)
    on, ident = runner._key(exp, {"a": 1}, 0)
    with normcore.use_kernels(False):
        off, ident_off = runner._key(exp, {"a": 1}, 0)
    assert on != off and ident["path"] != ident_off["path"]
