"""The driver: :func:`check` runs the student's function through an op's hooks and writes
the report (see :mod:`normcore.exercises.ops` for the order of the hooks)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .catalogue import CATALOGUE
from .hidden import hidden_cases, twice_the_samples
from .inputs import Case
from .ops import Op, get_op
from .report import Report, dtype_text, failed, number, shape_text, type_name, wrap
from .tolerance import prepare
from .rules import Calls, describe, fix, parse_rules, violations, watch
from .variants import Variant, all_close, close, tolerance_of


@dataclass
class Plan:
    """What :func:`check` runs, built before the student's function is called: the op, its
    parsed options, the test sets (with their tolerances), the float64 references, the rules
    and, for ``no-sample-loop``, a set with twice the samples (``probe``: (index of the set
    it doubles, the doubled set))."""

    impl: Op
    options: dict
    cases: list
    refs: list
    base: dict
    rules: tuple = ()
    probe: tuple | None = None


def plan(op: str, options: dict, hidden: bool = False, rules=None) -> Plan:
    """The :class:`Plan` of ``check(op, fn, hidden=hidden, rules=rules, **options)``."""
    impl = get_op(op)
    parsed = impl.parse_options(options)
    rules = parse_rules(rules)
    built = hidden_cases(impl, parsed) if hidden else impl.cases(parsed)
    cases, refs = prepare(impl, built)
    probe = None
    if "no-sample-loop" in rules:
        for i, case in enumerate(cases):
            big = twice_the_samples(case) if case.kind == "regular" else None
            if big is not None:
                probe = (i, big)
                break
    return Plan(impl, parsed, cases, refs, impl.base_spec(parsed), rules, probe)


def check(op: str, student_fn: Callable, *, hidden: bool = False, rules=None,
          **options) -> Report:
    """Run ``student_fn`` and the reference for ``op`` on seeded inputs; say what is wrong.

    Returns a :class:`Report`; ``print(report)`` gives the plain-text verdict.  Options:
    ``seed`` (int, default 0), ``ndims`` (the input ranks to test, e.g. ``(4,)``) and, for
    ``weight_standardize``, ``weight_standardize_backward`` and ``fold_ws``, ``convention``
    (``"original"``, ``"bit"``, ``"timm"``).  ``hidden=True``: the grader's hidden sets
    instead of the notebook's (:mod:`.hidden`).  ``rules``: what the exercise forbids
    (:mod:`.rules`, e.g. ``("no-autograd",)``); a function that uses it fails, whatever
    its numbers.
    """
    the_plan = plan(op, options, hidden, rules)
    if not callable(student_fn):
        raise TypeError(f"check({op!r}, ...): the student function must be callable, got "
                        f"{type(student_fn).__name__}")
    return judge(the_plan, collect(the_plan, student_fn))


def _call_one(impl: Op, fn: Callable, case: Case, watched: bool) -> dict:
    """Call ``fn`` on ``case``: ``{"status": "ok", "outputs": (...)}``, or ``"stub"``,
    ``"raise"`` (``ename``, ``evalue``), ``"type"`` (``message``); with ``calls`` (what it
    called, :class:`~.rules.Calls` as a dict) when ``watched``."""
    out: dict = {}
    scope = watch(fn) if watched else contextlib.nullcontext(None)
    try:
        with scope as calls:
            raw = impl.call(fn, case)
    except NotImplementedError:
        return {"status": "stub"}
    except Exception as e:  # noqa: BLE001 - any error of the student's code is reported
        return {"status": "raise", "ename": type(e).__name__, "evalue": str(e)}
    if watched:
        out["calls"] = calls.as_dict()
    got = _as_outputs(impl, case, raw)
    if isinstance(got, Report):
        out.update(status="type", message=got.message)
    else:
        out.update(status="ok", outputs=tuple(t.clone().contiguous() for t in got))
    return out


def collect(the_plan: Plan, fn: Callable) -> dict:
    """Run the student's function on every set of ``the_plan`` (and the loop probe): what
    :func:`judge` needs, as plain data (tensors, strings, numbers), so that it can be
    computed in one process and judged in another (:mod:`normcore.classroom.callee`).
    Stops at the first set that does not give outputs."""
    impl, watched = the_plan.impl, bool(the_plan.rules)
    results = []
    for case in the_plan.cases:
        r = _call_one(impl, fn, case, watched)
        results.append(r)
        if r["status"] != "ok":
            break
    probe = None
    if the_plan.probe is not None and all(r["status"] == "ok" for r in results):
        probe = _call_one(impl, fn, the_plan.probe[1], True)
    return {"results": results, "probe": probe}


def judge(the_plan: Plan, collected: dict) -> Report:
    """The :class:`Report` on what :func:`collect` gathered (never calls student code)."""
    impl, parsed, cases, refs = the_plan.impl, the_plan.options, the_plan.cases, the_plan.refs
    results = collected["results"]
    # 1. did the function run on every set?
    for case, r in zip(cases, results):
        if r["status"] == "stub":
            return failed(impl.name, "not_implemented", wrap(
                "Your function raised NotImplementedError: it is still the stub. Replace "
                "`raise NotImplementedError()` with your code."))
        if r["status"] == "raise":
            return _report_exception(impl, parsed, case, r["ename"], r["evalue"])
        if r["status"] == "type":
            return failed(impl.name, "type", r["message"])
        if r["status"] != "ok":
            raise ValueError(f"a result of status {r['status']!r}: not one collect() gives")
    if len(results) < len(cases):
        raise ValueError(f"{len(results)} results for {len(cases)} test sets")
    # 2. what the exercise forbids
    if the_plan.rules:
        report = _report_rules(impl, the_plan, cases, results, collected.get("probe"))
        if report is not None:
            return report
    outs = [tuple(r["outputs"]) for r in results]
    # 3. shapes, then dtypes
    for case, got in zip(cases, outs):
        for i, (t, shape) in enumerate(zip(got, impl.expected_shapes(case))):
            if tuple(t.shape) != tuple(shape):
                return failed(impl.name, "shape", wrap(
                    f"Your function returned {_output_name(impl, i)} of shape {shape_text(t)} "
                    f"on {case.title}, but it must have shape {shape_text(shape)}"
                    f"{impl.shape_hint(i)}."))
    for case, got in zip(cases, outs):
        for i, t in enumerate(got):
            if t.dtype != case.dtype:
                return failed(impl.name, "dtype", wrap(
                    f"Your function returned {_output_name(impl, i)} as {dtype_text(t.dtype)} "
                    f"for a {dtype_text(case.dtype)} input on {case.title}. Keep the input's "
                    f"dtype: create new tensors with dtype=x.dtype (torch.tensor(...) and "
                    f"torch.zeros(n) default to float32), and avoid .float() and .double()."))

    # 4. values
    err = _largest_error(impl, cases, outs, refs)
    if all_close(outs, refs, cases):
        return Report(impl.name, True, "pass", None, wrap(
            f"Your function matches the reference on all {len(cases)} test sets."),
            err["max"], (), None)

    # 5. which mistake is it?
    context = impl.context(parsed, cases)
    found = _diagnose(impl, the_plan.base, cases, outs, refs, parsed)
    if found is not None:
        return _report_misconception(impl, context, found, err)
    not_finite = [(c, got) for c, got, ref in zip(cases, outs, refs)
                  if any(bool((~torch.isfinite(t) & torch.isfinite(r)).any())
                         for t, r in zip(got, ref))]
    if not_finite:
        return _report_not_finite(impl, *not_finite[0], err)
    return Report(impl.name, False, "unknown", None, _unknown_message(impl, cases, outs, refs, err),
                  err["max"], (), err["text"])


# ---- running the student's function ----------------------------------------------------------
def _output_name(impl: Op, i: int) -> str:
    return "a tensor" if len(impl.outputs) == 1 else impl.outputs[i]


def _as_outputs(impl: Op, case: Case, raw):
    """The outputs as a tuple of detached tensors, or a "type" :class:`Report`."""
    k = len(impl.outputs)
    if k == 1:
        if isinstance(raw, torch.Tensor):
            return (raw.detach(),)
        extra = ""
        if isinstance(raw, (tuple, list)):
            extra = " Return only the normalized tensor, not a tuple."
        elif raw is None:
            extra = " Did you forget the return statement?"
        return failed(impl.name, "type", wrap(
            f"Your function returned {type_name(raw)} on {case.title}; it must return one "
            f"torch.Tensor.{extra}"))
    names = ", ".join(impl.outputs)
    if (not isinstance(raw, (tuple, list)) or len(raw) != k
            or not all(isinstance(t, torch.Tensor) for t in raw)):
        extra = " Did you forget the return statement?" if raw is None else ""
        return failed(impl.name, "type", wrap(
            f"Your function returned {type_name(raw)} on {case.title}; it must return a tuple "
            f"of {k} tensors, `({names})`.{extra}"))
    return tuple(t.detach() for t in raw)


def _report_exception(impl: Op, options: dict, case: Case, ename: str, evalue: str) -> Report:
    text = evalue.strip().splitlines()
    text = " ".join(line.strip() for line in text[:3])
    if len(text) > 300:
        text = text[:297] + "..."
    msg = (f"Your function raised {ename}: {text}\nwhen called as "
           f"{impl.call_text} on {case.title}.\n{impl.call_hint(options)}")
    if impl.input_name == "x" and len(options["ndims"]) > 1:
        msg += " Compute dims from x.dim() rather than assuming one shape."
    return failed(impl.name, "exception", wrap(msg))


# ---- comparing with the reference ------------------------------------------------------------
def _largest_error(impl: Op, cases, outs, refs) -> dict:
    """The largest finite |student - reference|, where it is, and per set."""
    best = (-1.0, None, None, None)
    per_case = []
    for case, got, ref in zip(cases, outs, refs):
        worst = 0.0
        for i, (t, r) in enumerate(zip(got, ref)):
            diff = (t.double() - r.double()).abs()
            diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
            if diff.numel() == 0:
                continue
            m = float(diff.max())
            worst = max(worst, m)
            if m > best[0]:
                flat = int(diff.flatten().argmax())
                idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(flat), diff.shape))
                best = (m, case, i, idx)
        per_case.append(worst)
    m, case, i, idx = best
    text = None
    if case is not None:
        out = "" if len(impl.outputs) == 1 else f"{impl.outputs[i]}, "
        text = f"{number(m)} in {out}{case.short}, at {impl.locate(case, i, idx)}"
    return {"max": m if m >= 0 else None, "text": text, "per_case": per_case}


def _distinct_candidates(impl: Op, base: dict, cases, refs, options):
    """Yield ``(variant, outputs)`` for every single variant that can be told apart
    from the reference and from every earlier variant on these test sets."""
    seen = []
    for var in impl.candidates(options, cases):
        try:
            vals = [impl.evaluate(var.spec(base), c) for c in cases]
        except Exception:  # noqa: BLE001 - a knob that makes no sense for these shapes
            continue
        if sum(v is not None for v in vals) < 2:
            continue
        if all_close(vals, refs, cases) or any(all_close(vals, v, cases) for v in seen):
            continue
        seen.append(vals)
        yield var, vals


def _diagnose(impl: Op, base: dict, cases, outs, refs, options) -> Variant | None:
    """The first variant (single, then pair) whose output matches the student's."""
    singles = []
    for var, vals in _distinct_candidates(impl, base, cases, refs, options):
        if all_close(outs, vals, cases):
            return var
        singles.append(var)
    for i, a in enumerate(singles):
        for b in singles[i + 1:]:
            if a.knobs & b.knobs:
                continue
            pair = a + b
            try:
                vals = [impl.evaluate(pair.spec(base), c) for c in cases]
            except Exception:  # noqa: BLE001 - a pair of knobs that makes no sense together
                continue
            if all_close(outs, vals, cases) and not all_close(vals, refs, cases):
                return pair
    return None


