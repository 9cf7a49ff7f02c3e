r"""Partial credit: what a correct answer has, which mistake breaks what, and the score.

A checker that names the mistake knows more than "wrong": a BatchNorm with eps added to the
std still reduces over the right set and still uses the biased variance.  This module turns
that knowledge into points.

Properties
----------
Each op has a few *properties*, things a correct answer does, named in words a student
understands (:data:`PROPERTIES`): ``"set"`` (reduces over the norm's set :math:`S_i`),
``"variance"`` (the biased variance, computed stably), ``"eps"`` (the eps argument under the
square root), ``"affine"`` (gamma and beta per channel), ``"dx"`` (the gradient's terms,
the paths through :math:`\mu` and :math:`\sigma^2`), ``"dparams"`` (the sums dgamma and
dbeta), ... and ``"shape"`` (the right shape and dtype), which every op has.

Every catalogue mistake an op can name breaks exactly one property of that op
(:data:`BREAKS`).  The mapping is one table here, not a field of
:class:`~.catalogue.Misconception`, for two reasons: a catalogue entry is shared by several
ops and the property it breaks depends on the op (``unbiased_var`` breaks BatchNorm's
``"variance"`` but, in ``fold_ws``, ``"ws"``, the standardization folded in;
``fold_no_sqrt`` breaks ``fold_bn``'s ``"scale"`` but ``fold_ws``'s ``"fold"``); and credit
is a grading policy, which the checker, the catalogue's other reader, does not need.  A test
checks that every key of every op maps to a property of that op.

Some mistakes also hide a property they do not break (:data:`MASKS`): with it made, the
checker cannot tell whether that property holds.  ``tests/test_credit.py`` derives each mask
from the checker itself.  A property P is *verified* next to a mistake D when every
catalogued mistake of P that can be made together with D (the two turn different knobs of
the op's reference) changes D's numbers on the test sets: then a student who had made it too
would have been told so.  P is hidden when one such mistake leaves D's numbers as they are
(without the square root, ``fold_no_sqrt``, eps inside or outside it is the same), when D
turns a knob that a one-knob mistake of P turns (``other_convention``, the other Weight
Standardization convention, is named as a mistake of the variance but moves eps too), or
when no mistake of P can be made together with D.

The rubric
----------
An exercise's statement says how its points split: ``"rubric": {"set": 1,
"variance+eps+affine": 1}`` in its metadata.  Each item names one property or several
joined by ``+`` (earned only if all of them are); the special item ``"correct"`` is earned
only by a correct answer.  :func:`validate` checks a rubric against its op and points:

* the items' points (ints >= 1) add up to the exercise's points;
* each property is one of the op's, and in one item at most;
* every property a mistake of the op can break is in an item, unless ``"correct"`` is (a
  property left out would let a wrong answer score every point).  ``"shape"``, which no
  named mistake breaks, may be left out: a property not listed earns nothing.

Without a rubric an exercise is all or nothing, ``{"correct": points}``
(:func:`default_rubric`).

The score
---------
:func:`credit` is pure: ``credit(rubric, status, keys, op) -> (score, {item: earned})``.
An item is earned when the checker *verified* every property in it:

* ``passed`` (``"pass"``): every item.  The answer matched the reference on every test set.
* ``misconception``: every item without a property that a named mistake (one, or a pair)
  breaks or masks.  The answer's numbers equal the reference's with that mistake's knobs
  turned and every other knob right, and a catalogued mistake of another, unmasked property
  would have changed them; the shape and dtype were checked before the values.
* ``incorrect`` because no known mistake matches (report kind ``"unknown"``, or ``"nan"``):
  only the items made of ``"shape"``.  The shape and dtype were checked; of the values, only
  that they are wrong is known.
* anything else (a wrong shape, dtype or type, an exception, the stub, a missing function,
  a time-out, a dead kernel, an unreadable or missing notebook, a grade sheet's
  ``incorrect`` without the report's kind): 0.  Nothing was verified.
"""
from __future__ import annotations

