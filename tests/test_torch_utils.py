"""torch's own utilities treat normcore's modules as torch's (they subclass torch's classes),
and ``from_torch`` / ``to_torch`` swap a model's norm layers in place, timm's subclasses
included (minimal faithful copies of timm's LayerNorm2d, BatchNormAct2d and GroupNormAct
below: timm is not a dependency)."""
from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as TF
from torch import nn as tnn

import normcore.nn as nn
from normcore.nn import convert

torch.set_num_threads(1)

# (normcore class, torch class, constructor args, input shape)
PAIRS = [
    (nn.BatchNorm1d, tnn.BatchNorm1d, (4,), (3, 4, 5)),
    (nn.BatchNorm2d, tnn.BatchNorm2d, (4,), (3, 4, 5, 5)),
    (nn.BatchNorm3d, tnn.BatchNorm3d, (4,), (3, 4, 2, 3, 3)),
    (nn.SyncBatchNorm, tnn.SyncBatchNorm, (4,), (3, 4, 5, 5)),
    (nn.InstanceNorm1d, tnn.InstanceNorm1d, (4,), (3, 4, 5)),
    (nn.InstanceNorm2d, tnn.InstanceNorm2d, (4,), (3, 4, 5, 5)),
    (nn.InstanceNorm3d, tnn.InstanceNorm3d, (4,), (3, 4, 2, 3, 3)),
    (nn.LayerNorm, tnn.LayerNorm, ((5, 5),), (3, 4, 5, 5)),
    (nn.RMSNorm, tnn.RMSNorm, (5,), (3, 4, 5)),
    (nn.GroupNorm, tnn.GroupNorm, (2, 4), (3, 4, 5, 5)),
]
IDS = [p[0].__name__ for p in PAIRS]


# --- minimal faithful copies of timm's layers (timm/layers/norm.py, norm_act.py) ----------
class LayerNorm2d(tnn.LayerNorm):
    """timm's: LayerNorm over the channels of NCHW (its forward permutes)."""

    def __init__(self, num_channels, eps=1e-6, affine=True):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = TF.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class BatchNormAct2d(tnn.BatchNorm2d):
    """timm's: torch's BatchNorm2d forward, cut and pasted, then drop and activation."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, act_layer=tnn.ReLU, inplace=True, drop_layer=None):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats)
        self.drop = drop_layer() if drop_layer is not None else tnn.Identity()
        self.act = act_layer(inplace=inplace)

    def forward(self, x):
        assert x.ndim == 4, f"expected 4D input (got {x.ndim}D input)"
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        x = TF.batch_norm(
            x, self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight, self.bias, bn_training, factor, self.eps)
        return self.act(self.drop(x))


class GroupNormAct(tnn.GroupNorm):
    """timm's: GroupNorm (channels first in the signature), then drop and activation."""

    def __init__(self, num_channels, num_groups=32, eps=1e-5, affine=True, act_layer=tnn.ReLU,
                 inplace=True, drop_layer=None):
        super().__init__(num_groups, num_channels, eps=eps, affine=affine)
        self.drop = drop_layer() if drop_layer is not None else tnn.Identity()
        self.act = act_layer(inplace=inplace)

    def forward(self, x):
        x = TF.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return self.act(self.drop(x))


class SuperLayerNorm2d(tnn.LayerNorm):
    """The other common LayerNorm2d: ``super().forward`` between two permutes."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RmsNorm(tnn.Module):
    """timm's RmsNorm is a plain Module (no torch norm to subclass): normcore has no twin."""

    def __init__(self, channels, eps=1e-6):
        super().__init__()
        self.normalized_shape, self.eps = (channels,), eps
        self.weight = tnn.Parameter(torch.ones(channels))

    def forward(self, x):
        return TF.rms_norm(x, self.normalized_shape, self.weight, self.eps)


def resnet_like(norms=tnn) -> tnn.Module:
    # a non-homogeneous activation (GELU, Tanh) between two norms, no bias before a BN, no
    # mean pooling after InstanceNorm: otherwise a norm's invariance makes some gradients
    # zero, and only rounding noise would be compared
    torch.manual_seed(0)
    return tnn.Sequential(
        tnn.Conv2d(3, 8, 3, padding=1, bias=False), norms.BatchNorm2d(8), tnn.ReLU(inplace=True),
        tnn.Conv2d(8, 8, 3, padding=1, bias=False), BatchNormAct2d(8, drop_layer=tnn.Dropout),
        tnn.Conv2d(8, 8, 3, padding=1, bias=False), GroupNormAct(8, num_groups=4),
        tnn.Conv2d(8, 8, 3, padding=1, bias=False), norms.GroupNorm(2, 8), tnn.GELU(),
        norms.InstanceNorm2d(8, affine=True, track_running_stats=True), tnn.Tanh(),
        tnn.Flatten(1), tnn.Linear(8 * 6 * 6, 6, bias=False), norms.BatchNorm1d(6), tnn.Tanh(),
        tnn.Linear(6, 5))


