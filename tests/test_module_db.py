"""PyTorch's own samples for its norm modules (``module_db`` of
``torch.testing._internal.common_modules``), run on normcore's twins.

For every sample of BatchNorm1d/2d/3d, GroupNorm, InstanceNorm1d/2d/3d, LayerNorm and RMSNorm,
in training and in eval mode: build torch's module and normcore's with the same constructor
arguments, load torch's state into normcore's, run the same forward input, and compare the
output, the buffers after the call, and the gradients of the input and the parameters.  Where
torch raises, normcore must raise an instance of the same type.  torch's error samples
(``module_error_inputs_func``) must raise the same type with a message matching torch's
pattern (normcore raises a constructor argument's error at construction, where torch may wait
for the forward: a deliberate difference, on the book's page of them).
"""
from __future__ import annotations

import copy

import pytest
import torch

import normcore.nn as ncnn

# (torch's test utilities need expecttest, pinned in requirements.txt for this test)
from torch.testing._internal.common_modules import ModuleErrorEnum, module_db

NAMES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm", "InstanceNorm1d",
         "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "RMSNorm")
INFOS = {info.module_cls.__name__: info for info in module_db
         if info.module_cls.__name__ in NAMES and info.module_cls.__module__.startswith("torch.nn")}
DTYPES = (torch.float64, torch.float32)
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-5)}


def _samples(name, dtype, training):
    info = INFOS[name]
    return info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True,
                                   training=training)


def _cases():
    for name in NAMES:
        for training in (True, False):
            for k, _ in enumerate(_samples(name, torch.float64, training)):
                yield pytest.param(name, training, k, id=f"{name}-{'train' if training else 'eval'}-{k}")


def test_every_module_has_samples():
    assert set(INFOS) == set(NAMES)
    assert len(list(_cases())) == 126      # the count of the issue: every sample is run


def _run(module, args, kwargs, dy_seed):
    """Output, input gradients and parameter gradients of ``sum(output * dy)``."""
    args = copy.deepcopy(args)
    kwargs = copy.deepcopy(kwargs)
    out = module(*args, **kwargs)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    params = [p for p in module.parameters() if p.requires_grad]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(dy_seed), dtype=out.dtype)
    grads = torch.autograd.grad(out, leaves + params, dy, allow_unused=True) if leaves + params else ()
    return out.detach(), grads


@pytest.mark.parametrize("name, training, k", list(_cases()))
def test_module_db_sample(name, training, k):
    for dtype in DTYPES:
        sample = _samples(name, dtype, training)[k]
        c, f = sample.constructor_input, sample.forward_input
        torch.manual_seed(k)
        theirs = INFOS[name].module_cls(*c.args, **c.kwargs).to(dtype).train(training)
        ours = getattr(ncnn, name)(*c.args, **c.kwargs).to(dtype).train(training)
        ours.load_state_dict(theirs.state_dict())
        try:
            ref = _run(theirs, f.args, f.kwargs, k)
        except Exception as e:  # noqa: BLE001 - torch refuses: normcore must raise the same type
            with pytest.raises(type(e)):
                _run(ours, f.args, f.kwargs, k)
            continue
        got = _run(ours, f.args, f.kwargs, k)
        torch.testing.assert_close(got[0], ref[0], **TOL[dtype])
        for a, b in zip(got[1], ref[1]):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, **TOL[dtype])
        for (na, a), (nb, b) in zip(ours.named_buffers(), theirs.named_buffers()):
            assert na == nb
            torch.testing.assert_close(a, b, equal_nan=True, **TOL[dtype])


def _error_cases():
    for name in NAMES:
        info = INFOS[name]
        if info.module_error_inputs_func is None:
            continue
        for k, e in enumerate(info.module_error_inputs_func(info, device="cpu", dtype=torch.float32,
                                                            requires_grad=False, training=True)):
            yield pytest.param(name, e, id=f"{name}-error-{k}")


@pytest.mark.parametrize("name, err", list(_error_cases()))
def test_module_db_error_sample(name, err):
    sample = err.module_error_input
    c, f = sample.constructor_input, sample.forward_input
    with pytest.raises(err.error_type, match=err.error_regex):
        m = INFOS[name].module_cls(*c.args, **c.kwargs)
        if err.error_on == ModuleErrorEnum.FORWARD_ERROR:
            m(*f.args, **f.kwargs)
    with pytest.raises(err.error_type, match=err.error_regex):
        m = getattr(ncnn, name)(*c.args, **c.kwargs)
        m(*f.args, **f.kwargs)
