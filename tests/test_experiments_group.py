"""normcore.experiments.group: the GroupNorm chapter's G sweep (data, net, one training run)."""
from __future__ import annotations

import math

import pytest
import torch

import normcore.experiments as experiments
from normcore import nn as ncnn
from normcore.experiments import group, runner
from normcore.experiments.runner import Experiment

SHORT = dict(steps=4, batch=8, n_test=64)        # a run of a few milliseconds


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as runner.run gives each run (more only contend on these tiny tensors)."""
    with runner.one_thread():
        yield


def test_stripes_are_seeded_images_of_four_classes():
    x, y = group.stripes(50, torch.Generator().manual_seed(0))
    assert x.shape == (50, 1, 8, 8) and x.dtype == torch.float32
    assert y.shape == (50,) and set(y.tolist()) <= set(range(group.NUM_CLASSES))
    x2, y2 = group.stripes(50, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_a_short_run_returns_finite_metrics():
    out = group.trained(seed=0, G=4, **SHORT)
    assert set(out) == {"test_loss", "test_accuracy"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.values())
    assert 0.0 <= out["test_accuracy"] <= 1.0 and out["test_loss"] > 0
    # the accuracy is a count over the 64 test images
    assert out["test_accuracy"] * 64 == round(out["test_accuracy"] * 64)


def test_the_same_seed_gives_the_same_numbers_and_another_seed_others():
    with torch.random.fork_rng(devices=[]):
        first = group.trained(seed=3, G=2, **SHORT)
        again = group.trained(seed=3, G=2, **SHORT)
        other = group.trained(seed=4, G=2, **SHORT)
    assert first == again
    assert other != first


def test_the_initial_weights_depend_on_the_seed_not_on_G():
    def weights(G):
        torch.manual_seed(7)
        return [p.detach().clone() for p in group.gn_cnn(G).parameters()]

    with torch.random.fork_rng(devices=[]):
        ones, per_channel = weights(1), weights(16)
    assert len(ones) == len(per_channel)
    assert all(torch.equal(a, b) for a, b in zip(ones, per_channel))
    gns = [m for m in group.gn_cnn(4).modules() if isinstance(m, ncnn.GroupNorm)]
    assert [m.num_groups for m in gns] == [4, 4, 4]


@pytest.mark.parametrize("G", [3, 0, 32])
def test_G_must_divide_the_width(G):
    with pytest.raises(ValueError, match=r"divisible by num_groups.*\[1, 2, 4, 8, 16\]"):
        group.trained(seed=0, G=G, **SHORT)
    with pytest.raises(ValueError, match="width=12"):
        group.gn_cnn(8, width=12)


def test_the_sweep_is_an_experiment_importable_by_name():
    assert experiments.group is group
    assert isinstance(group.SWEEP, Experiment)
    assert group.SWEEP.name == "group.sweep"
    assert group.SWEEP.target == "normcore.experiments.group:trained"
    assert "150" in group.SWEEP.held_equal
