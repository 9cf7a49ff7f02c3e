"""float32 accuracy of normcore beside torch's own ops, against float64 references.

    .venv/bin/python benchmarks/accuracy.py [--quick] [--ops-only | --drift-only] [--steps 3 20]
        [--seeds 0 1 2 3 4] [--ops batch_norm ...] [--models nf ws] [--drift-seeds 0 1 ...]

**Op errors.**  For each op, at a realistic size and on hard inputs (a large mean,
``|mu| >> sigma``; near-constant sets; a zero weight for Weight Standardization), the op
runs in float32 and, from the same values cast up, in float64 (the same op: normcore's in
float64 for normcore, torch's in float64 for torch).  The loss is ``(y * dy).sum()`` with a
fixed float32 ``dy``.  For the output and each gradient (dx, dgamma, dbeta) the error is

    err = max |t32 - t64| / max |t64|

the largest error relative to the reference's scale (its largest magnitude), printed for
normcore and torch, with the ratio normcore / torch (``-`` where torch's error is 0 and
ours too).  torch has no op for some rows: Weight Standardization is compared with what the
code of each convention calls (``w.std`` for the original code, ``torch.var_mean`` for BiT,
``F.batch_norm`` over the weight for timm's StdConv2d), DyT with its formula in torch ops.

**Training drift.**  A small model is trained k SGD steps in float32 and, from the same
initial values, in float64; the figure is the parameter distance ``||p32 - p64|| / ||p64||``
after k steps, for the model with normcore's norms and with torch's.  The control trains
the float64 model from the float32-rounded init plus a perturbation of one float32 rounding
(relative 2^-24, random sign): its distance is how far chaos alone carries one rounding in k
steps, so an error well above the control is the ops' own, not the dynamics'.  Both libraries'
float32 runs are chaotic alike: on some seeds one library's run jumps away in a single step
(and on others the other's), so the ratio is a geometric mean over seeds (``--drift-seeds``,
8 by default) with its 95% interval, beside the step error: the gradient at step k taken in float32 and float64 from the
same float32 parameters (the ops' own error in one step, without the trajectory).

A benchmark, not a test: it prints, it does not assert (``tests/test_accuracy.py`` pins the
ratios).  Runs on one thread.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as TF

import normcore.functional as F
import normcore.nn as nn
from normcore.experiments.runner import interval

# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_x(shape, kind: str, seed: int = 0) -> torch.Tensor:
    """A float32 input: ``normal`` (N(0, 1) plus a per-channel shift and scale), ``big_mean``
    (mean 300, std 1: ``|mu| >> sigma``), ``near_const`` (5 + 1e-3 N(0, 1)), ``zero``."""
    g = _gen(seed)
    x = torch.randn(shape, generator=g)
    if kind == "normal":
        if len(shape) > 1:
            view = (1, shape[1]) + (1,) * (len(shape) - 2)
            x = x * (torch.rand(shape[1], generator=g) * 3 + 0.5).reshape(view) \
                + torch.randn(shape[1], generator=g).reshape(view)
        return x
    if kind == "big_mean":
        return 300.0 + x
    if kind == "near_const":
        return 5.0 + 1e-3 * x
    if kind == "zero":
        return torch.zeros(shape)
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------
# the ops: name -> (normcore fn, torch fn, affine shape or None); fn(x, w, b) -> y
# ---------------------------------------------------------------------------------------
def _ws_torch(convention):
    def f(w, _a=None, _b=None):
        dims = tuple(range(1, w.dim()))
        if convention == "original":
            return (w - w.mean(dims, keepdim=True)) / (w.std(dims, keepdim=True) + 1e-5)
        if convention == "bit":
            var, mu = torch.var_mean(w, dims, correction=0, keepdim=True)
            return (w - mu) / torch.sqrt(var + 1e-10)
        return TF.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                             momentum=0.0, eps=1e-6).reshape_as(w)
    return f


def _bn_eval(fn):
    def f(x, w, b):
        C = x.shape[1]
        rm = torch.linspace(-1, 1, C, dtype=x.dtype)
        rv = torch.linspace(0.5, 2, C, dtype=x.dtype)
        return fn(x, rm, rv, w, b, training=False)
    return f


RMS_EPS = torch.finfo(torch.float32).eps
OPS = {
    "batch_norm train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                         lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True), 1),
    "batch_norm eval": (_bn_eval(F.batch_norm), _bn_eval(TF.batch_norm), 1),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
                      lambda x, w, b: TF.instance_norm(x, weight=w, bias=b), 1),
    "layer_norm last": (lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
                        lambda x, w, b: TF.layer_norm(x, x.shape[-1:], w, b), -1),
    "layer_norm CHW": (lambda x, w, b: F.layer_norm(x, x.shape[1:], w, b),
                       lambda x, w, b: TF.layer_norm(x, x.shape[1:], w, b), "chw"),
    # eps given: by default it is the input dtype's machine epsilon, and the float64
    # reference would then be another function (r off by eps / (2 mean(x^2)), half a rounding)
    "rms_norm": (lambda x, w, b: F.rms_norm(x, x.shape[-1:], w, eps=RMS_EPS),
                 lambda x, w, b: TF.rms_norm(x, x.shape[-1:], w, eps=RMS_EPS), -1),
    "group_norm": (lambda x, w, b: F.group_norm(x, 8, w, b),
                   lambda x, w, b: TF.group_norm(x, 8, w, b), 1),
    "dyt": (lambda x, w, b: F.dyt(x, torch.full((1,), 0.5, dtype=x.dtype), w, b),
            lambda x, w, b: w * torch.tanh(0.5 * x) + b, -1),
}
for _c in ("original", "bit", "timm"):
    OPS[f"ws {_c}"] = ((lambda c: lambda w, _a, _b: F.weight_standardize(w, convention=c))(_c),
                       _ws_torch(_c), None)

ACT4, ACT3, WEIGHT = (32, 64, 32, 32), (32, 256, 512), (256, 128, 3, 3)
QUICK4, QUICK3 = (8, 64, 16, 16), (16, 128, 256)
# (op, shape, input kind)
ROWS = [
    ("batch_norm train", ACT4, "normal"), ("batch_norm train", ACT4, "big_mean"),
    ("batch_norm train", ACT4, "near_const"),
    ("batch_norm eval", ACT4, "normal"),
    ("instance_norm", ACT4, "normal"), ("instance_norm", ACT4, "big_mean"),
    ("instance_norm", ACT4, "near_const"),
    ("layer_norm last", ACT3, "normal"), ("layer_norm last", ACT3, "big_mean"),
    ("layer_norm CHW", ACT4, "normal"), ("layer_norm CHW", ACT4, "big_mean"),
    ("rms_norm", ACT3, "normal"), ("rms_norm", ACT3, "big_mean"),
    ("group_norm", ACT4, "normal"), ("group_norm", ACT4, "big_mean"),
    ("group_norm", ACT4, "near_const"),
    ("ws original", WEIGHT, "normal"), ("ws bit", WEIGHT, "normal"),
    ("ws timm", WEIGHT, "normal"), ("ws timm", WEIGHT, "big_mean"),
    ("ws original", WEIGHT, "zero"), ("ws bit", WEIGHT, "zero"), ("ws timm", WEIGHT, "zero"),
    ("dyt", ACT3, "normal"),
]


def _affine(x: torch.Tensor, where, seed: int):
    if where is None:
        return None, None
    g = _gen(seed + 1)
    shape = {1: (x.shape[1],), -1: x.shape[-1:], "chw": x.shape[1:]}[where]
    return torch.rand(shape, generator=g) + 0.5, torch.randn(shape, generator=g)


def _run(fn, x, w, b, dy):
    """``y`` and the gradients of ``(y * dy).sum()`` w.r.t. x, w, b (None where absent)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    y = fn(*leaves)
    live = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(y, live, dy.to(y.dtype), allow_unused=True))
    return [y.detach()] + [None if t is None else next(grads) for t in leaves]