__all__ = ["PROPERTIES", "BREAKS", "MASKS", "NOUNS", "CORRECT", "credit", "validate",
           "default_rubric", "breaks", "items", "ordered", "describe", "item_words",
           "RubricError"]

#: The item earned only by a correct answer (the default rubric's one item).
CORRECT = "correct"

#: Each property's name in a few words, for the rubric's line in a statement
#: ("1 for the set, 1 for the variance, eps and the affine map").
NOUNS = {
    "shape": "the shape and dtype", "set": "the set", "variance": "the variance",
    "eps": "eps", "affine": "the affine map", "dx": "dx", "dparams": "dgamma/dbeta",
    "momentum": "the momentum", "scale": "the scale", "bias": "the bias",
    "mean": "the mean", "m2": "M2", "style": "the style's statistics",
    "rms": "the root mean square", "alpha": "alpha", "ws": "the standardization",
    "fold": "the folding", CORRECT: "a correct answer",
}

_SHAPE = "returns the right shape and dtype"
_VAR = "normalizes with the biased variance (divide by n), computed stably (not E[x^2] - E[x]^2)"
_EPS = "adds the eps argument under the square root: sqrt(var + eps)"
_AFFINE = "ends with gamma * x_hat + beta, gamma and beta per channel"


def _forward(set_words: str, affine: str = _AFFINE) -> dict:
    return {"shape": _SHAPE, "set": f"reduces over the norm's set S_i: {set_words}",
            "variance": _VAR, "eps": _EPS, "affine": affine}


def _backward(set_words: str, dparams: str) -> dict:
    return {"shape": _SHAPE,
            "set": f"takes the forward pass's statistics over its set: {set_words}",
            "variance": "takes the forward pass's biased variance (divide by n)",
            "dx": "dx has gamma and all three terms: dy, the path through the mean and the "
                  "path through the variance",
            "dparams": dparams}


_WS_FORWARD = {
    "shape": _SHAPE,
    "set": "standardizes each filter over its fan-in (C_in, kH, kW)",
    "variance": "uses the convention's variance (unbiased for 'original', biased for 'bit' "
                "and 'timm')",
    "eps": "puts the eps argument where the convention does (added to the std for "
           "'original', under the square root for 'bit' and 'timm')",
}

#: op -> {property: what a correct answer does}, in the order a feedback file lists them.
PROPERTIES: dict[str, dict[str, str]] = {
    "batch_norm": _forward("N and the spatial dims, one set per channel"),
    "layer_norm": _forward("every dim but the first, one set per sample",
                           "ends with gamma * x_hat + beta, gamma and beta of x.shape[1:]"),
    "instance_norm": _forward("the spatial dims, one set per sample and channel"),
    "group_norm": _forward("the C/G channels of a group (consecutive channels) and the "
                           "spatial dims, one set per sample and group"),
    "weight_standardize": _WS_FORWARD,
    "weight_standardize_backward": {
        **_WS_FORWARD,
        "dx": "dw has all three terms: dw_hat, the path through the filter's mean and the "
              "path through its std"},
    "running_update": {
        "shape": _SHAPE,
        "variance": "stores the unbiased batch variance (divide by n - 1), computed stably",
        "momentum": "weights the new batch statistic by momentum: "
                    "r <- (1 - momentum) r + momentum s"},
    "fold_bn": {
        "shape": _SHAPE,
        "scale": "scales each output channel by gamma / sqrt(running_var + eps)",
        "eps": "adds the eps argument under the square root",
        "bias": "folds the bias as (bias - running_mean) * scale + beta"},
    "chan_merge": {
        "shape": _SHAPE,
        "mean": "weights the two means by their counts",
        "m2": "adds the term of the means, delta^2 * n_a * n_b / n, to M2_a + M2_b"},
    "batch_norm_backward": _backward(
        "N and the spatial dims, per channel",
        "dgamma = sum(dy * x_hat) and dbeta = sum(dy), per channel"),
    "adaptive_instance_norm": {
        "shape": _SHAPE,
        "set": "takes both statistics per sample and channel, over the spatial dims",
        "variance": "uses the biased variance (divide by n)",
        "eps": "adds eps under the square root of both variances",
        "style": "normalizes the content with its own statistics, then gives it the style's "
                 "std and mean"},
    "layer_norm_shape": _forward(
        "the trailing dims that normalized_shape names, one set per leading index",
        "ends with gamma * x_hat + beta, gamma and beta of normalized_shape"),
    "layer_norm_backward": {
        "shape": _SHAPE,
        "set": "takes the forward pass's statistics over the dims of normalized_shape",
        "dx": "dx has gamma inside the sums and all three terms: dy * gamma, the path "
              "through the mean and the path through the variance",
        "dparams": "dgamma = sum(dy * x_hat) and dbeta = sum(dy) over the leading dims"},
    "rms_norm": {
        "shape": _SHAPE,
        "set": "reduces over the dims of normalized_shape",
        "rms": "divides by the root mean square, without subtracting the mean",
        "eps": "adds eps to the mean square, under the square root"},
    "fold_ws": {
        "shape": _SHAPE,
        "ws": "folds the standardized weight, standardized before BatchNorm scales it, with "
              "the convention's variance",
        "eps": "puts each eps where its formula does: eps_ws as the convention says, eps_bn "
               "under BatchNorm's square root",
        "fold": "scales by gamma / sqrt(running_var + eps_bn) and folds the bias as "
                "(bias - running_mean) * scale + beta"},
    "group_norm_backward": _backward(
        "the channels of a group (consecutive) and the spatial dims",
        "dgamma = sum(dy * x_hat) and dbeta = sum(dy), per channel"),
    "dyt": {
        "shape": _SHAPE,
        "alpha": "computes tanh(alpha * x): alpha inside the tanh",
        "affine": "applies gamma and beta along the channel axis"},
}

