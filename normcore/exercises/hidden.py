"""Hidden test sets: inputs the student never saw in the chapter.

``check(op, fn)`` runs the seeded sets of seed 0, which the student's notebook shows and
which a student could, in principle, fit.  ``check(op, fn, hidden=True)`` runs other ones
(the grader's choice; :func:`hidden_cases`):

1. **the op's own sets with another seed** (``HIDDEN_SEED + seed``): other values in every
   set, the float32 and large-mean ones included;
2. **edge cases**, made from the regular float64 sets of that seed (every op that takes a
   batch ``x`` or ``content`` of shape :math:`(N, C, \\ldots)`, or a weight):

   * *a constant set*: channel 0 (GroupNorm: the whole of group 0) of every sample, and
     the whole of sample 0 (for LayerNorm and RMSNorm; for a weight, output channel 0),
     set to 0.5, so that a set has variance exactly 0 (only ``eps`` keeps the division
     finite: dividing by the standard deviation without ``eps``, or ``eps`` left out,
     gives NaN);
   * *one sample*: :math:`N = 1` (where the op allows it: BatchNorm of an :math:`(N, C)`
     input with :math:`N = 1` is refused by torch and by the reference, so that set is
     left out);
   * *a larger batch*: :math:`2N` samples of the regular set with the most samples (the
     second half another draw), so that a function written for the chapter's shapes
     fails.

A hidden set whose reference is not finite or raises is left out.  The sets are named
``H1``, ``H2``, ... and their label says what they are, so that a report can say which one a
function failed on without showing how it was built.
"""
from __future__ import annotations

import dataclasses

import torch

from .inputs import Case
from .report import shape_text

#: Hidden sets use seed HIDDEN_SEED + the check's seed (the visible sets use the seed).
HIDDEN_SEED = 7919
#: The arguments that carry a leading sample dim, when the op has a batch.
SAMPLE_ARGS = ("x", "dy", "content", "style")
#: The argument that holds the values (the one made constant).
VALUE_ARGS = ("x", "content", "w", "weight")
CONSTANT = 0.5


def _relabel(case: Case, name: str, args: dict, shape: tuple, what: str) -> Case:
    label = case.label.replace(shape_text(case.shape), shape_text(shape), 1)
    return dataclasses.replace(case, name=name, label=f"{label}; {what}", args=args,
                               shape=tuple(shape), tolerance=())


def _constant(case: Case, name: str) -> Case | None:
    key = next((k for k in VALUE_ARGS if k in case.args), None)
    if key is None:
        return None
    args = dict(case.args)
    x = args[key].clone()
    if x.dim() < 2:
        return None
    width = x.shape[1] // case.groups if case.groups else 1
    x[:, :width] = CONSTANT
    x[0] = CONSTANT
    args[key] = x
    if key in ("w", "weight"):
        what = "output channel 0 constant"
    else:
        what = f"{'group' if case.groups else 'channel'} 0 and sample 0 constant"
    return _relabel(case, name, args, case.shape, what)


def _one_sample(case: Case, name: str) -> Case | None:
    if not any(k in case.args for k in ("x", "content")):
        return None
    args = {k: (v[:1].clone() if k in SAMPLE_ARGS and isinstance(v, torch.Tensor) else v)
            for k, v in case.args.items()}
    return _relabel(case, name, args, (1,) + tuple(case.shape[1:]), "one sample")


def _twice(case: Case, name: str, gen: torch.Generator) -> Case | None:
    if not any(k in case.args for k in ("x", "content")):
        return None
    args = {}
    for k, v in case.args.items():
        if k in SAMPLE_ARGS and isinstance(v, torch.Tensor):
            noise = torch.randn(v.shape, generator=gen, dtype=torch.float64).to(v.dtype)
            v = torch.cat([v, v.flip(0) * 0.5 + noise])
        args[k] = v
    return _relabel(case, name, args, (2 * case.shape[0],) + tuple(case.shape[1:]),
                    "twice the samples")


def _finite(impl, case: Case) -> bool:
    try:
        ref = impl.reference(case)
    except Exception:  # noqa: BLE001 - an input the op refuses (BatchNorm, N = 1, (N, C))
        return False
    return all(bool(torch.isfinite(t).all()) for t in ref)


def hidden_cases(impl, options: dict) -> list[Case]:
    """The hidden test sets of ``impl`` (an :class:`~normcore.exercises.ops.Op`) for the
    parsed ``options`` (see the module's docstring)."""
    seeded = dict(options, seed=HIDDEN_SEED + options["seed"])
    base = impl.cases(seeded)
    gen = torch.Generator().manual_seed(seeded["seed"])
    names = (f"H{i}" for i in range(1, 100))
    out = [dataclasses.replace(c, name=next(names), label=c.label, options=options)
           for c in base]
    regular = [c for c in base if c.kind == "regular" and c.dtype == torch.float64]
    for case in regular:
        for make in (_constant, _one_sample):
            new = make(case, "")
            if new is not None:
                out.append(new)
    if regular:
        new = _twice(max(regular, key=lambda c: (c.shape[0], len(c.shape))), "", gen)
        if new is not None:
            out.append(new)
    kept = []
    for case in out:
        if not case.name:
            case = dataclasses.replace(case, name=next(names), options=options)
        if _finite(impl, case):
            kept.append(case)
    return kept


def twice_the_samples(case: Case) -> Case | None:
    """``case`` with its batch twice as large (for the ``no-sample-loop`` rule), or
    ``None`` when the op has no batch."""
    return _twice(case, case.name + "2N", torch.Generator().manual_seed(HIDDEN_SEED))


__all__ = ["hidden_cases", "twice_the_samples", "HIDDEN_SEED"]
