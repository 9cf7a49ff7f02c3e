r"""Exercise checkers: run a student's function next to the reference and name the mistake.

A checker does not only say "wrong".  It reruns the computation the way common mistakes
would do it, and tells the student *which* mistake their numbers show::

    >>> from normcore import exercises
    >>> def my_bn(x, gamma, beta, eps):
    ...     dims = [0] + list(range(2, x.dim()))
    ...     mean = x.mean(dim=dims, keepdim=True)
    ...     var = x.var(dim=dims, keepdim=True)          # unbiased by default!
    ...     shape = [1, -1] + [1] * (x.dim() - 2)
    ...     return gamma.view(shape) * (x - mean) / torch.sqrt(var + eps) + beta.view(shape)
    >>> print(exercises.check("batch_norm", my_bn))          # doctest: +SKIP
    batch_norm: not correct. Diagnosis: unbiased variance in the normalization [unbiased_var]
    What you did: You normalized with the unbiased variance, dividing the sum of squared
      deviations by n - 1 (torch.var and torch.std do this unless told otherwise).
    Why it is wrong: BatchNorm normalizes with the biased variance, the plain mean of the
      squared deviations (divide by n): it describes the values being normalized. The
      unbiased (n - 1) variance only goes into running_var, as an estimate for eval mode.
      The difference is largest for small sets: for n = 4 the unbiased std is 15% larger
      (sqrt(4/3)), so the output is 13% too small (sqrt(3/4)).
    What to change: Use `x.var(dim=..., unbiased=False)` (or `correction=0`), or
      `((x - mean) ** 2).mean(dim=...)`.
    Largest error: 0.309 in set A (x of shape (4, 3), float64), at sample 3, channel 2.

How it works
------------
1. :func:`check` builds a few seeded inputs (*test sets*), chosen so that the mistakes
   separate: small sets (biased and unbiased variance differ by 15% for n = 4), channels with
   different means and scales (reducing over the wrong axes changes the numbers), one set
   with a nearly constant channel and a large ``eps`` (only there does ``eps`` matter), and
   one float32 set with a large mean and a small spread (only there does
   :math:`E[x^2]-E[x]^2` fail).
2. It calls the student's function and the reference (:mod:`normcore.functional`, in
   float64) on each, and reports an exception, a wrong type, shape or dtype, or NaN before
   comparing values.  Each float32 set's tolerance is derived from the float32 error of
   torch's own kernel on it (:mod:`.tolerance`), so that calling torch's op, or writing the
   formula in float32, passes.
3. If the values differ, it evaluates every entry of the *catalogue* of known mistakes on the
   same inputs, and reports the one the student's output matches (then every pair of them,
   since "unbiased variance **and** eps outside the square root" is one line,
   ``(x - m) / (x.std(0) + eps)``).

The catalogue is not a second implementation of the norms.  Each mistake is a change of
one knob of the primitives: another reduce set (a :class:`~normcore.axes.Layout` from
:func:`normcore.axes.layout` with other ``reduce_dims``, or another norm's layout),
``correction`` and ``eps_mode`` of :func:`normcore.functional.normalize`, the variance from
:func:`normcore.stats.var_naive`, the running update from :func:`normcore.stats.ema_update_`
with the factor swapped, or autograd through ``normalize`` with the statistics detached.

Operations and the student's function
-------------------------------------
===============================  =============================================================
op                               the student writes
===============================  =============================================================
``batch_norm``                   ``f(x, gamma, beta, eps) -> y``; training mode (batch
                                 statistics); ``x`` is ``(N, C)``, ``(N, C, L)`` or
                                 ``(N, C, H, W)``; gamma, beta ``(C,)``
``layer_norm``                   ``f(x, gamma, beta, eps) -> y``; over every dim but the first;
                                 gamma, beta have shape ``x.shape[1:]``
``instance_norm``                ``f(x, gamma, beta, eps) -> y``; ``x`` is ``(N, C, L)`` or
                                 ``(N, C, H, W)``; gamma, beta ``(C,)``
``group_norm``                   ``f(x, num_groups, gamma, beta, eps) -> y``; ``x`` is
                                 ``(N, C, *)``; gamma, beta ``(C,)``
``running_update``               ``f(running_mean, running_var, x, momentum) ->
                                 (new_running_mean, new_running_var)``: BatchNorm's buffers
                                 in training (unbiased variance stored,
                                 ``r <- (1 - m) r + m s``); ``x`` is ``(N, C)`` or ``(N, C, H, W)``
``batch_norm_backward``          ``f(dy, x, gamma, eps) -> (dx, dgamma, dbeta)`` of training-mode
                                 BatchNorm
``group_norm_backward``          ``f(dy, x, num_groups, gamma, eps) -> (dx, dgamma, dbeta)`` of
                                 GroupNorm; ``x`` is ``(N, C, *)``, gamma ``(C,)``
``weight_standardize``           ``f(w, eps) -> w_hat`` for a conv weight ``(C_out, C_in, kH, kW)``;
                                 option ``convention=`` ``"original"`` (default), ``"bit"`` or
                                 ``"timm"`` (:data:`normcore.functional.WS_CONVENTIONS`)
``fold_bn``                      ``f(weight, bias, gamma, beta, running_mean, running_var, eps) ->
                                 (weight, bias)``: a ``Linear``/``ConvNd`` with an eval-mode
                                 BatchNorm folded in (:func:`normcore.fold.fold_bn`)
``chan_merge``                   ``f(count_a, mean_a, m2_a, count_b, mean_b, m2_b) -> (mean, m2)``:
                                 Chan's merge of two parts (:func:`normcore.stats.chan_merge`)
``weight_standardize_backward``  ``f(dw_hat, w, eps) -> dw``: the gradient through
                                 ``weight_standardize``, for its weights and its option
                                 ``convention=``
``fold_ws``                      ``f(weight, bias, eps_ws, gamma, beta, running_mean, running_var,
                                 eps_bn) -> (weight, bias)``: a WS ``Conv2d`` (option
                                 ``convention=``) and an eval-mode BatchNorm folded into one
                                 plain ``Conv2d`` (:func:`normcore.fold.fold_ws`, ``fold_bn``)
``dyt``                          ``f(x, alpha, gamma, beta, channels_last) -> y``: Dynamic Tanh,
                                 ``gamma * tanh(alpha * x) + beta`` with alpha ``(1,)``, gamma,
                                 beta ``(C,)`` on the last dim (``channels_last=True``) or on
                                 dim 1 of ``(N, C, *)`` (:func:`normcore.functional.dyt`)
===============================  =============================================================

Options of :func:`check`: ``seed`` (default 0) changes the inputs; ``ndims`` restricts the
input ranks (e.g. ``ndims=(4,)`` for an exercise that only asks for ``(N, C, H, W)``);
``convention`` for ``weight_standardize``, ``weight_standardize_backward`` and ``fold_ws``;
``hidden=True`` runs the grader's hidden sets instead of the notebook's (other seeds, a
constant set, one sample, twice the samples: :mod:`.hidden`); ``rules`` names what the
exercise forbids (``"no-autograd"``, ``"no-torch-norms"``, ``"no-normcore"``, ...:
:mod:`.rules`), and a function that uses it fails as ``forbidden``, whatever its numbers.

The report prints as plain text and is deterministic (no addresses, no timings, numbers
rounded to three significant digits), so notebooks can show it under nbval.

The package
-----------
==========================  =============================================================
module                      what it holds
==========================  =============================================================
:mod:`.catalogue`           the known mistakes as data: key, plain-words name, prose
:mod:`.report`              :class:`Report` and the text formatting
:mod:`.inputs`              the seeded test sets (:class:`~.inputs.Case`)
:mod:`.tolerance`           each set's tolerance, from torch's float32 error on it
:mod:`.hidden`              the hidden sets (``check(..., hidden=True)``)
:mod:`.rules`               what an exercise forbids, and :func:`~.rules.watch`, which sees it
:mod:`.variants`            a mistake as the reference with knobs turned
                            (:class:`~.variants.Variant`); the wrong reduce sets
:mod:`.ops`                 :class:`~.ops.Op`, the hooks an op implements (documented
                            there), and the registry
:mod:`.driver`              :func:`check`, in three steps that the classroom's grader runs
                            in two processes: :func:`~.driver.plan` (the sets and references),
                            :func:`~.driver.collect` (the student's function on them: the only
                            step that runs student code), :func:`~.driver.judge` (the report)
:mod:`.instructor`          :func:`catalogue`, :func:`catalogue_table`, :func:`signature`,
                            :func:`reference`
:mod:`.forward`             ops ``batch_norm``, ``layer_norm``, ``instance_norm``,
                            ``group_norm``
:mod:`.ws`                  ops ``weight_standardize``, ``weight_standardize_backward``
:mod:`.running`             ops ``running_update``, ``fold_bn``, ``chan_merge``
:mod:`.backward`            op ``batch_norm_backward``
:mod:`.adain`               op ``adaptive_instance_norm`` (the InstanceNorm chapter)
:mod:`.ws_fold`             op ``fold_ws`` (WS and BatchNorm folded for inference)
:mod:`.group`               op ``group_norm_backward`` (the GroupNorm chapter)
:mod:`.dyt`                 op ``dyt`` (Dynamic Tanh, the chapter without normalization)
:mod:`.credit`              partial credit: each op's properties of a correct answer, the
                            one each mistake breaks, rubrics and :func:`~.credit.credit`
==========================  =============================================================

The seam
--------
The package has one seam: **an op** (:class:`~.ops.Op`, one subclass per op, one module per
family of ops, registered by :func:`.ops.register`) against **the kit** every op shares
(:mod:`.inputs`, :mod:`.variants`, :mod:`.tolerance`, :mod:`.hidden`, :mod:`.rules`,
:mod:`.report`, :mod:`.catalogue`) and **the driver** that runs any op through its hooks
(:mod:`.driver`).  Everything an op knows of its exercise (its sets, its reference, its
mistakes as knobs, the words of its reports) sits in its hooks; nothing op-specific sits in
the kit or the driver, and an op's module reaches no other op's module except to reuse a
whole op (``backward`` subclasses nothing of ``forward``; it reads its prose table
``NORM_WHY``).  Values an op's ``context`` hook computes for its own ``render_fields`` (the
layout of its sets) travel in the context under keys starting with ``_``, which no catalogue
template names.  :mod:`.credit` is grading policy on top (which property each mistake
breaks), not part of checking.

Adding an op family (a chapter's exercises)
-------------------------------------------
Add one module, ``normcore/exercises/<family>.py``, and its name to ``FAMILIES`` below:

1. subclass :class:`~.ops.Op`: set ``name`` (the first argument of :func:`check`),
   ``abbr`` (its column in the catalogue table), ``call_text`` (the student's signature),
   ``outputs``, ``ndims_allowed``/``ndims_default``, and ``misconceptions`` (the catalogue
   keys it can name); implement the hooks marked *required* in :class:`~.ops.Op`
   (``cases``, ``solution``, ``call``, ``base_spec``, ``candidates``, ``evaluate``) and,
   for the prose, ``context`` and ``render_fields``; ``torch_kernels`` if torch has the op
   (its float32 error sets the tolerance); build inputs with :mod:`.inputs` and
   mistakes with :func:`.variants.variant` and :func:`.variants.role_variants`;
2. reuse catalogue entries by listing their keys; add the family's own mistakes with
   ``catalogue.add(Misconception(key, title, description, did, why, fix))`` in the module;
3. call :func:`.ops.register` on an instance at the end of the module.

``tests/test_exercises.py`` then checks the new op too: its reference passes, and each of
its variants is diagnosed as itself (``test_every_variant_is_diagnosed_as_itself``); add
one student-style function per new mistake to its ``DIAGNOSES`` list, and the op's literal
float32 answers (torch's op, the formula in plain torch) to ``LITERAL`` in
``tests/test_exercises_tolerance.py``.
"""
from __future__ import annotations

import importlib

from .catalogue import CATALOGUE, Misconception
from .driver import check
from .instructor import catalogue, catalogue_table, print_catalogue, reference, signature
from .ops import REGISTRY as _OPS
from .report import Report

#: The op families, one module each, in the order they register (the order of the ops in
#: the catalogue table).  A new chapter's ops: add its module here.
FAMILIES = ("forward", "ws", "running", "backward", "adain", "layer", "ws_fold",
            "group", "dyt")
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
del _family

#: op name -> the student's call signature.
OPS: dict[str, str] = {name: impl.call_text for name, impl in _OPS.items()}

__all__ = [
    "check", "Report", "Misconception", "CATALOGUE", "OPS", "catalogue", "catalogue_table",
    "print_catalogue", "reference", "signature",
]