#: What a key breaks in most ops; :data:`_OWN` overrides it for some ops.
_COMMON = {
    "wrong_axes": "set", "group_size_as_num_groups": "set", "strided_groups": "set",
    "adain_batch_set": "set", "adain_layer_set": "set",
    "unbiased_var": "variance", "biased_var": "variance", "naive_var": "variance",
    "biased_running_var": "variance", "other_convention": "variance",
    "eps_outside_sqrt": "eps", "eps_inside_sqrt": "eps", "no_eps": "eps", "fixed_eps": "eps",
    "adain_style_no_eps": "eps", "rms_eps_outside": "eps",
    "no_affine": "affine", "affine_per_group": "affine", "affine_per_channel": "affine",
    "dyt_affine_wrong_axis": "affine",
    "backward_stats_constant": "dx", "backward_no_var_grad": "dx",
    "backward_no_mean_grad": "dx", "dx_without_gamma": "dx", "ln_backward_no_mean_grad": "dx",
    "ln_backward_no_var_grad": "dx", "ln_backward_gamma_outside": "dx",
    "ws_backward_stats_constant": "dx", "ws_backward_no_mean_grad": "dx",
    "ws_backward_no_std_grad": "dx",
    "dgamma_uses_x": "dparams", "affine_grad_per_group": "dparams",
    "momentum_swapped": "momentum",
    "fold_no_sqrt": "scale", "fold_no_mean": "bias", "fold_bias_unscaled": "bias",
    "chan_mean_unweighted": "mean", "chan_no_delta_term": "m2", "chan_delta_weight": "m2",
    "adain_style_from_content": "style", "adain_stats_swapped": "style",
    "rms_centered": "rms", "dyt_no_alpha": "alpha", "dyt_alpha_outside": "alpha",
}
#: op -> {key: property} where an op's property differs from :data:`_COMMON`'s.
_OWN = {
    "fold_ws": {"unbiased_var": "ws", "biased_var": "ws", "other_convention": "ws",
                "fold_ws_raw_weight": "ws", "fold_ws_bn_before_ws": "ws",
                "fold_no_sqrt": "fold", "fold_no_mean": "fold", "fold_bias_unscaled": "fold",
                "fold_bias_dropped": "fold"},
}

