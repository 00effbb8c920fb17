#!/usr/bin/python3
"""peer_nn.py: the PyTorch peer of bench/bench_nn.c.

bench_nn runs `peer_nn.py --measure mlp|cnn` itself and prints the bench lines with both figures, so
that apex and PyTorch are measured in the same invocation. Called by bench/run (with the build dir
as argument) it has nothing more to print.

--measure NAME prints one number: training steps of the same model as bench_nn (batch 128, f32,
cross-entropy, AdamW with foreach, PyTorch's default initialisation), best-of timing, in samples/s,
on OMP_NUM_THREADS threads (default 2).
"""
import os
import sys
import time


def model(name, nn):
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)), (784,)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)), (1, 28, 28)


def measure(name):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    torch.manual_seed(0)
    net, shape = model(name, nn)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2)
    x = torch.randn(128, *shape)
    y = torch.arange(128) * 7 % 10

    def step():
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    best, start, reps = 1e300, time.perf_counter(), 0
    while reps < (10 if name == "mlp" else 5) or time.perf_counter() - start < 2.0:
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    print("%.3f" % (128 / best))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--measure":
        measure(sys.argv[2])
