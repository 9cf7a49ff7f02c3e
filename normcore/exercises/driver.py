"""The driver: :func:`check` runs the student's function through an op's hooks and writes
the report (see :mod:`normcore.exercises.ops` for the order of the hooks)."""
from __future__ import annotations

from typing import Callable

import torch

from .catalogue import CATALOGUE
from .inputs import Case
from .ops import Op, get_op
from .report import Report, dtype_text, failed, number, shape_text, type_name, wrap
from .tolerance import prepare
from .variants import Variant, all_close, close, tolerance_of


def check(op: str, student_fn: Callable, **options) -> Report:
    """Run ``student_fn`` and the reference for ``op`` on seeded inputs; say what is wrong.

    Returns a :class:`Report`; ``print(report)`` gives the plain-text verdict.  Options:
    ``seed`` (int, default 0), ``ndims`` (the input ranks to test, e.g. ``(4,)``) and, for
    ``weight_standardize``, ``weight_standardize_backward`` and ``fold_ws``, ``convention``
    (``"original"``, ``"bit"``, ``"timm"``).
    """
    impl = get_op(op)
    if not callable(student_fn):
        raise TypeError(f"check({op!r}, ...): the student function must be callable, got "
                        f"{type(student_fn).__name__}")
    parsed = impl.parse_options(options)
    # the references in float64, each set with its tolerance (see .tolerance)
    cases, refs = prepare(impl, impl.cases(parsed))
    base = impl.base_spec(parsed)

    # 1. run the student's function on every set
    outs = []
    for case in cases:
        try:
            raw = impl.call(student_fn, case)
        except NotImplementedError:
            return failed(impl.name, "not_implemented", wrap(
                "Your function raised NotImplementedError: it is still the stub. Replace "
                "`raise NotImplementedError()` with your code."))
        except Exception as e:  # noqa: BLE001 - any error of the student's code is reported
            return _report_exception(impl, parsed, case, e)
        got = _as_outputs(impl, case, raw)
        if isinstance(got, Report):
            return got
        outs.append(got)

    # 2. shapes, then dtypes
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

    # 3. values
    err = _largest_error(impl, cases, outs, refs)
    if all_close(outs, refs, cases):
        return Report(op, True, "pass", None, wrap(
            f"Your function matches the reference on all {len(cases)} test sets."),
            err["max"], (), None)

    # 4. which mistake is it?
    context = impl.context(parsed, cases)
    found = _diagnose(impl, base, cases, outs, refs, parsed)
    if found is not None:
        return _report_misconception(impl, context, found, err)
    not_finite = [(c, got) for c, got, ref in zip(cases, outs, refs)
                  if any(bool((~torch.isfinite(t) & torch.isfinite(r)).any())
                         for t, r in zip(got, ref))]
    if not_finite:
        return _report_not_finite(impl, *not_finite[0], err)
    return Report(op, False, "unknown", None, _unknown_message(impl, cases, outs, refs, err),
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


def _report_exception(impl: Op, options: dict, case: Case, e: Exception) -> Report:
    text = str(e).strip().splitlines()
    text = " ".join(line.strip() for line in text[:3])
    if len(text) > 300:
        text = text[:297] + "..."
    msg = (f"Your function raised {type(e).__name__}: {text}\nwhen called as "
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
            except Exception:  # noqa: BLE001
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
    lines = ["Your function does not match the reference, and does not match any known "
             "misconception."]
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
        samples = sorted(set(int(v) for v in idx[:, 0]))
        channels = sorted(set(int(v) for v in idx[:, 1]))
        out = "" if len(impl.outputs) == 1 else f" of {impl.outputs[i]}"
        lines.append(f"In set {case.name} the wrong values{out} are in sample(s) "
                     f"{', '.join(map(str, samples))} of {t.shape[0]} and channel(s) "
                     f"{', '.join(map(str, channels))} of {t.shape[1]}.")
    lines.append("Test sets:")
    msg = "\n".join(wrap(p) for p in lines)
    return msg + "\n" + "\n".join(wrap(f"{c.name}: {c.label}", "  ") for c in cases)
