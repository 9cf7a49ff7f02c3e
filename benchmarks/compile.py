"""Time one compiled training step with normcore's norms against the same model with torch's.

    .venv/bin/python benchmarks/compile.py [--reps 30] [--threads 1] [--variants batch group layer]

A small ResNet (a stem and three stages of two basic blocks each, 16-32-64 channels) on
CIFAR-sized input, batch 32, 3 x 32 x 32, ten classes; its norms are torch's
(``torch.nn.BatchNorm2d``) in one copy and normcore's (``normcore.nn.BatchNorm2d``) in the
other, with the same initial weights.  Both are compiled alike, ``torch.compile(model,
backend="inductor")``, and one training step (forward, cross-entropy, backward, an SGD step
with momentum) is timed, interleaved (A, B, A, B, ...) after a warm-up that includes the
compilations, so that a noisy shared machine affects both alike.  It prints the median
ratio normcore / torch (the target is <= 1.2) and the ratio of the minima, the least
disturbed runs (see ``benchmarks/speed.py``).  This is a benchmark: it prints, it does not
assert.

Variants: ``batch`` (the ResNet with BatchNorm2d, the default), ``group`` (the same ResNet
with GroupNorm(8, C)) and ``layer`` (a token MLP, batch 32 x 64 tokens x 128 features, with
pre-LayerNorm residual blocks).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as TF
from torch import nn as tnn

import normcore.nn as nn
from speed import interleaved   # benchmarks/speed.py: the same A, B, A, B timing

TARGET = 1.2


class Block(tnn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm):
        super().__init__()
        self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = norm(cout)
        self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = norm(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x):
        y = TF.relu(self.n1(self.conv1(x)))
        y = self.n2(self.conv2(y))
        return TF.relu(y + (x if self.skip is None else self.skip(x)))


def resnet(norm, widths=(16, 32, 64), classes: int = 10) -> tnn.Module:
    layers = [tnn.Conv2d(3, widths[0], 3, 1, 1, bias=False), norm(widths[0]), tnn.ReLU()]
    cin = widths[0]
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2, norm), Block(w, w, 1, norm)]
        cin = w
    layers += [tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(cin, classes)]
    return tnn.Sequential(*layers)


class MixerBlock(tnn.Module):
    def __init__(self, d: int, norm):
        super().__init__()
        self.norm = norm(d)
        self.fc1, self.fc2 = tnn.Linear(d, 2 * d), tnn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(TF.gelu(self.fc1(self.norm(x))))


def token_mlp(norm, d: int = 128, depth: int = 4, classes: int = 10) -> tnn.Module:
    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = tnn.Sequential(*[MixerBlock(d, norm) for _ in range(depth)])
            self.norm, self.head = norm(d), tnn.Linear(d, classes)

        def forward(self, x):
            return self.head(self.norm(self.blocks(x)).mean(1))
    return Net()


#: variant -> (model builder, torch's norm, normcore's norm, input shape)
VARIANTS = {
    "batch": (resnet, tnn.BatchNorm2d, nn.BatchNorm2d, (32, 3, 32, 32)),
    "group": (resnet, lambda c: tnn.GroupNorm(8, c), lambda c: nn.GroupNorm(8, c),
              (32, 3, 32, 32)),
    "layer": (token_mlp, tnn.LayerNorm, nn.LayerNorm, (32, 64, 128)),
}


def train_step(model, x, y):
    """One step of SGD with momentum on ``model`` (compiled); returns the step function."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = TF.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def measure(variant: str, reps: int, warmup: int = 5):
    build, theirs, ours, shape = VARIANTS[variant]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    y = torch.randint(0, 10, (shape[0],), generator=g)
    torch.manual_seed(0)
    ref = build(theirs)
    torch.manual_seed(0)
    mine = build(ours)
    mine.load_state_dict(ref.state_dict())            # the same starting point
    torch._dynamo.reset()
    a = train_step(torch.compile(mine, backend="inductor"), x, y)
    b = train_step(torch.compile(ref, backend="inductor"), x, y)
    t0 = time.perf_counter()
    la, lb = a(), b()                                 # the compilations
    compile_s = time.perf_counter() - t0
    assert torch.allclose(la, lb, rtol=1e-4, atol=1e-5), (float(la), float(lb))
    return (*interleaved(a, b, reps, warmup), compile_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's); 1 is steadier on a shared machine")
    ap.add_argument("--variants", nargs="+", default=["batch"], choices=list(VARIANTS))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, inductor, one "
          f"training step (fwd, bwd, SGD), median of {args.reps} interleaved runs; "
          f"target ratio <= {TARGET}")
    print(f"{'variant':8s} {'input':18s} {'normcore ms':>12s} {'torch ms':>10s} {'ratio':>6s} "
          f"{'min':>6s} {'compile s':>10s}")
    for variant in args.variants:
        ma, mb, r, rmin, cs = measure(variant, args.reps)
        flag = "" if r <= TARGET else "  > target"
        print(f"{variant:8s} {VARIANTS[variant][3]!s:18s} {ma * 1e3:12.2f} {mb * 1e3:10.2f} "
              f"{r:6.2f} {rmin:6.2f} {cs:10.1f}{flag}", flush=True)


if __name__ == "__main__":
    main()