# ---- the reports -------------------------------------------------------------------------------
def _render(impl: Op, context: dict, var: Variant, i: int) -> tuple[str, str, str]:
    key = var.keys[i]
    fields = dict(context)
    fields.update(impl.render_fields(context, key, dict(var.details[i])))
    return CATALOGUE[key].render(fields)


def _report_misconception(impl: Op, context: dict, var: Variant, err: dict) -> Report:
    parts = []
    advice = tuple((key, *_render(impl, context, var, i)) for i, key in enumerate(var.keys))
    if len(var.keys) == 1:
        did, why, fix = _render(impl, context, var, 0)
        parts += [f"What you did: {did}", f"Why it is wrong: {why}", f"What to change: {fix}"]
    else:
        parts.append("Your output matches two mistakes at once.")
        for i, key in enumerate(var.keys):
            did, why, fix = _render(impl, context, var, i)
            parts += [f"{i + 1}. {CATALOGUE[key].title} [{key}]",
                      f"What you did: {did}", f"Why it is wrong: {why}",
                      f"What to change: {fix}"]
    if err["text"]:
        parts.append(f"Largest error: {err['text']}.")
    msg = "\n".join(wrap(p) for p in parts)
    return Report(impl.name, False, "misconception", var.keys[0], msg, err["max"], var.keys,
                  err["text"], advice)


