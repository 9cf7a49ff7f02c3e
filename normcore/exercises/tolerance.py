r"""How close is "correct": each test set's tolerance, derived from torch's own rounding.

A float32 answer cannot match the exact result to the last digit, and how far off a correct
one is depends on the input: on the *large-mean* sets (values near 4096 with a spread of
about 0.4) torch's own float32 kernels (``layer_norm``, ``group_norm``, ``batch_norm``,
``instance_norm``) are off by :math:`10^{-4}` to a few :math:`10^{-3}` on outputs of size 1
to 4 (:func:`measure`), while a two-pass formula is off by less than :math:`10^{-6}`.  A
fixed tolerance either fails a student who calls torch's op exactly as the statement asks,
or is loose everywhere.  So each set gets its own:

1. **The reference is computed in float64.**  For a set in float64 it is the op's
   :meth:`~normcore.exercises.ops.Op.solution` on the set; for a float32 set it is the same
   solution on a float64 copy of the set's tensors (:func:`as_float64`): the exact answer,
   up to float64's own rounding.
2. **The float32 error of the correct computations on that set** is measured against it:

   .. math::

       e_o = \max_{k} \max_j \big| k_o(\text{set})_j - \text{ref}_o(\text{set})_j \big|

   for every output :math:`o` and every kernel :math:`k` of
   :meth:`~normcore.exercises.ops.Op.torch_kernels` (torch's own ``torch.nn.functional``
   op in the set's dtype, or autograd through it, in every form the statements allow) and
   the op's solution run in the set's dtype (the package's two-pass formula).
3. **The tolerance** of output :math:`o` on that set is ``rtol = RTOL`` and

   .. math::

       \text{atol}_o = \max(\texttt{ATOL},\ \texttt{FACTOR}\cdot e_o),

   a student's value :math:`a` matching the reference :math:`b` when
   :math:`|a - b| \le \text{atol}_o + \text{rtol}\,|b|` (:func:`torch.isclose`).  ``FACTOR``
   (4) leaves room for a reading of the statement with other torch calls than the ones
   measured (``var_mean`` and ``rsqrt``, a view of another shape); the floor ``ATOL`` =
   ``RTOL`` = :math:`10^{-4}` is the tolerance the checkers had before, where torch's error
   is far below it (every set but the large-mean ones).  Sets in float64 keep ``rtol`` =
   :math:`10^{-6}`, ``atol`` = :math:`10^{-8}` (:data:`normcore.exercises.variants.TOLERANCE`).

Because the error is measured when :func:`normcore.exercises.check` runs, on the machine that
runs it, the tolerance follows torch's kernels there (their rounding depends on the CPU's
vector width, ``ATEN_CPU_CAPABILITY``).  The known mistakes stay far outside it: the mistake
the large-mean sets are for, :math:`E[x^2]-E[x]^2`, is off by whole units there, and every
other mistake is told apart on the float64 sets, whose tolerance does not change.
:func:`measure` lists, per set, torch's error and the tolerance it gives.
"""
from __future__ import annotations

import dataclasses

import torch

from .inputs import Case
from .ops import get_op
from .variants import TOLERANCE

#: The tolerance is FACTOR times the largest float32 error of a correct computation ...
FACTOR = 4.0
#: ... and never below these (the checkers' former float32 tolerance).
ATOL = 1e-4
RTOL = 1e-4


def as_float64(case: Case) -> Case:
    """``case`` with every floating tensor of its arguments in float64."""
    args = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in case.args.items()}
    return dataclasses.replace(case, args=args, dtype=torch.float64)


def _error(outs, ref) -> list[float]:
    errs = []
    for t, r in zip(outs, ref):
        diff = (t.double() - r.double()).abs()
        diff = diff[torch.isfinite(diff)]
        errs.append(float(diff.max()) if diff.numel() else 0.0)
    return errs


def kernel_errors(impl, case: Case, ref) -> dict[str, list[float]]:
    """Each correct computation's largest error per output on ``case`` against ``ref``:
    ``"torch"`` (the largest over :meth:`Op.torch_kernels`, absent when torch has no
    kernel for the op) and ``"solution"`` (the op's solution in the set's dtype)."""
    out = {}
    kernels = impl.torch_kernels(case)
    if kernels:
        per = [_error(k, ref) for k in kernels]
        out["torch"] = [max(col) for col in zip(*per)]
    out["solution"] = _error(impl.reference(case), ref)
    return out


def prepare(impl, cases: list[Case]) -> tuple[list[Case], list[tuple]]:
    """The sets with their :attr:`Case.tolerance` filled in, and the references (float64)."""
    out, refs = [], []
    for case in cases:
        if case.dtype == torch.float64:
            ref = impl.reference(case)
            tol = (TOLERANCE[torch.float64],) * len(ref)
        else:
            ref = impl.reference(as_float64(case))
            errs = kernel_errors(impl, case, ref)
            worst = [max(col) for col in zip(*errs.values())]
            tol = tuple((RTOL, max(ATOL, FACTOR * e)) for e in worst)
        out.append(dataclasses.replace(case, tolerance=tol))
        refs.append(ref)
    return out, refs


def measure(op: str, **options) -> list[dict]:
    """Per test set of ``op`` that is not float64: its name and kind, torch's float32 error
    (``None`` when torch has no kernel for the op), the package's own, and the tolerance
    ``atol`` per output (``check``'s options)."""
    impl = get_op(op)
    parsed = impl.parse_options(options)
    cases, refs = prepare(impl, impl.cases(parsed))
    rows = []
    for case, ref in zip(cases, refs):
        if case.dtype == torch.float64:
            continue
        errs = kernel_errors(impl, case, ref)
        rows.append({"set": case.name, "kind": case.kind, "torch": errs.get("torch"),
                     "solution": errs["solution"], "atol": [a for _, a in case.tolerance]})
    return rows