class ViTLike(tnn.Module):
    def __init__(self, dim=8):
        super().__init__()
        torch.manual_seed(0)
        self.patch = tnn.Conv2d(3, dim, 2, stride=2)
        self.norm2d = LayerNorm2d(dim)
        self.norm2d_super = SuperLayerNorm2d(dim)
        self.ln1 = tnn.LayerNorm(dim)
        self.mlp = tnn.Sequential(tnn.Linear(dim, 2 * dim), tnn.GELU(), tnn.Linear(2 * dim, dim))
        self.ln2 = tnn.RMSNorm(dim)
        self.head = tnn.Linear(dim, 5)

    def forward(self, x):
        x = self.norm2d_super(self.norm2d(self.patch(x))).flatten(2).transpose(1, 2)
        x = x + self.mlp(self.ln1(x))
        return self.head(self.ln2(x).mean(1))


def _run(model, x, seed=0):
    """Output, parameter grads and state_dict after one forward/backward (dropout seeded)."""
    model.zero_grad()
    torch.manual_seed(seed)
    out = model(x)
    # a fixed random weighting: a plain sum of squares after a BN does not depend on the input
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    return out.detach(), grads, {k: v.clone() for k, v in model.state_dict().items()}


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _near(got, ref, tol=1e-4):
    """Outputs, grads and state of two runs agree, each tensor to ``tol`` of its norm (through
    a dozen layers elementwise tolerances trip on entries near zero; normcore's and torch's
    float32 differ by ~1e-5 of the norm here, over 20 inputs)."""
    for a, b in zip(got, ref):
        a, b = (a, b) if isinstance(a, dict) else ({"out": a}, {"out": b})
        assert a.keys() == b.keys()
        for k in a:
            if not a[k].is_floating_point():
                assert torch.equal(a[k], b[k]), k
            else:
                err = (a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-30)
                assert err <= tol, f"{k}: relative error {err:.2e}"


# --- the classes are torch's ---------------------------------------------------------------
@pytest.mark.parametrize("ours, theirs, args, shape", PAIRS, ids=IDS)
def test_each_module_is_an_instance_of_torchs_class(ours, theirs, args, shape):
    m = ours(*args)
    if ours is nn.SyncBatchNorm:
        # torch's _BatchNorm but not a torch.nn.SyncBatchNorm, whose instances
        # DistributedDataParallel refuses in a model on CPU (tests/test_distributed.py)
        from torch.nn.modules.batchnorm import _BatchNorm
        assert isinstance(m, _BatchNorm) and not isinstance(m, theirs)
    else:
        assert isinstance(m, theirs)
    assert type(m).__module__ == "normcore.nn"
    assert repr(m) == repr(theirs(*args))          # torch's extra_repr
    assert m.state_dict().keys() == theirs(*args).state_dict().keys()
    assert type(pickle.loads(pickle.dumps(m))) is ours and type(copy.deepcopy(m)) is ours


def test_the_base_classes_are_torchs():
    from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
    from torch.nn.modules.instancenorm import _InstanceNorm
    assert issubclass(nn.BatchNorm2d, _BatchNorm) and issubclass(nn.SyncBatchNorm, _BatchNorm)
    assert issubclass(nn.InstanceNorm2d, _InstanceNorm) and issubclass(nn._NormBase, _NormBase)
    assert issubclass(nn.BatchNorm2d, nn._BatchNorm)   # normcore's names stay importable


