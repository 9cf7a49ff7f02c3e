"""normcore.experiments.transformer: the tiny transformer of chapter 9 and its S-curve tools."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF

from normcore import nn as ncnn
from normcore.experiments import runner
from normcore.experiments import transformer as tr


@pytest.fixture(autouse=True)
def one_thread():
    with runner.one_thread():
        yield


def test_every_norm_starts_from_the_same_weights_outside_the_norms():
    models = {}
    for norm in tr.NORMS:
        torch.manual_seed(3)
        models[norm] = tr.TinyTransformer(norm, alpha0=2.0)
    ref = dict(models["layer"].named_parameters())
    for norm, model in models.items():
        shared = {k: p for k, p in model.named_parameters() if "norm" not in k and
                  not k.startswith("final")}
        assert shared and all(torch.equal(p, ref[k]) for k, p in shared.items()), norm
    kinds = {norm: type(models[norm].blocks[0].norm1) for norm in tr.NORMS}
    assert kinds == {"layer": ncnn.LayerNorm, "rms": ncnn.RMSNorm, "dyt": ncnn.DyT,
                     "none": torch.nn.Identity}
    assert float(models["dyt"].final.alpha.detach()) == 2.0
    sizes = {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()}
    assert sizes == {"layer": 18090, "rms": 17930, "dyt": 18095, "none": 17770}


def test_pre_and_post_place_the_norm_differently():
    x = torch.randn(3, 1, 40)
    torch.manual_seed(0)
    pre = tr.TinyTransformer("layer", "pre")
    torch.manual_seed(0)
    post = tr.TinyTransformer("layer", "post")
    assert isinstance(post.final, torch.nn.Identity) and isinstance(pre.final, ncnn.LayerNorm)
    assert pre(x).shape == post(x).shape == (3, 10)
    assert torch.equal(pre(x), pre(x[:, 0]))                  # (N, 40) is accepted too
    assert not torch.allclose(pre(x), post(x))
    # post: every block's output is a LayerNorm's output, mean 0 and variance 1 per token
    h = post.tokens(x)
    for block in post.blocks:
        h = block(h)
    assert torch.allclose(h.mean(-1), torch.zeros(3, 10), atol=1e-5)
    assert len(tr.norm_io(pre, x)) == 5 and len(tr.norm_io(post, x)) == 4


def test_bad_arguments_say_what_to_change():
    with pytest.raises(ValueError, match="unknown norm 'batch'"):
        tr.TinyTransformer("batch")
    with pytest.raises(ValueError, match="unknown placement 'middle'"):
        tr.TinyTransformer("layer", "middle")
    with pytest.raises(ValueError, match="divisible by the number of heads"):
        tr.TinyTransformer("layer", C=33)
    with pytest.raises(ValueError, match="n_train must be an int from 10 to 4000"):
        tr.data(5000)
    with pytest.raises(ValueError, match="unknown norm"):
        tr.train_model(0, "group", steps=1)


def test_training_is_seeded_and_reports_the_learned_alpha():
    a = tr.trained(1, "dyt", steps=4, n_train=200)
    assert a == tr.trained(1, "dyt", steps=4, n_train=200)                # bit for bit
    assert a != tr.trained(2, "dyt", steps=4, n_train=200)
    assert sorted(k for k in a if k.startswith("alpha")) == [
        "alpha", "alpha1", "alpha2", "alpha3", "alpha4", "alpha5"]
    assert math.isclose(a["alpha"], sum(a[f"alpha{i}"] for i in range(1, 6)) / 5)
    assert abs(a["alpha1"] - 0.5) < 4 * 4e-3          # Adam moves alpha by about lr a step
    b = tr.trained(1, "layer", steps=4, n_train=200)
    assert sorted(b) == ["test_accuracy", "test_loss", "train_accuracy", "train_loss"]
    assert 0 <= b["test_accuracy"] <= 1


def test_norm_io_returns_what_each_layernorm_computes():
    torch.manual_seed(0)
    net = tr.TinyTransformer("layer")
    pairs = tr.norm_io(net, torch.randn(4, 1, 40))
    with torch.no_grad():
        net.blocks[1].norm2.weight.mul_(2.0)            # after the call: no effect on pairs
    for (x, y), _norm in zip(pairs, tr._norm_layers(net)):
        assert x.shape == y.shape == (4, 10, 32)
        assert torch.allclose(y, TF.layer_norm(x, (32,)), atol=1e-5)    # gamma 1, beta 0
    assert not any(m._forward_hooks for m in tr._norm_layers(net))      # hooks removed


def test_tanh_fit_recovers_a_tanh_and_prefers_it_to_a_line():
    gen = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(2000, generator=gen, dtype=torch.float64)
    y = 2.0 * torch.tanh(1.5 * x) + 0.1 + 0.01 * torch.randn(2000, generator=gen,
                                                              dtype=torch.float64)
    fit = tr.tanh_fit(x, y)
    assert abs(fit.alpha - 1.5) < 0.01 and abs(fit.gamma - 2.0) < 0.01
    assert abs(fit.beta - 0.1) < 0.01
    assert fit.r2 > 0.9999 and fit.r2_line < 0.9 and fit.unexplained_ratio > 100
    line = tr.tanh_fit(x, 3 * x + 1)                   # a line: tanh can only approach it
    assert line.r2_line == pytest.approx(1.0) and line.r2 > 0.999
    assert line.unexplained_ratio < 1e-3
    again = tr.tanh_fit(x, y)                          # no random start: the same fit
    assert all(math.isclose(getattr(again, k), getattr(fit, k), rel_tol=1e-9)
               for k in ("gamma", "alpha", "beta", "r2", "r2_line"))


def test_tanh_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="same size"):
        tr.tanh_fit(torch.zeros(5), torch.zeros(4))
    with pytest.raises(ValueError, match="y is constant"):
        tr.tanh_fit(torch.arange(5.0), torch.ones(5))
    with pytest.raises(ValueError, match="x is all zeros"):
        tr.tanh_fit(torch.zeros(5), torch.arange(5.0))
