"""normcore.experiments.renorm (Batch Renorm) and normcore.experiments.minibatch (the CNN of
the papers' chapter: ghost batches, class-sorted batches, one training run)."""
from __future__ import annotations

import math

import pytest
import torch

from normcore import functional as F
from normcore import nn as ncnn
from normcore.experiments import minibatch as mb
from normcore.experiments import renorm, runner
from normcore.experiments.runner import Experiment

f64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    with runner.one_thread():
        yield


# --- Batch Renorm -------------------------------------------------------------------------

def _inputs(shape=(6, 3, 5), seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (2.0 + 3.0 * torch.randn(shape, generator=gen, dtype=f64)).requires_grad_()
    w = torch.randn(shape[1], generator=gen, dtype=f64).requires_grad_()
    b = torch.randn(shape[1], generator=gen, dtype=f64).requires_grad_()
    return x, w, b


@pytest.mark.parametrize("shape", [(6, 3), (6, 3, 5)])
def test_batch_renorm_with_rmax_1_and_dmax_0_is_batchnorm_in_training(shape):
    """Algorithm 1 with r clipped to [1, 1] and d to [0, 0]: BN's output and gradients,
    whatever the running buffers hold."""
    x, w, b = _inputs(shape)
    mean = torch.tensor([5.0, -1.0, 0.3], dtype=f64)      # far from the batch's
    std = torch.tensor([0.2, 4.0, 1.0], dtype=f64)
    y = renorm.batch_renorm(x, mean.clone(), std.clone(), w, b, training=True, r_max=1.0,
                            d_max=0.0)
    ref = torch.nn.functional.batch_norm(x, None, None, w, b, training=True)
    assert torch.allclose(y, ref, atol=1e-12)
    dy = torch.randn(shape, dtype=f64, generator=torch.Generator().manual_seed(1))
    ours = torch.autograd.grad(y, (x, w, b), dy)
    theirs = torch.autograd.grad(ref, (x, w, b), dy)
    assert all(torch.allclose(p, q, atol=1e-12) for p, q in zip(ours, theirs))


def test_batch_renorm_unclipped_trains_with_the_inference_function():
    """With bounds that do not bind, a training step's output is what inference with the
    buffers (before the step's update) computes; the gradient is not inference's (r and d
    are constants, the batch statistics are not)."""
    x, w, b = _inputs()
    mean, std = torch.tensor([1.5, 2.5, 2.0], dtype=f64), torch.tensor([2.0, 3.5, 2.5], dtype=f64)
    infer = renorm.batch_renorm(x, mean, std, w, b, training=False)
    rm, rs = mean.clone(), std.clone()
    y = renorm.batch_renorm(x, rm, rs, w, b, training=True, r_max=100.0, d_max=100.0)
    assert torch.allclose(y, infer, atol=1e-10)
    # the buffers moved towards the batch: mu_B and sigma_B = sqrt(var_B + eps)
    var_b, mu_b = torch.var_mean(x.detach(), dim=(0, 2), correction=0)
    assert torch.allclose(rm, mean + 0.1 * (mu_b - mean))
    assert torch.allclose(rs, std + 0.1 * (torch.sqrt(var_b + 1e-5) - std))
    gx = torch.autograd.grad(y.sum() + (y ** 2).sum(), x)[0]
    gi = torch.autograd.grad(infer.sum() + (infer ** 2).sum(), x)[0]
    assert not torch.allclose(gx, gi)
    # the gradient sums to zero over each channel's batch, as BN's does
    assert torch.allclose(gx.sum(dim=(0, 2)), torch.zeros(3, dtype=f64), atol=1e-9)


def test_batch_renorm_clips_r_and_d():
    x, _, _ = _inputs()
    x = x.detach()
    var_b, mu_b = torch.var_mean(x, dim=(0, 2), correction=0)
    sigma_b = torch.sqrt(var_b + 1e-5)
    mean, std = mu_b + 10 * sigma_b, 100 * sigma_b        # r = 0.01, d = -0.1: r clipped
    y = renorm.batch_renorm(x, mean.clone(), std.clone(), training=True, r_max=3.0, d_max=0.05)
    xhat = (x - mu_b.view(1, 3, 1)) / sigma_b.view(1, 3, 1)
    assert torch.allclose(y, xhat / 3.0 - 0.05, atol=1e-12)


def test_batch_renorm_refuses_bad_bounds_and_shapes():
    x, _, _ = _inputs()
    buf = torch.zeros(3, dtype=f64), torch.ones(3, dtype=f64)
    with pytest.raises(ValueError, match="r_max >= 1 and d_max >= 0"):
        renorm.batch_renorm(x, *buf, training=True, r_max=0.5)
    with pytest.raises(ValueError, match=r"buffers of shape \(C,\)"):
        renorm.batch_renorm(x, torch.zeros(4, dtype=f64), buf[1])


def test_the_schedule_starts_as_batchnorm_and_reaches_the_bounds():
    assert renorm.schedule(0, 1000) == (1.0, 0.0)
    assert renorm.schedule(50, 1000) == (1.0, 0.0)           # plain BN for 5% of the run
    r, d = renorm.schedule(125, 1000)
    assert 1.0 < r < 3.0 and d == pytest.approx(2.5)
    assert renorm.schedule(200, 1000)[1] == 5.0 and renorm.schedule(200, 1000)[0] < 3.0
    assert renorm.schedule(300, 1000) == (3.0, 5.0) == renorm.schedule(999, 1000)


def test_the_layer_follows_its_bounds_and_mode():
    layer = renorm.BatchRenorm1d(3).double()
    x, _, _ = _inputs()
    assert torch.allclose(layer(x), torch.nn.functional.batch_norm(x, None, None, training=True))
    layer.eval()
    assert torch.allclose(layer(x), (x - layer.running_mean.view(1, 3, 1))
                          / layer.running_std.view(1, 3, 1))


# --- ghost batches --------------------------------------------------------------------------

def test_a_ghost_batch_of_the_whole_batch_is_batchnorm():
    """normcore's BatchNorm1d, in float64: output, buffers, eval mode and gradients."""
    x = torch.randn(8, 4, 5, generator=torch.Generator().manual_seed(2), dtype=f64)
    x.requires_grad_()
    ghost, bn = mb.GhostBatchNorm1d(4, 8, 8).double(), ncnn.BatchNorm1d(4, dtype=f64)
    y, ref = ghost(x), bn(x)
    assert torch.allclose(y, ref, atol=1e-12)
    dy = torch.randn(8, 4, 5, generator=torch.Generator().manual_seed(3), dtype=f64)
    assert torch.allclose(torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(ref, x, dy)[0],
                          atol=1e-12)
    assert torch.allclose(ghost.running_mean, bn.running_mean, atol=1e-15)
    assert torch.allclose(ghost.running_var, bn.running_var, atol=1e-15)
    ghost.eval(), bn.eval()
    assert torch.allclose(ghost(x), bn(x), atol=1e-12)


def test_a_ghost_batch_renorm_of_the_whole_batch_is_batch_renorm():
    x = torch.randn(8, 4, 5, generator=torch.Generator().manual_seed(5), dtype=f64)
    ghost = mb.GhostBatchNorm1d(4, 8, 8, renorm=True).double()
    plain = renorm.BatchRenorm1d(4).double()
    for bounds in [(1.0, 0.0), (2.0, 0.5)]:
        ghost.set_bounds(*bounds), plain.set_bounds(*bounds)
        for _ in range(2):
            assert torch.allclose(ghost(x), plain(x), atol=1e-12)
    assert torch.allclose(ghost.running_std, plain.running_std)
    ghost.eval(), plain.eval()
    assert torch.allclose(ghost(x), plain(x), atol=1e-12)


def test_each_ghost_batch_is_normalized_alone():
    x = torch.randn(8, 4, 5, generator=torch.Generator().manual_seed(3), dtype=f64)
    ghost = mb.GhostBatchNorm1d(4, 2, 8).double()
    y = ghost(x)
    means, variances = [], []
    for p in range(4):
        part = x[2 * p:2 * p + 2]
        assert torch.allclose(y[2 * p:2 * p + 2], F.batch_norm(part, None, None, training=True))
        var, mean = torch.var_mean(part, dim=(0, 2), correction=1)
        means.append(mean), variances.append(var)
    # the shared buffers move by the mean of what each ghost batch would move them by
    assert torch.allclose(ghost.running_mean, 0.1 * torch.stack(means).mean(0))
    assert torch.allclose(ghost.running_var, 0.9 + 0.1 * torch.stack(variances).mean(0))
    ghost.eval()
    mean, var = ghost.running_mean, ghost.running_var
    assert torch.allclose(ghost(x), (x - mean.view(1, 4, 1)) / torch.sqrt(var.view(1, 4, 1) + 1e-5))


def test_ghost_batch_renorm_corrects_each_ghost_against_the_shared_buffers():
    x = torch.randn(8, 4, 5, generator=torch.Generator().manual_seed(6), dtype=f64)
    ghost = mb.GhostBatchNorm1d(4, 4, 8, renorm=True).double()
    with torch.no_grad():
        ghost.running_mean.fill_(0.2), ghost.running_std.fill_(1.5)
    ghost.set_bounds(100.0, 100.0)                      # nothing clipped: inference's output
    y = ghost(x)
    assert torch.allclose(y, (x - 0.2) / 1.5, atol=1e-12)


def test_ghost_batches_must_divide_the_batch():
    with pytest.raises(ValueError, match="divisor of 32"):
        mb.GhostBatchNorm1d(4, 3, 32)
    with pytest.raises(ValueError, match="built for batches of 8"):
        mb.GhostBatchNorm1d(4, 2, 8)(torch.randn(6, 4, 5))


# --- batches and runs -------------------------------------------------------------------------

def test_sorted_grouping_puts_the_labels_in_order():
    y = torch.tensor([3, 1, 3, 0, 1, 2, 0, 3])
    idx = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0])
    assert torch.equal(mb.grouped(idx, y, "random"), idx)
    out = mb.grouped(idx, y, "sorted")
    assert sorted(out.tolist()) == sorted(idx.tolist())
    assert y[out].tolist() == [0, 0, 1, 1, 2, 3, 3, 3]
    with pytest.raises(ValueError, match="'random' or 'sorted'"):
        mb.grouped(idx, y, "shuffled")