@pytest.mark.parametrize("make, match", [
    (lambda: nn.BatchNorm2d(4, eps=0.0), "eps"), (lambda: nn.LayerNorm(4, eps=-1.0), "eps"),
    (lambda: nn.BatchNorm2d(4, momentum=1.5), "momentum"),
    (lambda: nn.InstanceNorm2d(4, momentum=-0.1), "momentum"),
    (lambda: nn.GroupNorm(3, 4), "num_groups"), (lambda: nn.RMSNorm(4, eps=0.0), "eps"),
])
def test_normcore_still_checks_what_torch_accepts(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --- torch's utilities ------------------------------------------------------------------
def test_torchs_convert_sync_batchnorm_gives_torchs_sync_bn_with_the_same_tensors():
    model = tnn.Sequential(tnn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.BatchNorm1d(4))
    weight, mean = model[1].weight, model[1].running_mean
    out = tnn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert type(out[1]) is tnn.SyncBatchNorm and type(out[2]) is tnn.SyncBatchNorm
    assert out[1].weight is weight and out[1].running_mean is mean


def test_normcores_convert_sync_batchnorm_gives_normcores_from_either_bn():
    model = tnn.Sequential(nn.BatchNorm2d(4), tnn.BatchNorm2d(4), tnn.SyncBatchNorm(4))
    out = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert [type(m) for m in out] == [nn.SyncBatchNorm] * 3


def test_the_freeze_bn_idiom_finds_normcore_bns():
    model = resnet_like(nn).train()
    frozen = 0
    for m in model.modules():
        if isinstance(m, tnn.modules.batchnorm._BatchNorm):
            m.eval()
            m.weight.requires_grad_(False)
            m.bias.requires_grad_(False)
            frozen += 1
    assert frozen == 3    # normcore's two, and timm's BatchNormAct2d
    before = model[1].running_mean.clone()
    model(torch.randn(4, 3, 6, 6)).sum().backward()
    assert torch.equal(model[1].running_mean, before) and model[1].weight.grad is None


def _conv_bn(relu: bool):
    torch.manual_seed(0)
    layers = [tnn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)] + ([tnn.ReLU()] if relu else [])
    model = tnn.Sequential(*layers)
    model.train()(torch.randn(8, 3, 6, 6) * 2 + 1)   # running stats that are not 0 and 1
    return model.eval()


@pytest.mark.parametrize("relu", [False, True])
def test_fuse_modules_folds_a_normcore_bn_into_the_conv_in_eval(relu):
    model = _conv_bn(relu)
    x = torch.randn(2, 3, 6, 6)
    expected = model(x)
    names = ["0", "1", "2"] if relu else ["0", "1"]
    fused = torch.ao.quantization.fuse_modules(model, [names])
    assert isinstance(fused[1], tnn.Identity)
    assert type(fused[0]) is (torch.ao.nn.intrinsic.ConvReLU2d if relu else tnn.Conv2d)
    _close(fused(x), expected)


def test_fuse_modules_fuses_a_normcore_bn_with_relu():
    model = _conv_bn(relu=True)
    x = torch.randn(2, 4, 4, 4)
    expected = model[2](model[1](x))
    weight = model[1].weight
    fused = torch.ao.quantization.fuse_modules(model, [["1", "2"]], inplace=True)
    assert type(fused[1]) is torch.ao.nn.intrinsic.BNReLU2d    # it checks for torch's BN type
    assert fused[1][0].weight is weight                          # ...sharing normcore's tensors
    _close(fused[1](x), expected)


def test_qat_fusion_holds_a_torch_bn_sharing_normcores_tensors():
    model = _conv_bn(relu=False).train()
    weight = model[1].weight
    fused = torch.ao.quantization.fuse_modules_qat(model, [["0", "1"]], inplace=True)
    assert type(fused[0]) is torch.ao.nn.intrinsic.ConvBn2d
    assert type(fused[0][1]) is tnn.BatchNorm2d and fused[0][1].weight is weight


def test_fuse_conv_bn_eval_reads_a_normcore_bn():
    model = _conv_bn(relu=False)
    x = torch.randn(2, 3, 6, 6)
    fused = tnn.utils.fusion.fuse_conv_bn_eval(model[0], model[1])
    _close(fused(x), model(x))


def test_symbolic_trace_keeps_normcore_norms_as_leaves_where_torchs_are():
    def graph(norms):
        model = tnn.Sequential(*[m for m in resnet_like(norms) if not isinstance(
            m, (BatchNormAct2d, GroupNormAct))])
        traced = torch.fx.symbolic_trace(model)
        return model, traced, [(n.op, n.target) for n in traced.graph.nodes]
    _, _, expected = graph(tnn)
    model, traced, nodes = graph(nn)
    assert nodes == expected and ("call_module", "1") in nodes
    x = torch.randn(3, 3, 6, 6)
    _close(traced.eval()(x), model.eval()(x))