def _report_not_finite(impl: Op, case: Case, got, err: dict) -> Report:
    i, t = next((i, t) for i, t in enumerate(got) if not bool(torch.isfinite(t).all()))
    idx = tuple(int(v) for v in (~torch.isfinite(t)).nonzero()[0])
    n_bad = int((~torch.isfinite(t)).sum())
    which = "the output" if len(impl.outputs) == 1 else impl.outputs[i]
    msg = wrap(
        f"Your function returned NaN or inf: {n_bad} of {t.numel()} values of {which} on "
        f"{case.title}, the first at {impl.locate(case, i, idx)}. The reference is finite "
        f"there.\nCommon causes: dividing by sqrt(var) without eps when a set is (nearly) "
        f"constant; the square root of a negative variance (E[x^2] - E[x]^2 can come out "
        f"negative); dividing by n - 1 when n = 1; or a division by zero elsewhere.")
    return Report(impl.name, False, "nan", None, msg, err["max"], (), err["text"])


def _unknown_message(impl: Op, cases, outs, refs, err) -> str:
    lines = [("Your function does not match the reference, and does not match any known "
              "misconception.")]
    if err["text"]:
        lines.append(f"Largest error: {err['text']}.")
    good = [c.name for c, got, ref in zip(cases, outs, refs) if all_close([got], [ref], [c])]
    bad = [f"{c.name} (largest error {number(e)})" for c, e, got, ref
           in zip(cases, err["per_case"], outs, refs) if not all_close([got], [ref], [c])]
    lines.append(f"Sets that match the reference: {', '.join(good) or 'none'}. Sets that do "
                 f"not: {', '.join(bad)}.")
    if len(impl.outputs) > 1:
        right = [name for i, name in enumerate(impl.outputs)
                 if all(bool(close(got[i], ref[i], tolerance_of(c, i)).all())
                        for c, got, ref in zip(cases, outs, refs))]
        wrong = [n for n in impl.outputs if n not in right]
        lines.append(f"Wrong: {', '.join(wrong)}." + (f" Right: {', '.join(right)}."
                                                      if right else ""))
    # in the worst set: which samples / channels hold the wrong values?
    worst = max(range(len(cases)), key=lambda k: err["per_case"][k])
    case = cases[worst]
    for i, (t, r) in enumerate(zip(outs[worst], refs[worst])):
        wrong_values = ~close(t, r, tolerance_of(case, i))
        if (not bool(wrong_values.any()) or t.dim() < 2
                or not impl.indexed_by_sample_and_channel):
            continue
        idx = wrong_values.nonzero()
        samples = sorted({int(v) for v in idx[:, 0]})
        channels = sorted({int(v) for v in idx[:, 1]})
        out = "" if len(impl.outputs) == 1 else f" of {impl.outputs[i]}"
        lines.append(f"In set {case.name} the wrong values{out} are in sample(s) "
                     f"{', '.join(map(str, samples))} of {t.shape[0]} and channel(s) "
                     f"{', '.join(map(str, channels))} of {t.shape[1]}.")
    lines.append("Test sets:")
    msg = "\n".join(wrap(p) for p in lines)
    return msg + "\n" + "\n".join(wrap(f"{c.name}: {c.label}", "  ") for c in cases)


def _report_rules(impl: Op, the_plan: Plan, cases, results, probe) -> Report | None:
    """A "forbidden" report when the calls break a rule, else ``None``."""
    found = []
    for case, r in zip(cases, results):
        found = violations(the_plan.rules, Calls.from_dict(r.get("calls", {})), case)
        if found:
            break
    if not found and probe is not None and the_plan.probe is not None:
        i = the_plan.probe[0]
        small = Calls.from_dict(results[i].get("calls", {}))
        big = Calls.from_dict(probe.get("calls", {})) if probe.get("status") == "ok" else None
        found = violations(("no-sample-loop",), small, cases[i], big)
    if not found:
        return None
    lines = ["Your function uses what this exercise forbids."]
    for rule, what in found:
        lines.append(f"Rule: {describe(rule)} [{rule}]. Seen: {what}.")
    lines.append("What to change: " + fix(found[0][0]))
    return Report(impl.name, False, "forbidden", None, "\n".join(wrap(p) for p in lines),
                  None, (), None, (), tuple(rule for rule, _ in found))