def rel_err(t32, t64) -> float:
    """max |t32 - t64| / max |t64| (0 when both are 0)."""
    scale = t64.abs().max().item()
    err = (t32.double() - t64).abs().max().item()
    return err / scale if scale > 0 else err


def op_errors(name: str, shape, kind: str, seed: int = 0, which: str = "both"):
    """``{"normcore": [err y, dx, dgamma, dbeta], "torch": [...]}`` (None where absent) for one
    row; ``which`` picks one side only."""
    ours, theirs, where = OPS[name]
    x = make_x(shape, kind, seed)
    w, b = _affine(x, where, seed)
    dy = torch.randn(shape, generator=_gen(seed + 2))
    out = {}
    for side, fn in (("normcore", ours), ("torch", theirs)):
        if which not in ("both", side):
            continue
        r32 = _run(fn, x, w, b, dy)
        r64 = _run(fn, *[None if t is None else t.double() for t in (x, w, b)], dy.double())
        out[side] = [None if a is None else rel_err(a, e) for a, e in zip(r32, r64)]
    return out


def _fmt(v):
    return "      -" if v is None else f"{v:7.1e}"


def _ratio(a, t):
    if a is None or t is None:
        return "    -"
    if t == 0:
        return "    -" if a == 0 else "  inf"
    return f"{a / t:5.2f}"