def test_symbolic_trace_keeps_ws_convs_and_dyt_as_leaves():
    torch.manual_seed(0)
    model = tnn.Sequential(nn.WSConv2d(3, 4, 3), nn.ScaledStdConv2d(4, 4, 1),
                           nn.DyT(4, channels_last=False))
    traced = torch.fx.symbolic_trace(model)
    assert [n.op for n in traced.graph.nodes] == ["placeholder"] + ["call_module"] * 3 + ["output"]
    x = torch.randn(2, 3, 6, 6)
    _close(traced(x), model(x))


def test_replace_all_batch_norm_modules_drops_normcore_running_stats():
    model = tnn.Sequential(nn.BatchNorm2d(4), tnn.BatchNorm2d(4))
    torch.func.replace_all_batch_norm_modules_(model)
    for m in model:
        assert not m.track_running_stats and m.running_mean is None
    x = torch.randn(3, 4, 2, 2)
    _close(model[0].eval()(x), model[1].eval()(x))   # batch statistics in eval too


@pytest.mark.parametrize("ours, theirs, args, shape", PAIRS, ids=IDS)
def test_state_dicts_move_both_ways(ours, theirs, args, shape):
    torch.manual_seed(0)
    a, b = theirs(*args), ours(*args)
    with torch.no_grad():
        for p in a.parameters():
            p.uniform_(0.5, 1.5)
    b.load_state_dict(a.state_dict())
    a.load_state_dict(b.state_dict())
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


# --- from_torch / to_torch ---------------------------------------------------------------
@pytest.mark.parametrize("make, x, count", [
    (resnet_like, (4, 3, 6, 6), 6), (ViTLike, (2, 3, 8, 8), 4)])
@pytest.mark.filterwarnings("error")    # every twin reaches normcore's math: no warning
def test_from_torch_and_back_keeps_outputs_grads_and_state(make, x, count):
    x = torch.randn(x, generator=torch.Generator().manual_seed(0))
    model = make().train()
    params = dict(model.named_parameters())
    twin = copy.deepcopy(model)          # stays torch's: the reference
    ref = _run(twin, x)
    _, swap = nn.from_torch(model, report=True)
    assert len(swap.swapped) == count and not swap.skipped
    assert dict(model.named_parameters()) == params     # the same Parameter objects
    _near(_run(model, x), ref)           # normcore's math beside torch's, through the layers
    nn.to_torch(model)
    assert [type(m) for m in model.modules()] == [type(m) for m in make().modules()]
    assert dict(model.named_parameters()) == params
    _near(_run(model, x), _run(twin, x))                # torch's again, on the same state


def _counting(monkeypatch, torch_fn):
    """Count the calls handed from ``torch_fn`` to normcore's function."""
    calls = []
    target = convert.FUNCTIONS[torch_fn]
    monkeypatch.setitem(convert.FUNCTIONS, torch_fn,
                        lambda *a, **k: calls.append(1) or target(*a, **k))
    return calls


def test_twins_run_normcores_math_in_the_users_forward(monkeypatch):
    model = resnet_like()
    nn.from_torch(model)
    bna, gna, ln2d = model[4], model[6], nn.from_torch(LayerNorm2d(8))
    assert isinstance(bna, BatchNormAct2d) and isinstance(bna, nn.BatchNorm2d)
    assert isinstance(gna, GroupNormAct) and isinstance(gna, nn.GroupNorm)
    assert type(bna).__name__ == "BatchNormAct2d"      # reprs keep the user's name
    x = torch.randn(2, 8, 3, 3)
    for layer, fn in ((bna, TF.batch_norm), (gna, TF.group_norm), (ln2d, TF.layer_norm)):
        calls = _counting(monkeypatch, fn)
        layer(x)
        assert calls == [1], layer
    calls = _counting(monkeypatch, TF.layer_norm)
    TF.layer_norm(x, (3,))          # outside a twin's forward, torch's function is torch's
    assert calls == []


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_twins_compile_with_fullgraph_and_run_normcores_math(monkeypatch, train):
    # timm's LayerNorm2d, BatchNormAct2d and GroupNormAct under torch.compile(fullgraph=True):
    # the routing (a TorchFunctionMode) is traced into the graph, normcore's function with it
    torch._dynamo.reset()
    x = torch.randn(2, 8, 3, 3)
    for make, fn in ((lambda: BatchNormAct2d(8), TF.batch_norm),
                     (lambda: GroupNormAct(8, 2), TF.group_norm),
                     (lambda: LayerNorm2d(8), TF.layer_norm)):
        ref = make().train(train)
        twin = nn.from_torch(copy.deepcopy(ref))
        calls = _counting(monkeypatch, fn)
        y = torch.compile(twin, backend="aot_eager", fullgraph=True)(x)
        assert calls, type(ref).__name__             # traced through normcore's function
        _near(y, ref(x))