def test_sorted_batches_hold_two_classes_in_equal_shares():
    y = torch.arange(200) % 10
    draw = mb.batches(y, 32, "sorted", torch.Generator().manual_seed(0), classes=2)
    seen = set()
    for _ in range(40):
        idx = next(draw)
        labels, counts = torch.unique(y[idx], return_counts=True)
        assert len(idx) == 32 and len(set(idx.tolist())) == 32
        assert len(labels) == 2 and counts.tolist() == [16, 16]
        seen.update(labels.tolist())
    assert len(seen) == 10
    iid = next(mb.batches(y, 32, "iid", torch.Generator().manual_seed(0)))
    assert len(torch.unique(y[iid])) > 5
    with pytest.raises(ValueError, match="classes must divide 32"):
        next(mb.batches(y, 32, "sorted", torch.Generator(), classes=3))
    with pytest.raises(ValueError, match="'iid' or 'sorted'"):
        next(mb.batches(y, 32, "shuffled", torch.Generator()))


SHORT = dict(steps=6, width=8)


def test_a_short_run_returns_its_metrics():
    out = mb.trained(seed=0, norm="bn", group=4, **SHORT)
    assert set(out) == {"test_accuracy", "test_error", "batch_accuracy", "population_accuracy",
                        "noise@1", "noise@2", "noise@3", "noise@4"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.values())
    assert out["test_error"] == pytest.approx(1 - out["test_accuracy"])
    assert set(mb.trained(seed=0, norm="gn", **SHORT)) == {"test_accuracy", "test_error"}
    assert "noise@4" in mb.trained(seed=0, norm="brn", sampling="sorted", **SHORT)
    assert "noise@4" in mb.trained(seed=0, norm="brn", group=8, grouping="sorted", **SHORT)


