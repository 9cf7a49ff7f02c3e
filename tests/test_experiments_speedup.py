"""normcore.experiments.speedup: the sigmoid MLP with and without BN (the papers' chapter)."""
from __future__ import annotations

import math

import pytest
import torch

from normcore import nn as ncnn
from normcore.experiments import runner, speedup
from normcore.experiments.runner import Experiment

SHORT = dict(steps=100, every=5)


@pytest.fixture(autouse=True)
def one_thread():
    with runner.one_thread():
        yield


def test_the_same_seed_draws_the_same_weights_with_and_without_bn():
    def linear_weights(bn):
        torch.manual_seed(4)
        return [m.weight.detach().clone() for m in speedup.mlp(bn) if isinstance(m, torch.nn.Linear)]

    with torch.random.fork_rng(devices=[]):
        plain, normed = linear_weights(False), linear_weights(True)
    assert len(plain) == len(normed) == 4
    assert all(torch.equal(a, b) for a, b in zip(plain, normed))
    layers = [type(m).__name__ for m in speedup.mlp(True)]
    assert layers == ["Linear", "BatchNorm1d", "Sigmoid"] * 3 + ["Linear"]
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in speedup.mlp(True)) == 3


def test_the_bn_layers_compute_normcores_batchnorm():
    torch.manual_seed(1)
    layer = speedup.mlp(True)[1]
    ours = ncnn.BatchNorm1d(100)
    x = torch.randn(60, 100, dtype=torch.float64)
    layer, ours = layer.double(), ours.double()
    assert torch.allclose(layer(x), ours(x), atol=1e-12)
    assert torch.allclose(layer.running_var, ours.running_var, atol=1e-15)


def test_the_kept_steps_are_dense_early_and_sparse_late():
    kept, spots = speedup.measured_steps(1500, 10)
    assert kept[:10] == list(range(10, 101, 10)) and kept[10:13] == [150, 200, 250]
    assert kept[-1] == 1500 and len(kept) == 10 + 28
    assert spots[:5] == [10, 20, 50, 100, 200] and spots[-1] == 1500 and len(spots) == 18
    assert set(spots) <= set(kept)


def test_a_short_run_returns_its_curves():
    out = speedup.trained(seed=0, bn=True, **SHORT)
    kept, spots = speedup.measured_steps(100, 5)
    assert [k for k in out if k.startswith("acc@")] == [f"acc@{t}" for t in kept]
    assert [k for k in out if k.startswith("q50@")] == ["q50@5", "q50@10", "q50@25", "q50@50",
                                                        "q50@100"] == [f"q50@{t}" for t in spots]
    assert all(math.isfinite(v) for v in out.values())
    for t in spots:
        assert out[f"q15@{t}"] <= out[f"q50@{t}"] <= out[f"q85@{t}"]
    assert out["final_accuracy"] == out["acc@100"]
    assert out["log2_steps_to"] == pytest.approx(math.log2(out["steps_to"]))
    spread = [out[f"q85@{t}"] - out[f"q15@{t}"] for t in (5, 100)]
    assert out["spread_change"] == pytest.approx(abs(math.log(spread[1] / spread[0])))


def test_steps_to_is_the_first_measured_step_at_the_threshold():
    """A threshold equal to a measured accuracy counts as reached there (>=, not >), and a
    threshold never reached gives steps + every."""
    never = speedup.trained(seed=0, bn=True, threshold=1.0, **SHORT)
    assert never["reached"] == 0.0 and never["steps_to"] == 105      # steps + every
    accs = [(int(k[4:]), v) for k, v in never.items() if k.startswith("acc@")]   # all kept
    for thr in sorted({a for _, a in accs if a > 0.15})[:3]:
        out = speedup.trained(seed=0, bn=True, threshold=thr, **SHORT)
        first = next(t for t, a in accs if a >= thr)
        assert out["steps_to"] == first and out["reached"] == 1.0


def test_the_percentiles_are_those_of_the_last_hidden_layers_input():
    """q50@t is the median over the test images of unit 0's input to the last sigmoid, BN
    normalizing with the test images' own statistics (training mode), recomputed here from a
    copy of the network trained the same way; the run's buffers are left as they were."""
    out = speedup.trained(seed=2, bn=True, steps=50, every=10)
    from normcore import datasets

    torch.manual_seed(2)
    net = speedup.mlp(True)
    opt = torch.optim.SGD(net.parameters(), lr=1.0)
    data = datasets.digits()
    gen = torch.Generator().manual_seed(1002)
    order = torch.randperm(len(data.y), generator=gen)
    for t in range(10):
        idx = order[60 * t:60 * (t + 1)]
        loss = torch.nn.functional.cross_entropy(net(data.x[idx].flatten(1)), data.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pre = net[:-2](data.x_test.flatten(1))[:, 0]          # still in training mode
        z = net[:-3](data.x_test.flatten(1))[:, 0]           # the last BN's input
    bn = net[-3]
    expected = bn.weight[0] * (z - z.mean()) / torch.sqrt(z.var(correction=0) + 1e-5) \
        + bn.bias[0]
    assert torch.allclose(pre, expected.detach(), atol=1e-5)
    assert out["q50@10"] == pytest.approx(float(torch.quantile(pre, 0.5)), abs=1e-6)
    assert out["q15@10"] == pytest.approx(float(torch.quantile(pre, 0.15)), abs=1e-6)


def test_measuring_in_training_mode_leaves_the_buffers_alone():
    torch.manual_seed(0)
    net = speedup.mlp(True)
    before = [b.clone() for b in net.buffers()]
    speedup._training_inputs(net, torch.rand(20, 64))
    assert all(torch.equal(a, b) for a, b in zip(before, net.buffers()))


def test_curve_reads_the_seeds_back():
    res = runner.run(speedup.TRAIN, [dict(bn=True, **SHORT)], seeds=[0, 1], progress=False,
                     workers=1)
    steps, values = speedup.curve(res, "acc", bn=True)
    assert steps == speedup.measured_steps(100, 5)[0] and all(len(v) == 2 for v in values)
    assert values[-1] == res.values("acc@100", bn=True)
    with pytest.raises(KeyError, match="no metric 'loss'"):
        speedup.curve(res, "loss", bn=True)


@pytest.mark.parametrize("kw, match", [
    (dict(steps=25, every=10), "multiples of every"),
    (dict(steps=120, every=10), "steps of sparse"),
    (dict(threshold=1.5), "threshold is an accuracy"),
    (dict(unit=100), "unit must index"),
    (dict(steps=0), "positive int"),
])
def test_bad_arguments_are_refused(kw, match):
    args = {**SHORT, **kw}
    with pytest.raises(ValueError, match=match):
        speedup.trained(seed=0, bn=False, **args)


def test_the_experiment_is_importable_by_name():
    assert isinstance(speedup.TRAIN, Experiment)
    assert speedup.TRAIN.target == "normcore.experiments.speedup:trained"
