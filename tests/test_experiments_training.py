"""normcore.experiments.training: the shared loop of chapters 8 and 9's experiments."""
from __future__ import annotations

import math

import pytest
import torch

from normcore.experiments import runner
from normcore.experiments.training import evaluate, lr_factor, train_cosine


def _task():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 4, generator=gen)
    return x, (x[:, 0] > 0).long()


def test_the_batches_depend_on_the_seed_and_the_learning_rate_falls_to_zero():
    x, y = _task()
    nets = []
    with runner.one_thread():
        for seed in (0, 0, 1):
            torch.manual_seed(5)
            net = torch.nn.Linear(4, 2)
            opt = torch.optim.SGD(net.parameters(), lr=0.5)
            train_cosine(net, opt, x, y, steps=20, batch=8, seed=seed)
            nets.append(net)
    assert torch.equal(nets[0].weight, nets[1].weight)          # same seed: same batches
    assert not torch.equal(nets[0].weight, nets[2].weight)
    assert math.isclose(opt.param_groups[0]["lr"], 0.0, abs_tol=1e-12)   # the cosine's end
    assert not nets[0].training                                  # left in eval mode
    accuracy, loss = evaluate(nets[0], x, y)
    assert accuracy > 0.9 and loss < math.log(2)


def test_evaluate_counts_right_answers_and_the_loss():
    net = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[-1.0], [1.0]]))          # class 1 iff x > 0
    x = torch.tensor([[1.0], [-2.0], [3.0], [-1.0]])
    accuracy, loss = evaluate(net, x, torch.tensor([1, 0, 0, 0]))
    assert accuracy == 0.75
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(net(x), torch.tensor([1, 0, 0, 0]))
    assert math.isclose(loss, float(expected), rel_tol=1e-6)


def test_the_warm_up_rises_from_zero_to_the_learning_rate_then_the_cosine_falls_to_zero():
    assert lr_factor(0, 80, 20) == 0.0                       # step 0: nothing yet
    assert lr_factor(10, 80, 20) == 0.5                      # half-way up, linearly
    assert lr_factor(20, 80, 20) == 1.0                      # the top, at step W
    assert math.isclose(lr_factor(50, 80, 20), 0.5)                 # the cosine half-way
    assert math.isclose(lr_factor(80, 80, 20), 0.0, abs_tol=1e-15)   # the end
    # without a warm-up: the plain cosine, exactly as before the option existed
    for t in (0, 7, 40, 80):
        assert lr_factor(t, 80) == 0.5 * (1 + math.cos(math.pi * t / 80))
    assert lr_factor(0, 80) == 1.0


def test_the_loop_follows_the_schedule_step_by_step():
    x, y = _task()
    for warmup in (0, 4):
        torch.manual_seed(5)
        net = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        seen = []
        opt.register_step_pre_hook(lambda o, args, kw: seen.append(o.param_groups[0]["lr"]))
        with runner.one_thread():
            losses = train_cosine(net, opt, x, y, steps=12, batch=8, seed=0, warmup=warmup)
        assert seen == [0.5 * lr_factor(t, 12, warmup) for t in range(12)]
        assert seen[warmup] == 0.5 and (warmup == 0 or seen[0] == 0.0)
        assert math.isclose(opt.param_groups[0]["lr"], 0.0, abs_tol=1e-12)
        assert len(losses) == 12 and all(math.isfinite(v) for v in losses)


@pytest.mark.parametrize("steps, warmup, words", [
    (80, -1, "warmup must be from 0 (no warm-up) to steps - 1 = 79"),
    (80, 80, "warmup must be from 0 (no warm-up) to steps - 1 = 79"),
    (80, 2.5, "warmup must be a whole number of steps, got 2.5"),
    (80, True, "warmup must be a whole number of steps, got True"),
    (0, 0, "steps must be >= 1, got 0"),
])
def test_a_bad_schedule_says_what_to_change(steps, warmup, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        lr_factor(0, steps, warmup)
    x, y = _task()
    net = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="train_cosine: "):
        train_cosine(net, torch.optim.SGD(net.parameters(), lr=0.1), x, y, steps, 8, 0,
                     warmup)