def test_a_subclass_that_overrides_a_helper_keeps_it():
    class AnyDimBatchNorm(tnn.BatchNorm2d):       # takes (N, C, L) too
        def _check_input_dim(self, input):
            pass

    x = torch.randn(4, 3, 5)
    layer = AnyDimBatchNorm(3)
    expected = layer(x)
    nn.from_torch(layer)
    assert isinstance(layer, nn.BatchNorm2d)
    _close(layer(x), expected)


def test_an_optimizer_built_before_the_swap_still_trains_the_model():
    model = resnet_like()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    nn.from_torch(model)
    before = model[1].weight.detach().clone()
    _run(model, torch.randn(4, 3, 6, 6))
    opt.step()
    assert not torch.equal(model[1].weight, before)


def test_the_swap_keeps_mode_dtype_and_requires_grad():
    model = tnn.Sequential(tnn.BatchNorm2d(4), tnn.LayerNorm(3)).double().eval()
    model[1].weight.requires_grad_(False)
    nn.from_torch(model)
    assert not model.training and not model[0].training
    assert model[0].running_mean.dtype == torch.float64 and not model[1].weight.requires_grad


def test_a_parametrized_layer_keeps_its_parametrization():
    from torch.nn.utils import parametrize

    class Positive(tnn.Module):
        def forward(self, w):
            return w.exp()

    model = tnn.Sequential(tnn.LayerNorm(4), BatchNormAct2d(3))
    parametrize.register_parametrization(model[0], "weight", Positive())
    parametrize.register_parametrization(model[1], "weight", Positive())
    x = torch.randn(2, 3, 4, 4)
    expected = (model[0](x), model[1](x))
    nn.from_torch(model)
    assert parametrize.type_before_parametrizations(model[0]) is nn.LayerNorm
    assert isinstance(model[1], BatchNormAct2d) and isinstance(model[1], nn.BatchNorm2d)
    _close(model[0](x), expected[0])
    _close(model[1](x), expected[1])
    nn.to_torch(model)
    assert parametrize.type_before_parametrizations(model[0]) is tnn.LayerNorm
    assert parametrize.type_before_parametrizations(model[1]) is BatchNormAct2d
    parametrize.remove_parametrizations(model[0], "weight")
    assert type(model[0]) is tnn.LayerNorm


def test_a_single_layer_is_swapped_in_place():
    bn = tnn.BatchNorm2d(4)
    assert nn.from_torch(bn) is bn and type(bn) is nn.BatchNorm2d
    assert nn.to_torch(bn) is bn and type(bn) is tnn.BatchNorm2d


def test_twins_pickle_and_deepcopy():
    model = nn.from_torch(tnn.Sequential(LayerNorm2d(4), BatchNormAct2d(4)))
    x = torch.randn(2, 4, 3, 3)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert type(clone[0]) is type(model[0]) and type(clone[1]) is type(model[1])
        _close(clone.eval()(x), model.eval()(x))


def test_unknown_norms_are_left_alone_and_named():
    model = tnn.Sequential(tnn.LayerNorm(4), RmsNorm(4))
    with pytest.warns(UserWarning, match=r"1 layer\(s\).*1 \(RmsNorm\)"):
        _, swap = nn.from_torch(model, report=True)
    assert type(model[1]) is RmsNorm and swap.skipped == [("1", RmsNorm)]
    assert [s[0] for s in swap.swapped] == ["0"]


