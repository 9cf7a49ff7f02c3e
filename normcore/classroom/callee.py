"""Runs students' functions on the grader's test sets, in a process of its own.

``python -m normcore.classroom.callee JOBS.json [--memory MB]``: for each job of the list
(``label``, ``op``, ``options``, ``rules``, ``hidden``, ``function``: the file
:mod:`.capture` wrote, ``out``), loads the function that was copied out of the student's
kernel, builds the test sets of :func:`normcore.exercises.driver.plan` (the hidden ones
with ``hidden``), calls the function on each with :func:`normcore.exercises.driver.collect`
(watching its calls when the exercise has rules) and saves what it returned, as tensors,
strings and numbers only, to ``out``.

This is the only process of the grader that runs student code after the notebook, and it
judges nothing.  The grader (:func:`.grade.judge_captured`) loads each ``out`` with
``torch.load(weights_only=True)`` and judges it against references it computed itself
(:func:`normcore.exercises.driver.judge`), so a function that patches ``torch`` or the
checker while it runs changes only its own outputs.  Before it calls a function it writes
``out + ".started"``: the grader kills this process when a function runs longer than its
time limit from then (the time to import torch and build the sets is not the student's),
and starts it again for the jobs after it.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m normcore.classroom.callee")
    parser.add_argument("jobs")
    parser.add_argument("--memory", type=int, default=4096, help="MB; 0 for no limit")
    a = parser.parse_args(argv)

    from .runner import limit_memory
    limit_memory(a.memory)
    import os

    import cloudpickle
    import torch

    from normcore.exercises.driver import collect, plan
    with open(a.jobs, encoding="utf-8") as f:
        jobs = json.load(f)
    for job in jobs:
        the_plan = plan(job["op"], job["options"], job["hidden"], job["rules"])
        with open(job["function"], "rb") as f:
            fn = cloudpickle.load(f)
        open(job["out"] + ".started", "w").close()   # the grader's clock starts here
        collected = collect(the_plan, fn)
        tmp = job["out"] + ".part"
        torch.save(collected, tmp)
        os.replace(tmp, job["out"])   # the grader sees a result whole, or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
