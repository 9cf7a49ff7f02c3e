"""normcore.experiments.training: the shared loop of chapter 9's experiments."""
from __future__ import annotations

import math

import torch

from normcore.experiments import runner
from normcore.experiments.training import evaluate, train_cosine


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