def test_from_torch_does_not_list_normcores_own_modules():
    from normcore.experiments.minibatch import GhostBatchNorm1d
    model = tnn.Sequential(nn.BatchNorm1d(4), nn.DyT(4), GhostBatchNorm1d(4, group=2, batch=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, swap = nn.from_torch(model, report=True)
    assert swap == ([], [])


def test_to_torch_names_normcore_layers_without_a_torch_twin():
    model = tnn.Sequential(nn.WSConv2d(3, 4, 3), nn.BatchNorm2d(4))
    with pytest.warns(UserWarning, match=r"0 \(WSConv2d\)"):
        nn.to_torch(model)
    assert type(model[1]) is tnn.BatchNorm2d and type(model[0]) is nn.WSConv2d


def test_a_twin_whose_forward_calls_no_torch_norm_warns():
    class OwnMath(tnn.LayerNorm):
        def forward(self, x):
            return (x - x.mean(-1, keepdim=True)) * self.weight

    layer = nn.from_torch(OwnMath(4))
    with pytest.warns(UserWarning, match="torch's math"):
        layer(torch.randn(2, 4))


def test_bad_input_gets_a_clear_error():
    with pytest.raises(TypeError, match=r"expects a torch\.nn\.Module, got list"):
        nn.from_torch([tnn.BatchNorm2d(4)])
    with pytest.raises(TypeError, match=r"expects a torch\.nn\.Module"):
        nn.to_torch("model")


def test_layers_with_settings_normcore_refuses_stay_torchs_and_are_named():
    # torch takes eps=0 (LayerNorm, GroupNorm, InstanceNorm, RMSNorm; BatchNorm in eval mode)
    # and any momentum; normcore's layers refuse them on purpose (the differences page)
    model = tnn.Sequential(
        tnn.Linear(6, 24), tnn.LayerNorm(24, eps=0.0), tnn.Unflatten(1, (4, 6)),
        tnn.GroupNorm(2, 4, eps=0.0), tnn.InstanceNorm1d(4, eps=0.0, affine=True),
        tnn.BatchNorm1d(4, momentum=2.0), tnn.BatchNorm1d(4, eps=0.0).eval(),
        tnn.RMSNorm(6, eps=0.0), tnn.LayerNorm(6)).double()
    x = torch.randn(5, 6, dtype=torch.float64)
    before = model(x)
    with pytest.warns(UserWarning, match=r"left 6 layer\(s\) as torch's") as caught:
        _, swap = nn.from_torch(model, report=True)
    text = str(caught[0].message)
    for path, cls in [("1", "LayerNorm"), ("3", "GroupNorm"), ("4", "InstanceNorm1d"),
                      ("6", "BatchNorm1d"), ("7", "RMSNorm")]:
        assert f"{path} ({cls}): {cls}: eps must be positive, got eps=0.0" in text
    assert "5 (BatchNorm1d): momentum=2.0 is outside [0, 1]" in text
    assert "layer.eps = 1e-5" in text and len(caught) == 1
    assert [p for p, _ in swap.skipped] == ["1", "3", "4", "5", "6", "7"]
    assert [p for p, _, _ in swap.swapped] == ["8"] and isinstance(model[8], nn.LayerNorm)
    assert all(type(model[i]).__module__.startswith("torch.nn") for i in (1, 3, 4, 5, 6, 7))
    torch.testing.assert_close(model(x), before)   # torch's layers compute what they did
    # given a setting normcore accepts, the layer is swapped
    model[1].eps = 1e-5
    with pytest.warns(UserWarning, match="left 5 layer"):
        _, swap = nn.from_torch(model, report=True)
    assert [p for p, _, _ in swap.swapped] == ["1"] and isinstance(model[1], nn.LayerNorm)


@pytest.mark.parametrize("fn", [nn.from_torch, nn.to_torch])
def test_the_docstring_examples_run(fn):
    import doctest

    # the globals of tests/test_doctests.py, which runs every public docstring's examples
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(fn, globs={"torch": torch}):
        runner.run(test)
    assert runner.tries >= 3 and runner.failures == 0


def test_from_torch_and_to_torch_are_public():
    assert {"from_torch", "to_torch"} <= set(nn.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.from_torch(tnn.Sequential(tnn.Linear(2, 2)))   # nothing to say: no warning


def test_twin_class_refuses_a_class_that_subclasses_no_torch_norm():
    from normcore.nn import convert
    with pytest.raises(TypeError, match=r"Linear does not subclass a torch\.nn norm"):
        convert.twin_class(tnn.Linear)


def test_a_proxy_of_another_fx_tracer_gets_a_clear_error():
    # a node can be recorded by path only under a torch.fx.Tracer (symbolic_trace's)
    graph = torch.fx.Graph()
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)     # a TracerBase, not a Tracer
    proxy = torch.fx.Proxy(graph.placeholder("x"), tracer)
    with pytest.raises(TypeError, match="Tracer only, got a GraphAppendingTracer"):
        nn.BatchNorm2d(3)(proxy)