#: op -> {key: property}: the one property a catalogue key breaks in that op (the keys the
#: op can name are its ``Op.misconceptions``; a test checks each maps to one of its properties).
BREAKS: dict[str, dict[str, str]] = {op: {**_COMMON, **_OWN.get(op, {})} for op in PROPERTIES}

#: op -> {key: properties}: what a mistake hides besides the property it breaks, derived
#: from the checker and tested (``tests/test_credit.py``): with eps under no square root
#: (``fold_no_sqrt``) eps inside or outside it are the same; the content's own statistics
#: as the style's (``adain_style_from_content``) give back the content, whatever its set,
#: variance and eps; and so on.
MASKS: dict[str, dict[str, tuple[str, ...]]] = {
    "weight_standardize": {"other_convention": ("eps",)},
    "weight_standardize_backward": {"other_convention": ("eps",)},
    "fold_bn": {"fold_no_sqrt": ("eps",)},
    "adaptive_instance_norm": {"adain_style_from_content": ("set", "variance", "eps"),
                               "adain_stats_swapped": ("eps",)},
    "layer_norm_backward": {"wrong_axes": ("dx",)},
    "fold_ws": {"other_convention": ("eps",), "fold_no_sqrt": ("eps",),
                "fold_ws_raw_weight": ("eps",)},
    "group_norm_backward": {"wrong_axes": ("dx",)},
}


class RubricError(ValueError):
    """A rubric that does not fit its op or its points."""


def breaks(op: str, key: str) -> str:
    """The property of ``op`` that mistake ``key`` breaks."""
    if op not in PROPERTIES:
        raise ValueError(f"no properties for op {op!r}; ops with properties: "
                         f"{', '.join(PROPERTIES)}")
    table = BREAKS[op]
    if key not in table or table[key] not in PROPERTIES[op]:
        raise ValueError(f"mistake {key!r} breaks no property of {op!r}: add it to "
                         f"normcore.exercises.credit (_COMMON or _OWN)")
    return table[key]


def items(rubric: dict) -> dict[str, tuple[str, ...]]:
    """item -> the properties in it: ``"variance+eps"`` -> ``("variance", "eps")``."""
    return {item: tuple(p.strip() for p in item.split("+")) for item in rubric}


def ordered(rubric: dict, op: str | None) -> dict[str, int]:
    """``rubric`` with its items in the order of ``op``'s properties (of each item's first
    property), ``"correct"`` last: the order a statement, the grade sheet and a feedback
    file show (a notebook's metadata keeps its keys sorted by name)."""
    order = list(PROPERTIES.get(op, {})) + [CORRECT]
    rank = {item: (order.index(props[0]) if props[0] in order else len(order))
            for item, props in items(rubric).items()}
    return {item: rubric[item] for item in sorted(rubric, key=lambda i: (rank[i], i))}


def default_rubric(points: int) -> dict[str, int]:
    """All or nothing: every point on a correct answer."""
    return {CORRECT: points}


