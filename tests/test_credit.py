"""Partial credit (normcore.exercises.credit): every op's properties, the property each
mistake breaks and what it hides (derived from the checker itself), the score of planted
grade rows, the rubrics' validation, and the chapters' rubrics."""
from __future__ import annotations

import csv
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_notebook

import test_exercises as student_style
from normcore import exercises
from normcore.classroom import MarkingError, read_exercises, student_notebook
from normcore.classroom.feedback import exercise_feedback
from normcore.classroom.grade import _row, write_csv
from normcore.classroom.marking import read_statements
from normcore.classroom.nosolutions import without_solutions
from normcore.classroom.record import STATUS, feedback_of
from normcore.exercises import credit as cr
from normcore.exercises.driver import _distinct_candidates
from normcore.exercises.ops import REGISTRY
from normcore.exercises.tolerance import prepare
from normcore.exercises.variants import all_close

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("0[1-9]_*.ipynb"))
WS_OPS = ("weight_standardize", "weight_standardize_backward", "fold_ws")


# =======================================================================================
# the properties and what breaks them
# =======================================================================================
def test_every_op_has_its_properties_in_words():
    assert set(cr.PROPERTIES) == set(REGISTRY)
    for op, props in cr.PROPERTIES.items():
        assert "shape" in props and len(props) >= 3, op
        for name, words in props.items():
            assert name in cr.NOUNS and name != cr.CORRECT, (op, name)
            assert isinstance(words, str) and len(words) > 15, (op, name)


@pytest.mark.parametrize("op", list(REGISTRY))
def test_every_mistake_breaks_one_property_of_its_op(op):
    keys = REGISTRY[op].misconceptions
    broken = {k: cr.breaks(op, k) for k in keys}
    assert all(p in cr.PROPERTIES[op] and p != "shape" for p in broken.values()), broken
    # and every property but the shape can be lost: otherwise it would be free points
    assert set(cr.PROPERTIES[op]) - {"shape"} == set(broken.values()), (op, broken)
    for key, hidden in cr.MASKS.get(op, {}).items():
        assert key in keys and set(hidden) <= set(cr.PROPERTIES[op]) - {broken[key]}


def test_breaks_names_what_is_missing():
    with pytest.raises(ValueError, match="no properties for op 'nope'"):
        cr.breaks("nope", "no_eps")
    with pytest.raises(ValueError, match="'momentum_swapped' breaks no property of"):
        cr.breaks("batch_norm", "momentum_swapped")


def _hidden(op: str, options: dict) -> set[tuple[tuple[str, ...], str]]:
    """``(keys, property)``: the properties the checker cannot verify next to a diagnosis
    (a single mistake, or a pair it can name).  A property is verified next to diagnosis D
    when every catalogued mistake V of that property that can be made together with D
    (they turn different knobs) changes D's numbers on the test sets; it is hidden when
    some such D + V gives D's numbers, or when D turns a knob that a one-knob mistake of
    the property turns (D decides that knob: ``other_convention`` moves eps), or when no
    mistake of the property can be made together with D."""
    impl = REGISTRY[op]
    parsed = impl.parse_options(options)
    cases, refs = prepare(impl, impl.cases(parsed))
    base = impl.base_spec(parsed)
    singles = list(_distinct_candidates(impl, base, cases, refs, parsed))
    cache: dict[str, list] = {}

    def outputs(var):   # a pair plus a third mistake comes up three times: once is enough
        spec = var.spec(base)
        key = repr(sorted(spec.items()))
        if key not in cache:
            cache[key] = [impl.evaluate(spec, c) for c in cases]
        return cache[key]

    diagnoses = list(singles)
    for i, (a, _) in enumerate(singles):
        for b, _ in singles[i + 1:]:
            if not a.knobs & b.knobs and not all_close(outputs(a + b), refs, cases):
                diagnoses.append((a + b, outputs(a + b)))
    hidden = set()
    for d, d_vals in diagnoses:
        lost = {cr.breaks(op, k) for k in d.keys}
        for prop in set(cr.PROPERTIES[op]) - lost - {"shape"}:
            of_prop = [v for v, _ in singles if cr.breaks(op, v.keys[0]) == prop]
            own_knobs = {k for v in of_prop if len(v.knobs) == 1 for k in v.knobs}
            together = [v for v in of_prop if not v.knobs & d.knobs]
            if d.knobs & own_knobs or not together or any(
                    all_close(outputs(d + v), d_vals, cases) for v in together):
                hidden.add((d.keys, prop))
    return hidden