U32 = torch.finfo(torch.float32).eps / 2      # one float32 rounding, relative
QUANTITIES = ("y", "dx", "dgamma", "dbeta")


def print_op_table(rows, seed: int = 0) -> float:
    """Print the table for one seed; return the worst ratio normcore / torch."""
    print(f"op errors (seed {seed}): max|t32 - t64| / max|t64|, normcore (nc) and torch (th), "
          "ratio nc/th")
    head = f"{'op':18s} {'input':10s} {'shape':17s}"
    for q in QUANTITIES:
        head += f" | {q:>6s} nc      th  ratio"
    print(head)
    worst = 0.0
    for name, shape, kind in rows:
        e = op_errors(name, shape, kind, seed)
        line = f"{name:18s} {kind:10s} {tuple(shape)!s:17s}"
        for a, t in zip(e["normcore"], e["torch"]):
            line += f" | {_fmt(a)} {_fmt(t)} {_ratio(a, t)}"
            if a is not None and t is not None and t > 0:
                worst = max(worst, a / t)
        print(line, flush=True)
    print(f"worst ratio normcore / torch: {worst:.2f}")
    return worst


def print_seed_table(rows, seeds) -> float:
    """For each row and quantity, the ratio normcore / torch on each seed; below a row with a
    ratio over 1, both errors on every seed in float32 roundings (``err / 2^-24``).  Returns
    the worst ratio over rows, quantities and seeds."""
    print(f"ratios normcore / torch per seed ({' '.join(map(str, seeds))}); worst over seeds")
    print(f"{'op':18s} {'input':10s} " + " | ".join(f"{q:>{6 * len(seeds) - 1}s}"
                                                      for q in QUANTITIES) + " | worst")
    worst, over = 0.0, []
    for name, shape, kind in rows:
        per_seed = [op_errors(name, shape, kind, s) for s in seeds]
        cells, row_worst = [], 0.0
        for q in range(len(QUANTITIES)):
            ratios = []
            for e in per_seed:
                a, t = e["normcore"][q], e["torch"][q]
                ratios.append(_ratio(a, t))
                if a is not None and t is not None and t > 0:
                    row_worst = max(row_worst, a / t)
            cells.append(" ".join(ratios))
        worst = max(worst, row_worst)
        print(f"{name:18s} {kind:10s} " + " | ".join(cells) + f" | {row_worst:5.2f}", flush=True)
        if row_worst > 1.0:
            over.append((name, kind, per_seed))
    for name, kind, per_seed in over:
        print(f"  {name} {kind}, in float32 roundings (nc/th) per seed:")
        for q, qn in enumerate(QUANTITIES):
            if per_seed[0]["normcore"][q] is None:
                continue
            vals = " ".join(f"{e['normcore'][q] / U32:5.2f}/{e['torch'][q] / U32:<5.2f}"
                            for e in per_seed)
            print(f"    {qn:6s} {vals}")
    print(f"worst ratio normcore / torch over seeds {list(seeds)}: {worst:.2f}")
    return worst


# ---------------------------------------------------------------------------------------
# training drift
# ---------------------------------------------------------------------------------------
class ScaledStdConv2dTorch(nn.ScaledStdConv2d):
    """timm's ScaledStdConv2d: ``F.batch_norm`` over the weight with ``gain * scale`` as its
    weight (eps 1e-6)."""

    def standardized_weight(self):
        return TF.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                             weight=(self.gain * self.scale).view(-1), training=True,
                             momentum=0.0, eps=self.eps).reshape_as(self.weight)


class StdConv2dTorch(torch.nn.Conv2d):
    """timm's StdConv2d: the weight standardized by ``F.batch_norm`` (eps 1e-6)."""

    def forward(self, x):
        w = TF.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                          training=True, momentum=0.0, eps=1e-6).reshape_as(self.weight)
        return self._conv_forward(x, w, self.bias)