def validate(rubric, op: str | None, points: int) -> dict[str, int]:
    """``rubric`` checked against ``op`` (``None``: an exercise graded by hand, whose items
    are free text) and the exercise's ``points``; a :class:`RubricError` saying what is
    wrong and what to write instead."""
    if not isinstance(rubric, dict) or not rubric:
        raise RubricError(f"the rubric must be a dict of item -> points, e.g. "
                          f'{{"set": 1, "variance+eps": 1}}; got {rubric!r}')
    bad = {k: v for k, v in rubric.items()
           if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad:
        raise RubricError(f"each rubric item is a name with an int >= 1 of points; got "
                          f"{bad!r}")
    total = sum(rubric.values())
    if total != points:
        raise RubricError(f"the rubric's points add up to {total} "
                          f"({' + '.join(map(str, rubric.values()))}) but the exercise has "
                          f"{points}: make them equal")
    if op is None:
        return dict(rubric)
    if op not in PROPERTIES:
        raise RubricError(f"op {op!r} has no properties to give points for; ops with "
                          f"properties: {', '.join(PROPERTIES)}")
    known = PROPERTIES[op]
    seen: dict[str, str] = {}
    for item, props in items(rubric).items():
        for p in props:
            if p != CORRECT and p not in known:
                raise RubricError(f"rubric item {item!r}: {op} has no property {p!r}; its "
                                  f"properties are {', '.join(known)} (or {CORRECT!r})")
            if p in seen:
                raise RubricError(f"property {p!r} is in two rubric items, {seen[p]!r} and "
                                  f"{item!r}: give it to one")
            seen[p] = item
    if CORRECT not in seen:
        breakable = dict.fromkeys(BREAKS[op][k] for k in _keys(op))
        left = [p for p in breakable if p not in seen]
        if left:
            raise RubricError(
                f"the rubric leaves out {', '.join(left)}, which a mistake of {op} can break: "
                f"a wrong answer would score every point. Put each in an item (join "
                f"properties with '+', e.g. \"variance+eps\") or give points to "
                f"{CORRECT!r}")
    return dict(rubric)


def _keys(op: str) -> tuple[str, ...]:
    """The catalogue keys ``op`` can name (from the registered op)."""
    from .ops import REGISTRY
    return REGISTRY[op].misconceptions if op in REGISTRY else tuple(BREAKS[op])


#: Statuses (grade sheet) and report kinds that earn nothing: nothing was verified (or, for
#: "forbidden", the answer used what the exercise forbids).
_NOTHING = ("not implemented", "not_implemented", "error", "exception", "timed out",
            "kernel died", "missing function", "unreadable", "missing", "manual",
            "incorrect", "type", "shape", "dtype", "forbidden")
_PASSED = ("passed", "pass")
_SHAPE_ONLY = ("unknown", "nan")


def credit(rubric: dict, status: str, misconception_keys=(), op: str | None = None
           ) -> tuple[int, dict[str, int]]:
    """The score of an answer and the points of each rubric item, ``(score, {item:
    earned})``; the rule is the module's ("The score").  ``status`` is a grade sheet's
    status or a report's kind (``"unknown"`` and ``"nan"`` tell an incorrect answer whose
    shape was checked); ``misconception_keys`` the named mistake(s) and ``op`` their op,
    both needed only for a ``misconception``."""
    rubric = ordered(rubric, op)
    earned_items = items(rubric)
    if status in _PASSED:
        verified = None                               # everything
    elif status == "misconception" and set(rubric) == {CORRECT}:
        verified = set()                              # all or nothing: no property asked
    elif status == "misconception":
        keys = tuple(misconception_keys)
        if not keys or op is None:
            raise ValueError("credit(..., 'misconception', keys, op): give the mistake's "
                             f"keys and the op; got keys={keys!r}, op={op!r}")
        lost = set()
        for k in keys:
            lost.add(breaks(op, k))
            lost.update(MASKS.get(op, {}).get(k, ()))
        verified = set(PROPERTIES[op]) - lost
    elif status in _SHAPE_ONLY:
        verified = {"shape"}
    elif status in _NOTHING:
        verified = set()
    else:
        raise ValueError(f"credit: unknown status {status!r}; expected a grade sheet's "
                         f"status or a report's kind")
    out = {item: (rubric[item] if verified is None or set(props) <= verified else 0)
           for item, props in earned_items.items()}
    return sum(out.values()), out


def describe(rubric: dict, points: int | None = None, op: str | None = None) -> str:
    """The rubric in words, its items in ``op``'s order: ``"2 points: 1 for the set, 1 for
    the variance and eps"``; ``"2 points"`` for the all-or-nothing rubric."""
    rubric = ordered(rubric, op)
    total = sum(rubric.values()) if points is None else points
    head = f"{total} point{'' if total == 1 else 's'}"
    if set(rubric) == {CORRECT}:
        return head
    return f"{head}: {', '.join(f'{n} for {item_words(item)}' for item, n in rubric.items())}"


def item_words(item: str) -> str:
    """A rubric item in words: ``"variance+eps+affine"`` -> "the variance, eps and the affine
    map"."""
    words = [NOUNS.get(p, p) for p in items({item: 0})[item]]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
