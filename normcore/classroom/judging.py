"""Judging what the student's functions return, in processes the student's code does not
reach.

:func:`judge_captured` takes the functions :mod:`.capture` copied out of a submission's
kernel, runs them in :mod:`.callee` (a fresh process, restarted after a function that hangs
past the time limit or ends the process) and judges each one's saved results here, with
:func:`normcore.exercises.driver.judge`, against references this process computed
(:func:`normcore.exercises.driver.plan`).  The results are loaded with
``torch.load(weights_only=True)``: tensors, strings and numbers, no code.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from .capture import capture_path
from .record import verdict
import contextlib


def _kill_group(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def parse_options(text: str) -> dict:
    """The options of a check cell (``", convention='bit'"``) as a dict of literals."""
    text = (text or "").strip().lstrip(",").strip()
    if not text:
        return {}
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if call.args:
            raise ValueError("positional arguments")
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"the check's options {text!r} are not keyword=literal pairs "
                         f"({e})") from None


def judge_captured(exs: list[dict], workdir: Path, cell_timeout: int, memory: int,
                   hidden: bool = True) -> dict[str, dict]:
    """Check the functions captured for the exercises ``exs``: run them in :mod:`.callee`
    (one fresh process for all of them, restarted after a function that hangs, over
    ``cell_timeout`` s, or ends the process), then judge what each returned here, against
    the references of :func:`normcore.exercises.driver.plan` computed in this process.
    Each exercise's verdict, by label."""
    jobs = []
    for ex in exs:
        options, rules = parse_options(ex.get("options", "")), list(ex.get("rules") or [])
        jobs.append({"label": ex["label"], "op": ex["op"], "options": options,
                     "rules": rules, "hidden": hidden,
                     "function": str(capture_path(workdir / "results.jsonl", ex["label"])),
                     "out": str(workdir / f"checked-{ex['label']}.pt")})
    verdicts: dict[str, dict] = {}
    pending = list(jobs)
    while pending:
        failure = _run_callee(pending, workdir, cell_timeout, memory)
        done = [j for j in pending if Path(j["out"]).exists()]
        for job in done:
            verdicts[job["label"]] = _judge_one(job)
        pending = [j for j in pending if not Path(j["out"]).exists()]
        if pending:   # the one it started and did not finish hung or ended the process
            blamed = next((j for j in pending if Path(j["out"] + ".started").exists()),
                          pending[0])
            pending.remove(blamed)
            verdicts[blamed["label"]] = {"label": blamed["label"], **(failure or {
                "status": "error", "detail": "the grader's process for your function "
                "ended without a result"})}
    return verdicts


def _run_callee(jobs: list[dict], workdir: Path, cell_timeout: int, memory: int) -> dict | None:
    """Run :mod:`.callee` on ``jobs`` until it ends, or until ``cell_timeout`` s pass
    without a job finishing (then kill it).  What happened to the job it stopped on, as a
    verdict's status and detail, or ``None`` if it finished them all."""
    import time
    spec = workdir / "callee-jobs.json"
    spec.write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "normcore.classroom.callee", str(spec), "--memory",
           str(memory)]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    begun = time.monotonic()
    started_at: dict[str, float] = {}
    try:
        while True:
            try:
                _, stderr = child.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                running = [j for j in jobs if not Path(j["out"]).exists()
                           and Path(j["out"] + ".started").exists()]
                for j in running:
                    started_at.setdefault(j["out"], now)
                if any(now - started_at[j["out"]] > cell_timeout for j in running):
                    _kill_group(child.pid)
                    child.communicate()
                    return {"status": "timed out", "detail": f"your function ran longer than "
                            f"{cell_timeout} s on the grader's test sets"}
                if not running and not started_at and now - begun > 20 * cell_timeout:
                    _kill_group(child.pid)   # never got as far as a student's function
                    child.communicate()
                    return {"status": "error", "detail": "the grader's process did not start"}
    except BaseException:
        _kill_group(child.pid)
        raise
    if child.returncode == 0:
        return None
    from .runner import kernel_end
    how = kernel_end(child.returncode)
    why = (f"was killed by signal {how['signal']} ({how['signal_name']})" if "signal" in how
           else f"exited with code {how.get('exit_code')}")
    last_line = (stderr.decode(errors="replace").strip().splitlines() or [""])[-1][:200]
    if "signal" not in how and not any(Path(j["out"] + ".started").exists() for j in jobs):
        return {"status": "error", "detail": f"the grader could not load your function: "
                f"{last_line}"}
    return {"status": "kernel died", "detail": f"the process that ran your function on the "
            f"grader's test sets {why}"}


def _judge_one(job: dict) -> dict:
    """The verdict on one job's saved results (never runs student code)."""
    import torch

    from normcore.exercises.driver import judge, plan
    label = job["label"]
    try:
        the_plan = plan(job["op"], job["options"], job["hidden"], job["rules"])
        collected = torch.load(job["out"], weights_only=True)
        report = judge(the_plan, collected)
    except Exception as e:  # noqa: BLE001 - what the student's process wrote is not trusted
        return {"label": label, "status": "error",
                "detail": f"the grader could not read what your function returned "
                          f"({type(e).__name__}: {str(e)[:200]})"}
    return verdict(label, report)