@pytest.mark.parametrize("op", list(REGISTRY))
def test_masks_are_what_the_checker_cannot_tell(op):
    runs = [{"convention": c} for c in ("original", "bit", "timm")] if op in WS_OPS else [{}]
    hidden = set().union(*(_hidden(op, o) for o in runs))
    singles = {}
    for keys, prop in hidden:
        if len(keys) == 1:
            singles.setdefault(keys[0], set()).add(prop)
    assert singles == {k: set(v) for k, v in cr.MASKS.get(op, {}).items()}
    # a pair hides no more than its two mistakes do
    masks = cr.MASKS.get(op, {})
    for keys, prop in hidden:
        assert any(prop in masks.get(k, ()) for k in keys), (keys, prop)


# =======================================================================================
# the score
# =======================================================================================
BN3 = {"set": 1, "variance": 1, "eps+affine": 1}
BN4 = {"set": 1, "variance": 1, "eps": 1, "affine": 1}


def test_credit_follows_the_rule():
    assert cr.credit(BN3, "passed", (), "batch_norm") == (3, BN3)
    assert cr.credit(BN3, "pass") == (3, BN3)
    # eps outside the square root: the set and the variance were verified
    assert cr.credit(BN3, "misconception", ["eps_outside_sqrt"], "batch_norm") == (
        2, {"set": 1, "variance": 1, "eps+affine": 0})
    # two mistakes lose two properties
    assert cr.credit(BN4, "misconception", ("unbiased_var", "eps_outside_sqrt"),
                     "batch_norm") == (2, {"set": 1, "variance": 0, "eps": 0, "affine": 1})
    # a mistake that hides a property: the content's statistics as the style's
    adain = {"set": 1, "style": 1, "variance+eps": 1}
    assert cr.credit(adain, "misconception", ["adain_style_from_content"],
                     "adaptive_instance_norm")[0] == 0
    assert cr.credit(adain, "misconception", ["adain_batch_set"],
                     "adaptive_instance_norm")[0] == 2
    # wrong values of the right shape: only the shape's item
    shaped = {"shape": 1, "set": 1, "variance+eps+affine": 1}
    for status in ("unknown", "nan"):
        assert cr.credit(shaped, status) == (1, {"shape": 1, "set": 0,
                                                 "variance+eps+affine": 0})
        assert cr.credit(BN3, status)[0] == 0
    for status in ("shape", "dtype", "type", "exception", "not implemented", "error",
                   "timed out", "kernel died", "missing function", "missing", "unreadable",
                   "incorrect"):
        assert cr.credit(shaped, status)[0] == 0, status
    # all or nothing: a misconception earns nothing, whatever the op
    assert cr.credit({"correct": 2}, "misconception", ["no_eps"], "a_new_op") == (
        0, {"correct": 0})
    assert cr.credit({"set": 1, "correct": 1}, "misconception", ["no_eps"],
                     "batch_norm") == (1, {"set": 1, "correct": 0})


def test_credit_refuses_what_it_cannot_score():
    with pytest.raises(ValueError, match="unknown status 'pased'"):
        cr.credit(BN3, "pased")
    with pytest.raises(ValueError, match="give the mistake's keys and the op"):
        cr.credit(BN3, "misconception", (), "batch_norm")


def _verdict(label: str, report) -> dict:
    """What the grader records for ``report`` (:func:`normcore.classroom.record.verdict`)."""
    return {"label": label, "status": STATUS[report.kind], "kind": report.kind,
            "misconception": report.misconception,
            "misconceptions": list(report.misconceptions),
            "detail": " + ".join(exercises.CATALOGUE[k].title for k in report.misconceptions),
            **feedback_of(report)}


