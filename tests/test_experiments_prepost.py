"""normcore.experiments.prepost: Pre-LN against Post-LN, trained, with and without warm-up."""
from __future__ import annotations

import math

import pytest

from normcore.experiments import prepost, runner, sweeps
from normcore.experiments import transformer as tr
import itertools


@pytest.fixture(autouse=True)
def one_thread():
    with runner.one_thread():
        yield


def test_a_run_is_seeded_and_reports_the_loss_and_its_curve():
    kw = dict(placement="post", lr=0.01, warmup=5, M=2, steps=20, batch=16)
    a = prepost.train(3, **kw)
    assert a == prepost.train(3, **kw)                                     # bit for bit
    assert a != prepost.train(4, **kw)
    assert sorted(a) == ["loss@10", "loss@20", "test_accuracy", "test_loss", "train_loss"]
    assert all(math.isfinite(v) for v in a.values()) and 0 <= a["test_accuracy"] <= 1
    assert a["loss@10"] == round(a["loss@10"], 4)
    # the warm-up changes the run, the placement too; at step 0 the model is the same
    assert a != prepost.train(3, **{**kw, "warmup": 0})
    assert a != prepost.train(3, **{**kw, "placement": "pre"})


def test_the_curve_is_the_mean_batch_loss_of_each_window():
    losses: list[float] = []
    tr.train_model(3, "layer", "pre", steps=20, batch=16, lr=0.01, M=2, C=16, warmup=5,
                   losses=losses)
    a = prepost.train(3, "pre", 0.01, warmup=5, M=2, steps=20, batch=16)
    assert len(losses) == 20
    assert a["loss@10"] == round(sum(losses[:10]) / 10, 4)
    assert a["loss@20"] == round(sum(losses[10:]) / 10, 4)


def test_bad_arguments_say_what_to_change():
    with pytest.raises(ValueError, match="steps must be a multiple of 10"):
        prepost.train(0, "pre", 0.01, steps=25)
    with pytest.raises(ValueError, match=r"train_model: warmup must be from 0 .* got warmup=80"):
        prepost.train(0, "pre", 0.01, warmup=80, steps=80)
    with pytest.raises(ValueError, match="warmup must be from 0"):
        prepost.train(0, "pre", 0.01, warmup=-5, steps=20)
    with pytest.raises(ValueError, match="unknown placement 'middle'"):
        prepost.train(0, "middle", 0.01, steps=10)


def test_the_sweep_is_registered_and_its_results_load():
    sweep = sweeps.get("prepost")
    assert sweep.get_experiment() is prepost.TRAIN
    assert sweep.size() == (20, 10) and sweep.size(reduced=True) == (3, 5)
    lrs = sorted({c["lr"] for c in sweep.configs})
    assert len(lrs) == 5 and all(math.isclose(b / a, 2) for a, b in itertools.pairwise(lrs))
    assert {(c["placement"], c["warmup"]) for c in sweep.configs} == {
        ("pre", 0), ("pre", 20), ("post", 0), ("post", 20)}
    # the reduced sweep: Post-LN with and without warm-up, Pre-LN without, at one rate
    assert {c["lr"] for c in sweep.reduced_configs} == {0.01}
    res = sweeps.load_results("prepost")
    assert res.configs == sweep.configs and res.seeds == tuple(range(10))
    metrics = set(res.records[0][2])
    assert {"train_loss", "test_accuracy", "loss@10", "loss@80"} <= metrics
    iv = res.interval("train_loss", placement="pre", warmup=0, lr=0.0025)
    assert 0 < iv.mean < math.log(10)
