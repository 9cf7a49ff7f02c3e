"""Under ``torch.autocast``, normcore's norms take and give the dtypes torch's do.

Autocast casts the inputs of an op by a policy table per device type: on CUDA and XPU,
``layer_norm``, ``rms_norm`` and ``group_norm`` run in float32 (so a float16 input gives a
float32 output); on CPU no norm is in the table, and each returns its input's dtype.
normcore's ops follow the same table (``normcore.functional.FP32_UNDER_AUTOCAST``) and run
with autocast off inside, as torch's kernels do.  These machines have no GPU: the CPU cases
are compared with torch's, the CUDA entries of the table with the header of the installed
torch, and the casting that those entries call for is checked on CPU with the table patched.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as TF
from torch import nn as tnn
from torch.testing import assert_close

import normcore.functional as F
import normcore.nn as nn
from normcore import _checks

torch.set_num_threads(1)
# torch's RMSNorm on a lower-precision input with float32 weights says it takes its slow path
pytestmark = pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")

LOW = [torch.bfloat16, torch.float16]      # the two dtypes CPU autocast takes
MODULES = {
    "LayerNorm": lambda ns: ns.LayerNorm(8),
    "RMSNorm": lambda ns: ns.RMSNorm(8),
    "GroupNorm": lambda ns: ns.GroupNorm(3, 6),
    "BatchNorm2d-train": lambda ns: ns.BatchNorm2d(6),
    "BatchNorm2d-eval": lambda ns: ns.BatchNorm2d(6).eval(),
    "InstanceNorm2d": lambda ns: ns.InstanceNorm2d(6, affine=True, track_running_stats=True),
}
OPS = {   # each op as (torch's or normcore's functional module, x) -> output
    "layer_norm": lambda f, x: f.layer_norm(x, (8,), torch.rand(8) + 0.5, torch.randn(8)),
    "rms_norm": lambda f, x: f.rms_norm(x, (8,), torch.rand(8) + 0.5),
    "group_norm": lambda f, x: f.group_norm(x, 3, torch.rand(6) + 0.5, torch.randn(6)),
    "batch_norm": lambda f, x: f.batch_norm(x, torch.zeros(6), torch.ones(6),
                                            torch.rand(6) + 0.5, torch.randn(6), True),
    "instance_norm": lambda f, x: f.instance_norm(x, weight=torch.rand(6) + 0.5,
                                                  bias=torch.randn(6)),
}


def _input(dtype):
    x = torch.randn(4, 6, 8, 8, generator=torch.Generator().manual_seed(0)) * 3 + 1
    return x.to(dtype)


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, "low"], ids=["float32-input", "low-input"])
@pytest.mark.parametrize("name", list(MODULES))
def test_each_module_gives_torchs_dtype_and_values_under_cpu_autocast(name, dtype, low):
    x = _input(low if dtype == "low" else dtype)
    outs = []
    for ns in (tnn, nn):
        torch.manual_seed(0)
        m = MODULES[name](ns)
        with torch.autocast("cpu", dtype=low):
            outs.append((m(x), m))
    (theirs, tm), (ours, om) = outs
    assert ours.dtype == theirs.dtype == x.dtype
    assert_close(ours, theirs)             # the output dtype's tolerance
    for a, b in zip(om.buffers(), tm.buffers()):   # the buffers are updated alike
        assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_each_op_gives_torchs_dtype_under_cpu_autocast_after_a_lower_precision_layer(name, low):
    # a float32 model: the conv runs in the lower precision, the norm takes its output
    conv = tnn.Conv2d(6, 6, 1)
    x = _input(torch.float32)
    outs = []
    for f in (TF, F):
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=low):
            h = conv(x)
            outs.append(OPS[name](f, h))
    assert h.dtype == low and outs[1].dtype == outs[0].dtype == low
    assert_close(outs[1], outs[0])


# A backward run inside the autocast region: the old core's row sums (torch.linalg.vecdot, in
# CPU autocast's lower-precision list) were taken in bfloat16 there, 1e-2 off torch's; the
# reference's sums and the kernels use no op of autocast's lists.
@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_a_backward_inside_the_autocast_region_keeps_torchs_precision(name):
    grads = []
    for ns in (tnn, nn):
        m = MODULES[name](ns)
        x = _input(torch.float32).requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(x).pow(2).sum().backward()
        grads.append(x.grad)
    assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-4)   # now ~1e-2 apart


def test_the_ops_run_with_autocast_off_inside(monkeypatch):
    seen = []
    layout = _checks.layer_norm_layout

    def spy(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return layout(*args, **kwargs)

    monkeypatch.setattr(_checks, "layer_norm_layout", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.layer_norm(_input(torch.bfloat16), (8,))
        assert torch.is_autocast_enabled("cpu")    # and on again after it
    assert seen == [False]


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "group_norm"])
def test_an_fp32_policy_casts_the_inputs_as_autocast_does(monkeypatch, name):
    """What CUDA's table calls for, on CPU: the table patched to list the op for CPU."""
    monkeypatch.setitem(F.FP32_UNDER_AUTOCAST, "cpu", frozenset({name}))
    x = _input(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(0)
        y = OPS[name](F, x)
        y64 = getattr(F, name)(x.double(), 3 if name == "group_norm" else (8,))
    torch.manual_seed(0)
    want = OPS[name](F, x.float())                  # float32 inputs, no autocast
    assert y.dtype == torch.float32 and y64.dtype == torch.float64   # float64 is left alone
    assert_close(y, want, rtol=0, atol=0)
    # and a module's bfloat16 parameters are cast too (the module keeps them)
    m = nn.LayerNorm(8).bfloat16() if name == "layer_norm" else \
        nn.RMSNorm(8).bfloat16() if name == "rms_norm" else nn.GroupNorm(3, 6).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(x).dtype == torch.float32
    assert m.weight.dtype == torch.bfloat16


def test_the_table_is_the_installed_torchs():
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.exists():
        pytest.skip(f"this torch ships no {header.name}")
    text = header.read_text()
    block = re.search(r"#define AT_FORALL_FP32\(_\)(.*?)\n\s*\n", text, re.S)[1]
    fp32 = set(re.findall(r"_\((\w+)\)", block))   # the ops listed without an overload
    norms = {"batch_norm", "instance_norm", "layer_norm", "rms_norm", "group_norm"}
    # CUDA and XPU register AT_FORALL_FP32 (autocast_mode.cpp)
    assert F.FP32_UNDER_AUTOCAST["cuda"] == F.FP32_UNDER_AUTOCAST["xpu"] == fp32 & norms
    assert "cpu" not in F.FP32_UNDER_AUTOCAST


def test_compiled_under_autocast():
    m, ref = nn.LayerNorm(8), tnn.LayerNorm(8)
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    x = _input(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = tnn.functional.linear(x, torch.eye(8))      # bfloat16
        assert_close(compiled(h), ref(h))
