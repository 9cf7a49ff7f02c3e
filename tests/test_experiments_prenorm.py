"""normcore.experiments.prenorm: the LayerNorm chapter's gradient norms at initialization."""
from __future__ import annotations

import pytest
import torch

from normcore.experiments import prenorm


def test_float64_gradient_norms_are_seeded_and_summarized():
    a = prenorm.grad_norms(seed=3, mode="Post-LN", L=3, C=8)
    assert a == prenorm.grad_norms(seed=3, mode="Post-LN", L=3, C=8)
    layers = [a[f"layer{i}"] for i in (1, 2, 3)]
    assert a["last_over_first"] == layers[-1] / layers[0]
    assert a["spread"] == max(layers) / min(layers)
    assert a != prenorm.grad_norms(seed=4, mode="Post-LN", L=3, C=8)


def test_the_modes_place_the_layernorm_differently():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    outs = {}
    for mode in prenorm.MODES:
        torch.manual_seed(1)                            # the same weights for every mode
        outs[mode] = prenorm.Layer(8, mode, alpha=2.0)(x)
    # Post-LN and DeepNorm end in a LayerNorm: each token has mean 0 over its features
    for mode in ("Post-LN", "DeepNorm", "DeepNorm (alpha on G)"):
        assert outs[mode].mean(-1).abs().max() < 1e-12, mode
    assert outs["Pre-LN"].mean(-1).abs().max() > 1e-3         # Pre-LN does not
    assert not torch.allclose(outs["DeepNorm"], outs["DeepNorm (alpha on G)"])


def test_an_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="choose one of"):
        prenorm.Layer(8, "post-ln")