def _graded(label, op, fn, rubric, points, **options):
    """The grade row of a submission whose check gave ``exercises.check(op, fn)``."""
    ex = {"label": label, "points": points, "op": op, "function": "f", "options": "",
          "rubric": rubric}
    ran = {"labels": {}, "cells": {}, "timed_out": False, "died": None, "dead": None}
    if fn is not None:
        ran["labels"][label] = _verdict(label, exercises.check(op, fn, **options))
    else:   # the notebook's run never reached the check
        ran["dead"] = "the grading process failed"
    return _row("ann", "02_batch_norm", ex, new_notebook(), ran, set(), 60, 600)


def _stub(x, gamma, beta, eps):
    raise NotImplementedError()


def _doubled(x, gamma, beta, eps):
    return 2 * x


def _first_sample(x, gamma, beta, eps):
    return student_style.bn_correct(x, gamma, beta, eps)[:1]


PLANTED = [  # (function, rubric, score, the credit column)
    (student_style.bn_correct, BN3, 3, "set:1 variance:1 eps+affine:1"),
    (student_style.bn_eps_outside, BN3, 2, "set:1 variance:1 eps+affine:0"),
    (student_style.bn_unbiased, BN3, 2, "set:1 variance:0 eps+affine:1"),
    (student_style.bn_over_n_only, BN3, 2, "set:0 variance:1 eps+affine:1"),
    (student_style.bn_std_plus_eps, BN4, 2, "set:1 variance:0 eps:0 affine:1"),
    (student_style.bn_eps_outside, {"correct": 3}, 0, "correct:0"),
    (_stub, BN3, 0, "set:0 variance:0 eps+affine:0"),
    (_doubled, {"shape": 1, "set": 1, "variance+eps+affine": 1}, 1,
     "shape:1 set:0 variance+eps+affine:0"),
    (_first_sample, {"shape": 1, "set": 1, "variance+eps+affine": 1}, 0,
     "shape:0 set:0 variance+eps+affine:0"),
    (None, BN3, 0, "set:0 variance:0 eps+affine:0"),
]


@pytest.mark.parametrize("fn, rubric, score, text", PLANTED,
                         ids=[getattr(p[0], "__name__", "not graded") for p in PLANTED])
def test_planted_rows_score_the_verified_properties(fn, rubric, score, text):
    points = sum(rubric.values())
    row = _graded("ex-bn-forward", "batch_norm", fn, rubric, points)
    assert (row.score, row.credit) == (score, text), row
    assert row.points == points