def _norm_factory(kind: str, lib: str):
    if kind == "bn":
        return (nn.BatchNorm2d if lib == "normcore" else torch.nn.BatchNorm2d)
    if kind == "gn":
        return lambda c: (nn.GroupNorm if lib == "normcore" else torch.nn.GroupNorm)(4, c)
    if kind == "ln":   # LayerNorm over (C, H, W) needs the size: GroupNorm(1) is the same
        return lambda c: (nn.GroupNorm if lib == "normcore" else torch.nn.GroupNorm)(1, c)
    return None


class Block(torch.nn.Module):
    def __init__(self, c, conv, norm):
        super().__init__()
        self.c1, self.n1 = conv(c, c, 3, padding=1, bias=False), norm(c)
        self.c2, self.n2 = conv(c, c, 3, padding=1, bias=False), norm(c)

    def forward(self, x):
        return torch.relu(x + self.n2(self.c2(torch.relu(self.n1(self.c1(x))))))


def small_resnet(kind: str, lib: str, width: int = 16, blocks: int = 2) -> torch.nn.Module:
    """A small ResNet for 3x16x16 inputs, 10 classes: BN (``bn``; ``bn0`` with the last
    gamma of each block zero-initialised, timm's ``zero_init_last``), GN (``gn``), LN over
    (C, H, W) (``ln``), StdConv (``ws``: timm's convention, no norm layer, the last conv of
    each block zero-initialised), or ScaledStdConv (``nf``: NF-ResNet's, the last conv's
    gain zero-initialised)."""
    if kind == "ws":
        conv = (lambda *a, **k: nn.WSConv2d(*a, convention="timm", **k)) if lib == "normcore" \
            else StdConv2dTorch
        norm = lambda c: torch.nn.Identity()
    elif kind == "nf":
        conv = nn.ScaledStdConv2d if lib == "normcore" else ScaledStdConv2dTorch
        norm = lambda c: torch.nn.Identity()
    else:
        conv, norm = torch.nn.Conv2d, _norm_factory(kind.rstrip("0"), lib)
    layers = [conv(3, width, 3, padding=1, bias=False), norm(width), torch.nn.ReLU()]
    for _ in range(blocks):
        blk = Block(width, conv, norm)
        if kind == "ws":
            torch.nn.init.zeros_(blk.c2.weight)
        elif kind == "nf":   # timm's NF-ResNet zero_init_last: the last conv's gain
            torch.nn.init.zeros_(blk.c2.gain)
        elif kind.endswith("0"):   # timm's zero_init_last: the block's last norm's gamma
            torch.nn.init.zeros_(blk.n2.weight)
        layers.append(blk)
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(width, 10)]
    return torch.nn.Sequential(*layers)


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def _train(model, x, y, steps: int, lr: float):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        TF.cross_entropy(model(x.to(next(model.parameters()).dtype)), y).backward()
        opt.step()
    return _flat(model)


def _load(dst: torch.nn.Module, src: torch.nn.Module, dtype: torch.dtype) -> None:
    """``src``'s state into ``dst``, floating-point tensors cast to ``dtype``."""
    dst.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v
                         for k, v in src.state_dict().items()})


def _pair(kind: str, lib: str, seed: int, batch: int):
    """``(m32, m64, x, y, g)``: the model in float32 and a float64 copy of it, a batch of
    inputs and labels, and the generator that drew them (for the control's perturbation)."""
    torch.manual_seed(seed)
    m32 = small_resnet(kind, lib)
    g = _gen(seed + 100)
    x = torch.randn(batch, 3, 16, 16, generator=g) * 2 + 0.5
    y = torch.randint(0, 10, (batch,), generator=g)
    m64 = small_resnet(kind, lib).double()
    _load(m64, m32, torch.float64)
    return m32, m64, x, y, g


def drift(kind: str, lib: str, steps: int, seed: int = 0, batch: int = 32, lr: float = 0.1):
    """``(distance float32 vs float64, control)`` after ``steps`` SGD steps, both relative to
    the float64 parameters' norm."""
    m32, m64, x, y, g = _pair(kind, lib, seed, batch)
    mctl = small_resnet(kind, lib).double()
    mctl.load_state_dict(m64.state_dict())
    with torch.no_grad():   # one float32 rounding, random sign, on every nonzero parameter
        for p in mctl.parameters():
            sign = torch.randint(0, 2, p.shape, generator=g).double() * 2 - 1
            p.mul_(1 + sign * 2.0 ** -24)
    p32, p64, pctl = (_train(m, x, y, steps, lr) for m in (m32, m64, mctl))
    scale = p64.norm().item()
    return (p32 - p64).norm().item() / scale, (pctl - p64).norm().item() / scale


