"""normcore.experiments.nfnet: the normalizer-free ResNet of chapter 9."""
from __future__ import annotations

import math

import pytest
import torch

from normcore import nn as ncnn
from normcore.experiments import nfnet as nf
from normcore.experiments import runner
import itertools


@pytest.fixture(autouse=True)
def one_thread():
    with runner.one_thread():
        yield


def test_the_relu_gain_restores_unit_variance():
    z = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert abs(float((torch.relu(z) * nf.GAMMA_RELU).pow(2).mean()
                     - (torch.relu(z) * nf.GAMMA_RELU).mean() ** 2) - 1) < 5e-3
    # the closed form; DeepMind's code uses 1.7139588594436646, a sampled estimate
    assert math.isclose(nf.GAMMA_RELU, 1.71286, abs_tol=1e-5)


def test_expected_variances_grow_by_alpha_squared_and_reset_at_the_transition():
    a2 = 0.2 ** 2
    assert nf.expected_variances(2, 0.2) == pytest.approx([1, 1 + a2, 1 + 2 * a2, 1 + a2,
                                                           1 + 2 * a2])
    ev = nf.expected_variances(4, 0.5)
    assert ev[:5] == pytest.approx([1, 1.25, 1.5, 1.75, 2.0]) and ev[5] == pytest.approx(1.25)
    assert len(ev) == 2 * 4 + 1


def test_kinds_share_their_convolution_draws_and_differ_in_normalization():
    nets = {}
    for kind in nf.KINDS[:2]:
        torch.manual_seed(4)
        nets[kind] = nf.resnet(kind)
    convs = {k: [m.weight for m in n.modules() if isinstance(m, torch.nn.Conv2d)]
             for k, n in nets.items()}
    assert len(nets["nf"].blocks) == 4                  # 2 blocks, the transition, 1 more
    assert len(convs["bn"]) == len(convs["nf"]) == 1 + 2 * 4 + 1      # stem, branches, 1x1
    assert all(torch.equal(a, b) for a, b in zip(convs["bn"], convs["nf"]))
    assert all(isinstance(m, ncnn.ScaledStdConv2d) for m in nets["nf"].modules()
               if isinstance(m, torch.nn.Conv2d))
    assert not any(isinstance(m, ncnn.BatchNorm2d) for m in nets["nf"].modules())
    assert sum(isinstance(m, ncnn.BatchNorm2d) for m in nets["bn"].modules()) == 2 * 4 + 1
    betas = [b.beta for b in nets["nf"].blocks]
    assert betas == pytest.approx([math.sqrt(v) for v in nf.expected_variances(2)[:4]])


def test_an_nf_block_adds_alpha_squared_to_the_variance_at_initialization():
    torch.manual_seed(0)
    block = nf.NFBlock("nf", 16, 16, alpha=0.5, beta=math.sqrt(2.0)).double()
    h = math.sqrt(2.0) * torch.randn(512, 16, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        added = float((block(h) - h).var())
    # the branch sees variance 1 and returns about 1 (Scaled WS with the ReLU's gain; the
    # zero padding of the borders takes a little), times alpha^2 = 0.25
    assert 0.17 < added < 0.27


def test_signal_propagation_shows_the_mean_shift_that_scaled_ws_removes():
    sp = {kind: nf.signal_propagation(0, kind) for kind in nf.KINDS}
    assert all(len(v["var"]) == len(v["mean_sq"]) == 2 * 4 + 1 for v in sp.values())
    stage2 = slice(5, None)
    assert min(sp["nf-plain"]["mean_sq"][stage2]) > 3 * max(sp["nf"]["mean_sq"][stage2])
    # BN's branches each add their variance: it grows block by block in the first stage
    var_bn = sp["bn"]["var"][:5]
    assert all(b > a for a, b in itertools.pairwise(var_bn))


def test_training_is_seeded_and_bad_kinds_are_refused():
    a = nf.trained(0, "nf", steps=3)
    assert a == nf.trained(0, "nf", steps=3)
    assert a != nf.trained(1, "nf", steps=3)
    assert sorted(a) == ["test_accuracy", "test_loss", "train_accuracy"]
    with pytest.raises(ValueError, match="unknown kind 'gn'"):
        nf.resnet("gn")
    with pytest.raises(ValueError, match="alpha must be positive"):
        nf.trained(0, "nf", alpha=0.0)
    with pytest.raises(ValueError, match="blocks >= 1"):
        nf.resnet("bn", blocks=0)