def test_grade_sheet_and_feedback_show_the_credit(tmp_path):
    row = _graded("ex-bn-forward", "batch_norm", student_style.bn_eps_outside, BN3, 3)
    write_csv([row], tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv", newline="") as f:
        line = next(csv.DictReader(f))
    assert (line["score"], line["credit"]) == ("2", "set:1 variance:1 eps+affine:0")
    assert line["status"] == "misconception"
    text = "\n".join(exercise_feedback(row))
    words = " ".join(text.split())
    assert text.startswith("## ex-bn-forward: 2 of 3 points")
    assert "**Points by property:**" in text
    assert "- the set, 1 of 1 point (earned): reduces over the norm's set S_i" in words
    assert "- eps and the affine map, 0 of 1 point (lost): adds the eps argument" in words
    assert all(len(line) <= 80 for line in text.splitlines())
    # all or nothing: no list
    row = _graded("ex-bn-forward", "batch_norm", student_style.bn_eps_outside,
                  {"correct": 2}, 2)
    assert "Points by property" not in "\n".join(exercise_feedback(row))


# =======================================================================================
# rubrics in the statements
# =======================================================================================
def _chapter(rubric, points=2, op="batch_norm", label="ex-a"):
    from test_classroom import exercise_cells
    body = "    return x" if op else "### BEGIN SOLUTION\nx = 1\n### END SOLUTION"
    cells = exercise_cells(label, op, "f", body, points=points,
                           check=op is not None)
    if rubric is not None:
        cells[0].metadata["normcore"]["rubric"] = rubric
    return new_notebook(cells=cells)


@pytest.mark.parametrize("rubric, points, op, message", [
    ({"set": 1, "variance+eps+affine": 2}, 2, "batch_norm",
     r"exercise 'ex-a': the rubric's points add up to 3 \(1 \+ 2\) but the exercise has 2"),
    ({"set": 1, "varience+eps+affine": 1}, 2, "batch_norm",
     r"batch_norm has no property 'varience'; its properties are shape, set, variance"),
    ({"set": 1, "set+eps+affine+variance": 1}, 2, "batch_norm",
     r"property 'set' is in two rubric items"),
    ({"set": 1, "variance+eps": 1}, 2, "batch_norm",
     r"the rubric leaves out affine, which a mistake of batch_norm can break"),
    ({"set": 1.5, "variance+eps+affine": 0.5}, 2, "batch_norm", r"an int >= 1 of points"),
    ({"set": 0, "variance+eps+affine": 2}, 2, "batch_norm", r"an int >= 1 of points"),
    ({}, 2, "batch_norm", r"the rubric must be a dict"),
    (["set", "variance"], 2, "batch_norm", r"the rubric must be a dict"),
    ({"the idea": 1, "the algebra": 2}, 2, None, r"add up to 3 \(1 \+ 2\) but the exercise"),
])
def test_a_bad_rubric_is_refused(rubric, points, op, message):
    with pytest.raises(MarkingError, match=message):
        read_exercises(_chapter(rubric, points, op), "ch")


def test_a_rubric_reaches_the_student_and_the_manifest():
    rubric = {"variance+eps+affine": 1, "set": 1}
    ex, = read_exercises(_chapter(rubric), "ch")
    assert ex.rubric == rubric and ex.grading == rubric
    student = student_notebook(_chapter(rubric), "ch")
    entry, = student.metadata["normcore"]["classroom"]["exercises"]
    assert list(entry["rubric"].items()) == [("set", 1), ("variance+eps+affine", 1)]
    # without a rubric: all or nothing, and the heading says only the points
    ex, = read_exercises(_chapter(None), "ch")
    assert ex.rubric is None and ex.grading == {"correct": 2}
    assert cr.describe(ex.grading, 2, "batch_norm") == "2 points"
    assert cr.describe(rubric, 2, "batch_norm") == (
        "2 points: 1 for the set, 1 for the variance, eps and the affine map")


def test_a_copy_without_solutions_keeps_the_rubric():
    rubric = {"set": 1, "variance+eps+affine": 1}
    ex, = read_statements(without_solutions(_chapter(rubric)))
    assert (ex.rubric, ex.op, ex.points) == (rubric, "batch_norm", 2)


@pytest.fixture(scope="module")
def chapter_exercises():
    out = []
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        out += [(path.stem, ex) for ex in read_exercises(nb, path.name) if ex.op]
    return out


def test_every_coding_exercise_of_chapters_1_to_9_has_a_rubric(chapter_exercises):
    assert len(chapter_exercises) >= 20
    for chapter, ex in chapter_exercises:
        assert ex.rubric is not None, (chapter, ex.label)
        assert 2 <= ex.points <= 3 and 2 <= len(ex.rubric) <= 3, (chapter, ex.label)
        # no wrong answer scores every point, and some earn part of them
        scores = [cr.credit(ex.rubric, "misconception", [k], ex.op)[0]
                  for k in REGISTRY[ex.op].misconceptions]
        assert max(scores) < ex.points and max(scores) > 0, (ex.label, scores)
        assert cr.credit(ex.rubric, "passed")[0] == ex.points


def test_the_book_s_rubric_of_the_forward_pass():
    nb = nbformat.read(ROOT / "chapters" / "02_batch_norm.ipynb", as_version=4)
    ex = next(e for e in read_exercises(nb) if e.label == "ex-bn-forward")
    assert cr.credit(ex.rubric, "misconception", ["eps_outside_sqrt"], ex.op) == (
        1, {"set": 1, "variance+eps+affine": 0})
