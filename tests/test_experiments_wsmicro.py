"""normcore.experiments.wsmicro: WS + GN at a real micro-batch against BN at a large one (the
papers' chapter), its sweep and its committed results."""
from __future__ import annotations

import pytest
import torch

from normcore import datasets
from normcore.experiments import minibatch, runner, sweeps, wsmicro


@pytest.fixture(autouse=True)
def one_thread():
    with runner.one_thread():
        yield


@pytest.mark.parametrize("kwargs, words", [
    (dict(norm="ln", batch=2, steps=3), "unknown norm 'ln'; choose one of ws+gn, gn, bn"),
    (dict(norm="bn", batch=1, steps=3), "BN needs a batch of at least 2 signals"),
    (dict(norm="gn", batch=0, steps=3), "batch must be a positive int, got 0"),
    (dict(norm="gn", batch=2.0, steps=3), "batch must be a positive int, got 2.0"),
    (dict(norm="gn", batch=2, steps=0), "steps must be a positive int, got 0"),
    (dict(norm="gn", batch=2, steps=3, lr=0.0), "lr must be a number in (0, 1), got 0.0"),
    (dict(norm="gn", batch=2, steps=3, lr="3e-3"), "lr must be a number in (0, 1)"),
])
def test_bad_input_names_the_problem(kwargs, words):
    with pytest.raises(ValueError) as err:
        wsmicro.trained(0, **kwargs)
    assert words in str(err.value)


@pytest.mark.parametrize("norm, batch", [("ws+gn", 1), ("ws+gn", 2), ("gn", 2), ("bn", 2)])
def test_a_short_run_returns_its_metrics(norm, batch):
    out = wsmicro.trained(0, norm=norm, batch=batch, steps=5)
    assert set(out) == {"test_accuracy", "test_error", "train_loss", "examples"}
    assert 0.0 <= out["test_accuracy"] <= 1.0
    assert out["test_error"] == pytest.approx(1.0 - out["test_accuracy"])
    assert out["examples"] == 5 * batch and out["train_loss"] > 0
    assert wsmicro.trained(0, norm=norm, batch=batch, steps=5) == out      # seeded


def test_a_micro_batch_run_reads_the_start_of_the_large_batch_runs_stream():
    """The chapter's "sees a part of what the large-batch run sees": for one seed, 16 steps
    of 2 signals are the first step of 32, in the same order."""
    y = datasets.mnist1d().y
    small = minibatch.batches(y, 2, "iid", torch.Generator().manual_seed(1003))
    large = minibatch.batches(y, 32, "iid", torch.Generator().manual_seed(1003))
    assert torch.equal(torch.cat([next(small) for _ in range(16)]), next(large))


def test_every_norm_starts_from_the_seeds_weights_whatever_the_batch():
    """The convolution weights of a seed do not depend on the batch size (BN's buffers and
    GN's affine parameters hold no random numbers)."""
    def convs(norm, batch):
        torch.manual_seed(4)
        net = minibatch.cnn(norm, "strided", group=max(batch, 2), batch=max(batch, 2))
        return [m.weight for m in net if isinstance(m, torch.nn.Conv1d)]
    for a, b in zip(convs("bn", 2), convs("bn", 32)):
        assert torch.equal(a, b)
    for a, b in zip(convs("ws+gn", 1), convs("gn", 32)):
        assert torch.equal(a, b)


def test_the_sweep_is_registered_and_its_results_load():
    sweep = sweeps.get("wsmicro")
    assert sweep.get_experiment() is wsmicro.TRAIN
    assert sweep.size() == (13, 10) and sweep.size(reduced=True) == (2, 5)
    pair = [dict(norm="ws+gn", batch=2, steps=200), dict(norm="bn", batch=32, steps=200)]
    assert list(sweep.reduced_configs) == pair
    res = sweeps.load_results("wsmicro")
    assert res.configs == sweep.configs and res.seeds == tuple(range(10))
    for cfg in sweep.configs:
        examples = res.values("examples", **cfg)
        assert examples == (float(cfg["batch"] * cfg["steps"]),) * 10
        assert all(0.0 <= v <= 1.0 for v in res.values("test_accuracy", **cfg))
