"""normcore.experiments.sweeps and ``python -m normcore.experiments``: named sweeps, the
command line, committed results that load back as Results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from normcore.experiments import runner, sweeps, toy
from normcore.experiments.__main__ import main, parse_seeds
from normcore.experiments.sweeps import Sweep

ROOT = Path(__file__).resolve().parents[1]
TOY = sweeps.get("toy")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NORMCORE_REFRESH", raising=False)
    return tmp_path / "cache"


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m normcore.experiments ARGS`` in a fresh process, on this clone's normcore."""
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "normcore.experiments", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)


def test_run_writes_a_file_whose_records_load_back_equal(cache, tmp_path):
    out = tmp_path / "toy.json"
    proc = cli("run", "toy", "--seeds", "0-2", "--out", str(out),
               env={"NORMCORE_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert "6 runs (2 configs x 3 seeds), 0 read from the cache" in proc.stdout
    doc = json.loads(out.read_text())
    loaded = sweeps.load_results("toy", out)
    assert isinstance(loaded, runner.Results)
    assert loaded.records == tuple((r["config"], r["seed"], r["metrics"]) for r in doc["records"])
    assert loaded.seeds == (0, 1, 2) and loaded.configs == TOY.configs
    # the same numbers as a run in this process (seeded, one thread)
    here = runner.run(toy.NOISY_MEAN, TOY.configs, (0, 1, 2), workers=1, progress=False)
    for cfg in TOY.configs:
        assert loaded.values("mean", **cfg) == here.values("mean", **cfg)
    assert loaded.interval("mean", mu=0.5).format() == here.interval("mean", mu=0.5).format()
    assert "95% int." in loaded.table("mean")
    # what made it
    assert doc["command"] == f"python -m normcore.experiments run toy --seeds 0-2 --out {out}"
    assert doc["format"] == sweeps.FORMAT and doc["seeds"] == [0, 1, 2]
    made = doc["made"]
    assert made["torch"] == torch.__version__
    assert made["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert made["normcore_source"] == runner._source_hash() and made["threads_per_run"] == 1
    assert {"date", "wall_seconds", "platform", "machine", "cpu_count", "torch_threads",
            "workers", "cached_runs"} <= set(made)
    assert doc["experiment"]["target"] == "normcore.experiments.toy:noisy_mean"


def test_list_shows_every_sweep_and_its_committed_results(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("toy", "group", "ws", "prenorm"):
        assert f"\n{name:8} " in "\n" + out
    assert "full: 2 configs x 5 seeds = 10 runs; reduced: 2 x 3 = 6" in out
    assert "make them with: python -m normcore.experiments run toy" in out


def test_list_says_when_and_where_results_were_made(capsys, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps, "RESULTS_DIR", tmp_path / "results")
    assert main(["run", "toy", "--workers", "1", "--no-progress"]) == 0   # the full sweep
    written = tmp_path / "results" / "toy.json"
    assert written.is_file() and f"wrote {written}" in capsys.readouterr().out
    assert main(["list"]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if "committed results" in t
                and "toy.json" in t)
    assert torch.__version__ in line and "(this source)" in line and "10 runs" in line
    assert main(["show", "toy", "--metric", "mean"]) == 0
    shown = capsys.readouterr().out
    assert "made by: python -m normcore.experiments run toy --workers 1 --no-progress" in shown
    assert "mu=0.5 n=16" in shown and "s4" in shown and "95% int." in shown


def test_a_reduced_run_is_not_written_unless_asked(capsys, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps, "RESULTS_DIR", tmp_path / "results")
    assert main(["run", "toy", "--reduced", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "toy (reduced configs, its seeds): 2 configs x 3 seeds = 6 runs" in out
    assert "not written" in out and not (tmp_path / "results").exists()


def test_a_second_run_resumes_from_the_cache(capsys, cache, tmp_path):
    out = str(tmp_path / "toy.json")
    assert main(["run", "toy", "--seeds", "0-2", "--out", out, "--workers", "1"]) == 0
    assert "0 read from the cache" in capsys.readouterr().out
    assert main(["run", "toy", "--seeds", "0-4", "--out", out, "--workers", "1"]) == 0
    assert "10 runs (2 configs x 5 seeds), 6 read from the cache" in capsys.readouterr().out
    assert sweeps.load_results("toy", out).seeds == (0, 1, 2, 3, 4)


def test_more_workers_give_the_same_numbers(capsys, cache, tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    args = ["run", "toy", "--seeds", "0-3", "--no-cache"]
    assert main([*args, "--workers", "1", "--out", str(one)]) == 0
    assert main([*args, "--workers", "2", "--out", str(two)]) == 0
    assert os.environ["NORMCORE_CACHE"] == "off"          # restored by the fixture after
    a, b = sweeps.load_results("toy", one), sweeps.load_results("toy", two)
    assert a.cached == b.cached == 0
    for cfg in TOY.configs:
        assert a.values("mean", **cfg) == b.values("mean", **cfg)
    pids = set(b.values("pid", mu=0.0) + b.values("pid", mu=0.5))
    assert pids - {float(os.getpid())}, "no run was made in a worker process"


@pytest.mark.parametrize("argv, words", [
    (["run", "nope"], "unknown sweep 'nope'; the registered sweeps are: "
                      + ", ".join(sweeps.names())),
    (["show", "nope"], "unknown sweep 'nope'"),
    (["run", "toy", "--seeds", "a"], "each part must be a seed (7) or a range of seeds (0-9)"),
    (["run", "toy", "--seeds", "3-1"], "runs backwards; write 1-3"),
    (["run", "toy", "--seeds", "4"], "at least two seeds"),
    (["run", "toy", "--seeds", "0-3,2"], "listed twice"),
    (["run", "toy", "--seeds=-1,2"], "each part must be a seed"),
    (["run", "toy", "--workers", "0"], "whole number of processes >= 1"),
    ([], "required: command"),
])
def test_bad_arguments_exit_with_status_2_and_a_message(argv, words, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert words in capsys.readouterr().err.replace("\n", " ")


def test_bad_arguments_exit_with_status_2_in_a_process_too():
    proc = cli("run", "nope")
    assert proc.returncode == 2 and "the registered sweeps are: group" in proc.stderr


def test_missing_results_name_the_command_that_makes_them(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sweeps, "RESULTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"make them with: python -m "
                                                r"normcore\.experiments run group$"):
        sweeps.load_results("group")
    assert main(["show", "group"]) == 1
    assert "python -m normcore.experiments run group" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match=r"run toy --out .*other\.json"):
        sweeps.load_results("toy", tmp_path / "other.json")


def test_seeds_parse_as_ranges_and_lists():
    assert parse_seeds("0-9") == tuple(range(10))
    assert parse_seeds("0,1,2") == (0, 1, 2)
    assert parse_seeds("0-2, 10") == (0, 1, 2, 10)


def test_the_registry_names_its_sweeps_and_refuses_mistakes():
    # the chapters' sweeps (other chapters add theirs), sorted
    assert {"group", "prenorm", "toy", "ws", "speedup", "smallbatch"} <= set(sweeps.names())
    assert sweeps.names() == sorted(sweeps.names())
    with pytest.raises(ValueError, match="registered sweeps are: " + ", ".join(sweeps.names())):
        sweeps.get("groups")
    with pytest.raises(ValueError, match="exists already"):
        sweeps.register(TOY)
    base = dict(experiment="normcore.experiments.toy:NOISY_MEAN", configs=[{"mu": 0.0}],
                seeds=range(4), reduced_configs=[{"mu": 0.0}], reduced_seeds=range(2),
                description="x")
    with pytest.raises(ValueError, match="a part of the full one"):
        Sweep("t", **{**base, "reduced_configs": [{"mu": 1.0}]})
    with pytest.raises(ValueError, match=r"seeds not in it: \[7\]"):
        Sweep("t", **{**base, "reduced_seeds": (0, 7)})
    with pytest.raises(ValueError, match="lower case"):
        Sweep("Toy Sweep", **base)
    with pytest.raises(TypeError, match="module:ATTRIBUTE"):
        Sweep("t", **{**base, "experiment": "noisy_mean"})
    with pytest.raises(ValueError, match="two distinct seeds"):
        Sweep("t", **{**base, "seeds": (0,), "reduced_seeds": (0,)})
    with pytest.raises(TypeError, match="not an Experiment"):
        Sweep("t", **{**base, "experiment": "normcore.experiments.toy:noisy_mean"}) \
            .get_experiment()


def test_the_chapters_sweeps_are_registered_with_their_reduced_runs():
    group, ws = sweeps.get("group"), sweeps.get("ws")
    assert group.reduced_configs == tuple(runner.grid(G=(1, 2, 4, 8, 16), steps=[150],
                                                      batch=[32]))
    assert group.reduced_seeds == tuple(range(8)) and group.size() == (5, 32)
    assert dict(norm="bn", batch_size=32, epochs=48) in ws.reduced_configs
    assert ws.size(reduced=True) == (5, 8)
    for name in sweeps.names():
        assert sweeps.get(name).get_experiment().fn.__module__.startswith("normcore.experiments")


def test_registering_imports_no_experiment_module():
    code = ("import sys, normcore.experiments.sweeps as s; s.names(); "
            "print(sorted(m for m in sys.modules if m.startswith('normcore.experiments.')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert proc.stdout.split() == ["['normcore.experiments.runner',",
                                   "'normcore.experiments.running',",
                                   "'normcore.experiments.sweeps',",
                                   "'normcore.experiments.workers']"]    # the runner's processes


def test_committed_results_load_and_match_their_sweep():
    for path in sorted(sweeps.RESULTS_DIR.glob("*.json")):     # none until a sweep is run
        sweep = sweeps.get(path.stem)
        res = sweeps.load_results(path.stem)
        assert res.configs == sweep.configs and res.seeds == sweep.seeds, path
        assert len(res.records) == len(sweep.configs) * len(sweep.seeds), path


def test_the_wheel_carries_the_committed_results():
    conf = (ROOT / "pyproject.toml").read_text()        # tomllib is Python 3.11+
    section = conf.split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    assert '"normcore.experiments" = ["results/*.json"]' in section
    assert sweeps.RESULTS_DIR == ROOT / "normcore" / "experiments" / "results"