def test_the_same_seed_gives_the_same_numbers():
    with torch.random.fork_rng(devices=[]):
        a = mb.trained(seed=1, norm="bn", group=2, **SHORT)
        b = mb.trained(seed=1, norm="bn", group=2, **SHORT)
        c = mb.trained(seed=2, norm="bn", group=2, **SHORT)
    assert a == b and a != c


def test_only_batchnorm_takes_a_group_and_names_are_checked():
    with pytest.raises(ValueError, match="only BN and Batch Renorm split their batch"):
        mb.trained(seed=0, norm="gn", group=2, **SHORT)
    with pytest.raises(ValueError, match="grouping 'random'"):
        mb.trained(seed=0, norm="ln", grouping="sorted", **SHORT)
    with pytest.raises(ValueError, match="unknown norm 'bm'"):
        mb.cnn("bm")
    with pytest.raises(ValueError, match="unknown net 'deep'"):
        mb.cnn("bn", net="deep")


def test_the_nets_have_the_lengths_they_say():
    x = torch.zeros(2, 1, 40)
    for net, lengths in (("strided", [40, 20, 10, 5]), ("flat", [40, 40, 40, 40])):
        model, seen = mb.cnn("gn", net), []
        for m in model:
            if isinstance(m, ncnn.GroupNorm):
                m.register_forward_hook(lambda m, a, y: seen.append(a[0].shape[2]))
        model(x)
        assert seen == lengths


def test_the_experiment_is_importable_by_name():
    assert isinstance(mb.TRAIN, Experiment)
    assert mb.TRAIN.target == "normcore.experiments.minibatch:trained"