def step_error(kind: str, lib: str, steps: int, seed: int = 0, batch: int = 32,
               lr: float = 0.1) -> float:
    """The gradient's own error at step ``steps``, free of the trajectory: the float64 model
    is trained ``steps - 1`` steps, its parameters rounded to float32, and from that one point
    the gradient is taken in float32 and in float64; the figure is ``||g32 - g64|| /
    ||g64||`` over all parameters: what one step of the ops costs, where the drift after k
    steps also carries how far apart the two trajectories have moved."""
    m32, m64, x, y, _ = _pair(kind, lib, seed, batch)
    _train(m64, x, y, steps - 1, lr)
    _load(m32, m64, torch.float32)
    _load(m64, m32, torch.float64)
    grads = []
    for m in (m32, m64):
        params = list(m.parameters())
        loss = TF.cross_entropy(m(x.to(params[0].dtype)), y)
        grads.append(torch.cat([t.double().flatten() for t in torch.autograd.grad(loss, params)]))
    return (grads[0] - grads[1]).norm().item() / grads[1].norm().item()


def print_drift(steps_list, kinds=("bn", "bn0", "gn", "ln", "ws", "nf"), seeds=(0, 1)):
    """Per model and k: the distances on each seed, normcore's, torch's and both controls;
    then the ratio normcore / torch as a geometric mean over the seeds with its 95% interval
    (Student t over the per-seed log ratios), the same for the controls (how far apart chaos
    alone puts two float64 runs of the two libraries), and for the gradient's error at step k
    from one common point (:func:`step_error`: the ops' own error, without the trajectory)."""
    print("\ntraining drift: ||p32 - p64|| / ||p64|| after k SGD steps (momentum 0.9, lr 0.1), "
          "per seed; control = float64 from an init moved by one float32 rounding")
    for kind in kinds:
        for k in steps_list:
            res = {lib: [drift(kind, lib, k, s) for s in seeds] for lib in ("normcore", "torch")}
            cols = {"normcore": [r[0] for r in res["normcore"]],
                    "torch": [r[0] for r in res["torch"]],
                    "control nc": [r[1] for r in res["normcore"]],
                    "control th": [r[1] for r in res["torch"]],
                    "step nc": [step_error(kind, "normcore", k, s) for s in seeds],
                    "step th": [step_error(kind, "torch", k, s) for s in seeds]}
            print(f"{kind} k={k}, seeds {list(seeds)}")
            for name, vals in cols.items():
                print(f"  {name:10s} " + " ".join(f"{a:8.1e}" for a in vals))
            for name, a, t in (("nc / th", cols["normcore"], cols["torch"]),
                               ("control", cols["control nc"], cols["control th"]),
                               ("step", cols["step nc"], cols["step th"])):
                logs = [math.log(x / y) for x, y in zip(a, t)]
                line = f"  {name:10s} " + " ".join(f"{math.exp(v):8.2f}" for v in logs)
                if len(logs) > 1:
                    iv = interval(logs)
                    line += (f"   geometric mean {math.exp(iv.mean):.2f} "
                             f"[95% {math.exp(iv.low):.2f}, {math.exp(iv.high):.2f}]")
                print(line, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--ops-only", action="store_true")
    ap.add_argument("--drift-only", action="store_true")
    ap.add_argument("--steps", type=int, nargs="+", default=[3, 20])
    ap.add_argument("--models", nargs="+", default=["bn", "bn0", "gn", "ln", "ws", "nf"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="op table: one seed prints the errors; several, the ratio per seed")
    ap.add_argument("--drift-seeds", type=int, nargs="+", default=list(range(8)),
                    help="training drift: the seeds (the interval needs at least 2)")
    ap.add_argument("--ops", nargs="+", default=None,
                    help="op table: only the rows whose op name starts with one of these")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    if not args.drift_only:
        rows = ROWS
        if args.quick:
            sub = {ACT4: QUICK4, ACT3: QUICK3}
            rows = [(n, sub.get(s, s), k) for n, s, k in ROWS]
        if args.ops:
            rows = [r for r in rows if any(r[0].startswith(o) for o in args.ops)]
        if len(args.seeds) == 1:
            print_op_table(rows, args.seeds[0])
        else:
            print_seed_table(rows, args.seeds)
    if not args.ops_only:
        print_drift(args.steps, args.models, args.drift_seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
