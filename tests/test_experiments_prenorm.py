"""normcore.experiments.prenorm: the LayerNorm chapter's gradient norms at initialization."""
from __future__ import annotations

import pytest
import torch

from normcore.experiments import prenorm, runner


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as runner.run gives each run (more only contend on these tiny tensors)."""
    with runner.one_thread():
        yield


def test_float64_gradient_norms_are_seeded_and_summarized():
    a = prenorm.grad_norms(seed=3, mode="Post-LN", L=3, C=8)
    assert a == prenorm.grad_norms(seed=3, mode="Post-LN", L=3, C=8)    # bit for bit
    layers = [a[f"layer{i}"] for i in (1, 2, 3)]
    assert sorted(a) == ["last_over_first", "layer1", "layer2", "layer3", "mean", "spread"]
    assert a["last_over_first"] == layers[-1] / layers[0]
    assert a["spread"] == max(layers) / min(layers)
    assert a["mean"] == sum(layers) / 3
    assert a != prenorm.grad_norms(seed=4, mode="Post-LN", L=3, C=8)


def test_the_same_through_the_runner_on_one_thread(monkeypatch):
    monkeypatch.setenv("NORMCORE_CACHE", "off")
    cfg = {"mode": "Pre-LN", "L": 2, "C": 8}
    res = runner.run(prenorm.GRADS, [cfg], seeds=(0, 1), workers=1, progress=False)
    assert res.values("layer2", **cfg)[1] == prenorm.grad_norms(seed=1, **cfg)["layer2"]


def test_post_ln_grows_towards_the_output_and_pre_ln_falls_on_the_chapters_model():
    assert prenorm.grad_norms(seed=0, mode="Post-LN")["last_over_first"] > 1.5
    assert prenorm.grad_norms(seed=0, mode="Pre-LN")["last_over_first"] < 0.7


def test_every_mode_starts_from_the_same_weights_inputs_and_targets():
    beta = 0.5
    runs = {mode: prenorm.initialize(5, mode, L=2, C=8, alpha=2.0,
                                     beta=beta if mode.startswith("DeepNorm") else 1.0)
            for mode in prenorm.MODES}
    layers0, head0, x0, t0 = runs["Post-LN"]
    for mode, (layers, head, x, t) in runs.items():
        assert torch.equal(x, x0) and torch.equal(t, t0), mode
        assert torch.equal(head.weight, head0.weight), mode
        scale = beta if mode.startswith("DeepNorm") else 1.0
        for a, b in zip(layers, layers0):
            assert torch.equal(a.ff[0].weight, scale * b.ff[0].weight), mode
            assert torch.equal(a.attn.in_proj_weight[:16], b.attn.in_proj_weight[:16])


def test_the_modes_place_the_layernorm_differently():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    outs = {}
    for mode in prenorm.MODES:
        torch.manual_seed(1)                            # the same weights for every mode
        outs[mode] = prenorm.Layer(8, mode, alpha=2.0)(x)
    # Post-LN and DeepNorm end in a LayerNorm: each token has mean 0 over its features
    for mode in ("Post-LN", "DeepNorm", "DeepNorm (alpha on F)"):
        assert outs[mode].mean(-1).abs().max() < 1e-12, mode
    assert outs["Pre-LN"].mean(-1).abs().max() > 1e-3         # Pre-LN does not
    assert not torch.allclose(outs["DeepNorm"], outs["DeepNorm (alpha on F)"])


@pytest.mark.parametrize("call", [lambda: prenorm.Layer(8, "post-ln"),
                                  lambda: prenorm.grad_norms(0, "PreLN", L=2, C=8)])
def test_an_unknown_mode_names_the_choices(call):
    with pytest.raises(ValueError, match=r"unknown mode .*choose one of 'Post-LN', 'Pre-LN', "
                                         r"'DeepNorm', 'DeepNorm \(alpha on F\)'"):
        call()


def test_a_width_two_heads_cannot_split_is_refused():
    with pytest.raises(ValueError, match="even width C"):
        prenorm.grad_norms(0, "Post-LN", L=2, C=7)
