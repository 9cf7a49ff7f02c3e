"""``python -m normcore.experiments list | run NAME | show NAME``: the sweeps behind the figures.

* ``list``: every registered sweep, its size (configs x seeds, full and reduced), what it
  measures, where the book shows it, and whether committed results exist (when, where and
  on what they were made);
* ``run NAME [--seeds 0-9 | 0,1,2] [--workers K] [--reduced] [--out PATH] [--no-cache]``:
  run the sweep through :func:`normcore.experiments.runner.run` (a progress bar on a
  terminal; each finished run cached, so an interrupted sweep resumes), then write its
  results: the full registered sweep to its committed file, anything else only where
  ``--out`` says;
* ``show NAME [--metric M] [--path P]``: the committed results as tables, one row per
  config with its per-seed values and the mean with its 95% interval.

Bad arguments (an unknown sweep, a malformed ``--seeds``) exit with status 2, like every
argparse error; missing results with status 1 and the command that makes them.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from . import sweeps
from .runner import _source_hash


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0-9"``, ``"0,1,2"`` or a mix (``"0-4,10"``): distinct non-negative integers, at least
    two (an interval needs two), in the order given."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        if not (lo.isdigit() and (hi.isdigit() if dash else True)):
            raise argparse.ArgumentTypeError(
                f"{text!r}: each part must be a seed (7) or a range of seeds (0-9), "
                f"got {part!r}")
        if dash and int(hi) < int(lo):
            raise argparse.ArgumentTypeError(f"{text!r}: the range {part} runs backwards; "
                                             f"write {hi}-{lo}")
        seeds += range(int(lo), int(hi) + 1) if dash else [int(lo)]
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: a seed is listed twice")
    if len(seeds) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least two seeds (an interval "
                                         "needs two), such as 0-4")
    return tuple(seeds)


def _workers(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of processes >= 1, got {text!r}")
    return int(text)


def _shown(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _made(info: dict) -> str:
    source = "this source" if info["normcore_source"] == _source_hash() else \
        "an older source"
    return (f"{info['date']}, {info['platform']} ({info['machine']}), "
            f"{info['cpu_capability']} kernels, torch {info['torch']}, "
            f"{info['threads_per_run']} thread a run, workers {info['workers']}; "
            f"{info['runs']} runs in {info['wall_seconds']:.0f} s "
            f"({info['cached_runs']} from the cache); normcore {info['normcore_source']} "
            f"({source})")


def cmd_list(args) -> int:
    for name in sweeps.names():
        sweep = sweeps.get(name)
        (c, s), (rc, rs) = sweep.size(), sweep.size(reduced=True)
        info = sweeps.read_provenance(name)
        print(f"{name:8} {sweep.description}")
        print(f"{'':8} full: {c} configs x {s} seeds = {c * s} runs; "
              f"reduced: {rc} x {rs} = {rc * rs}")
        if sweep.figure:
            print(f"{'':8} shown in: {sweep.figure}")
        if info is None:
            print(f"{'':8} committed results: none; make them with: {sweep.command()}")
        else:
            print(f"{'':8} committed results: {_shown(info['path'])}, made {_made(info)}")
    return 0


def cmd_run(args, parser) -> int:
    sweep = _sweep(args.name, parser)
    if args.no_cache:
        os.environ["NORMCORE_CACHE"] = "off"
    registered = sweep.reduced_seeds if args.reduced else sweep.seeds
    seeds = args.seeds if args.seeds is not None else registered
    full = not args.reduced and tuple(seeds) == tuple(sweep.seeds)
    n_configs = len(sweep.reduced_configs if args.reduced else sweep.configs)
    if full:
        what = "the full sweep"
    else:
        what = (f"{'reduced' if args.reduced else 'full'} configs, "
                f"{'its' if tuple(seeds) == tuple(registered) else 'other'} seeds")
    print(f"{sweep.name} ({what}): {n_configs} configs x {len(seeds)} seeds = "
          f"{n_configs * len(seeds)} runs, workers {args.workers or 'auto'}", flush=True)
    try:
        results = sweep.run(reduced=args.reduced, seeds=seeds, workers=args.workers,
                            progress=False if args.no_progress else None)
    except KeyboardInterrupt:
        print("interrupted: the finished runs are cached; run the same command again to "
              "resume", file=sys.stderr)
        return 130
    print(results.summary())
    out = args.out or (sweep.results_path if full else None)
    if out is None:
        print("not written: not the registered full sweep (--reduced or other seeds); "
              "pass --out PATH to keep these results")
        return 0
    command = shlex.join(["python", "-m", "normcore.experiments", *args.argv])
    path = sweeps.write_results(sweep, results, out, command=command, reduced=args.reduced,
                                workers=args.workers)
    print(f"wrote {_shown(path)}")
    show = f"{sweeps.COMMAND} show {sweep.name}" + ("" if out == sweep.results_path
                                                    else f" --path {shlex.quote(str(out))}")
    print(f"see the tables with: {show}")
    return 0


def cmd_show(args, parser) -> int:
    sweep = _sweep(args.name, parser)
    try:
        results = sweeps.load_results(sweep.name, args.path)
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return 1
    info = sweeps.read_provenance(sweep.name, args.path)
    metrics = sorted(results.records[0][2])
    if args.metric is not None and args.metric not in metrics:
        print(f"{sweep.name}: no metric {args.metric!r}; it has {', '.join(metrics)}",
              file=sys.stderr)
        return 1
    print(f"{sweep.name}: {sweep.description}")
    print(f"made by: {info['command']}")
    print(f"on: {_made(info)}")
    if results.experiment.held_equal:
        print(f"held equal: {results.experiment.held_equal}")
    for metric in [args.metric] if args.metric else metrics:
        print(f"\n{metric}, per seed, and the mean with its 95% interval")
        print(results.table(metric))
    return 0


def _sweep(name: str, parser: argparse.ArgumentParser) -> sweeps.Sweep:
    try:
        return sweeps.get(name)
    except ValueError as err:
        parser.error(str(err))          # exits with status 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=sweeps.COMMAND,
        description="The sweeps behind the book's figures: list them, run them (cached, "
                    "resumable, in worker processes), show their committed results.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the registered sweeps and their committed results")
    run = sub.add_parser("run", help="run a sweep and write its results")
    run.add_argument("name", metavar="NAME")
    run.add_argument("--seeds", type=parse_seeds, metavar="SEEDS",
                     help="0-9, 0,1,2 or a mix such as 0-4,10 (default: the sweep's own)")
    run.add_argument("--workers", type=_workers, metavar="K",
                     help="worker processes, each run on one thread (default: decided from "
                          "the first run's time and the cores)")
    run.add_argument("--reduced", action="store_true",
                     help="the chapter's reduced sweep instead of the full one")
    run.add_argument("--out", metavar="PATH",
                     help="where to write the results (default: the committed file "
                          "normcore/experiments/results/NAME.json, for the full sweep only)")
    run.add_argument("--no-cache", action="store_true",
                     help="neither read nor write the run cache (NORMCORE_CACHE=off)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    show = sub.add_parser("show", help="the committed results as tables with 95%% intervals")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--metric", metavar="M", help="one metric (default: every one)")
    show.add_argument("--path", metavar="PATH", help="a results file written with --out")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.command == "list":
        return cmd_list(args)
    if args.command == "run":
        return cmd_run(args, parser)
    return cmd_show(args, parser)


if __name__ == "__main__":
    sys.exit(main())
